"""A node's earnings per epoch: what its database holds beside what the chain says.

Pure: the caller reads the database (units worked, claim records) and the chain (epoch windows,
books, reward events, its time) and ``earnings_of`` puts them together with the contract's own
formula (``contracts.rewards``). The API's ``/v1/earnings`` and ``gwtf-node earnings`` both show
this, so the two never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from api.schemas import Amount, ClaimView, EpochEarnings
from contracts.rewards import reward_wei
from node.chain.epochs import EpochBook, EpochTimes, RewardPaid

#: Claim states after which nothing more will be paid for that (epoch, data node).
FINAL = frozenset({"confirmed", "failed", "uncertified", "not certified"})
#: Reverts that mean the work was challenged: the claimant slashed, the certificate voided.
CHALLENGED = ("ClaimantSlashed", "CertificateNotOpen")


@dataclass(frozen=True)
class ClaimRecord:
    """A claim as the node's database holds it (``node.store.models.RewardClaim``)."""

    epoch: int
    data_node: str
    units: int
    status: str
    amount_wei: int
    tx_hash: bytes | None
    error: str | None


@dataclass(frozen=True)
class ChainView:
    """What the chain said of the run's epochs at ``now`` (its latest block's time)."""

    now: int
    times: Mapping[int, EpochTimes]
    books: Mapping[int, EpochBook]
    paid: Sequence[RewardPaid]


def phase_of(times: EpochTimes, book: EpochBook | None, now: int) -> str:
    if now < times.ends_at:
        return "working"
    if now < times.submit_closes_at:
        return "certifying"
    if now < times.settles_at:
        return "disputable"
    return "closed" if book is not None and book.closed else "settled"


def earnings_of(
    run_id: int,
    worked: Mapping[int, int],
    worked_with: Mapping[int, set[str]],
    claims: Sequence[ClaimRecord],
    chain: ChainView,
) -> list[EpochEarnings]:
    """One ``EpochEarnings`` per epoch the node worked in or claimed, oldest first.
    ``worked[epoch]`` is the units of its countersigned receipts, ``worked_with[epoch]`` the
    data nodes it signed receipts for."""
    by_epoch: dict[int, list[ClaimRecord]] = defaultdict(list)
    for claim in claims:
        by_epoch[claim.epoch].append(claim)
    paid: dict[int, int] = defaultdict(int)
    for event in chain.paid:
        paid[event.epoch] += event.amount_wei
    epochs = sorted(set(worked) | set(by_epoch) | set(paid))
    return [
        _epoch(run_id, e, worked.get(e, 0), worked_with.get(e, set()), by_epoch[e], chain, paid)
        for e in epochs
        if e in chain.times
    ]


def _epoch(
    run_id: int,
    epoch: int,
    units_worked: int,
    data_nodes: set[str],
    claims: list[ClaimRecord],
    chain: ChainView,
    paid: Mapping[int, int],
) -> EpochEarnings:
    book = chain.books.get(epoch)
    phase = phase_of(chain.times[epoch], book, chain.now)
    certified = [c for c in claims if c.status in ("pending", "confirmed")]
    units_certified = sum(c.units for c in certified) if certified else None
    challenged = sum(c.units for c in claims if c.error and c.error.startswith(CHALLENGED))
    claimed_wei = sum(c.amount_wei for c in claims if c.status == "confirmed")
    expected_wei = None
    if book is not None and book.budget_fixed and book.total_units > 0:
        units = units_certified if units_certified is not None else units_worked
        expected_wei = reward_wei(book.budget_wei, units, book.total_units)
    open_claims = data_nodes - {c.data_node for c in claims if c.status in FINAL}
    settling = phase in ("working", "certifying", "disputable")
    pending = (expected_wei or 0) if settling else 0
    claimable = 0
    if phase == "settled" and open_claims and expected_wei is not None:
        claimable = max(0, expected_wei - claimed_wei)
    return EpochEarnings(
        run_id=run_id,
        epoch=epoch,
        phase=phase,  # type: ignore[arg-type]
        units_worked=units_worked,
        units_certified=units_certified,
        units_challenged=challenged,
        expected=None if expected_wei is None else Amount.of(expected_wei),
        pending=Amount.of(pending),
        claimable=Amount.of(claimable),
        claimed=Amount.of(claimed_wei),
        chain_claimed=Amount.of(paid.get(epoch, 0)),
        chain_budget=Amount.of(book.budget_wei) if book is not None and book.budget_fixed else None,
        chain_total_units=book.total_units if book is not None else None,
        claims=[claim_view(c) for c in sorted(claims, key=lambda c: c.data_node)],
    )


def claim_view(claim: ClaimRecord) -> ClaimView:
    return ClaimView(
        data_node=claim.data_node,
        units=claim.units,
        status=claim.status,
        amount=Amount.of(claim.amount_wei),
        tx_hash=None if claim.tx_hash is None else "0x" + claim.tx_hash.hex(),
        error=claim.error,
    )
