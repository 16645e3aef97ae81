"""A node's earnings per epoch: what its database holds beside what the chain says.

Pure: the caller reads the database (units worked, claim records) and the chain (epoch windows,
books, reward events, its time) and ``earnings_of`` puts them together with the contract's own
formula (``gwtf.contracts.rewards``). The API's ``/v1/earnings`` and ``gwtf-node earnings`` both
show this, so the two never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gwtf.api.schemas import Amount, ClaimView, EpochEarnings
from gwtf.contracts.rewards import reward_wei
from gwtf.node.chain.epochs import EpochBook, EpochTimes, RewardPaid

#: Claim states after which nothing more will be paid for that (epoch, data node).
FINAL = frozenset({"confirmed", "failed", "uncertified", "not certified"})
#: Phases of an epoch not settled yet.
SETTLING = ("working", "certifying", "disputable")
#: Why work was missed (``missed_certificates``), said of a data node.
MISSED = {
    "no certificate": "no certificate from data node {} before submissions closed",
    "left out": "data node {}'s certificate leaves out this node's hops",
}
#: Reverts that mean the work was challenged: the claimant convicted in the epoch, the
#: certificate voided.
CHALLENGED = ("ClaimantConvicted", "CertificateNotOpen")


@dataclass(frozen=True)
class ClaimRecord:
    """A claim as the node's database holds it (``gwtf.node.store.models.RewardClaim``)."""

    epoch: int
    data_node: str
    units: int
    status: str
    amount_wei: int
    tx_hash: bytes | None
    error: str | None


@dataclass(frozen=True)
class ChainView:
    """What the chain said of the run's epochs at ``now`` (its latest block's time).
    ``certified_by`` holds, for each epoch whose submissions have closed, the data nodes (lower
    case) that submitted a certificate of it: no other will."""

    now: int
    times: Mapping[int, EpochTimes]
    books: Mapping[int, EpochBook]
    paid: Sequence[RewardPaid]
    certified_by: Mapping[int, frozenset[str]] = field(default_factory=dict)


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
    worked: Mapping[int, Mapping[str, int]],
    claims: Sequence[ClaimRecord],
    chain: ChainView,
) -> list[EpochEarnings]:
    """One ``EpochEarnings`` per epoch the node worked in or claimed, oldest first.
    ``worked[epoch][data_node]`` is the units of its countersigned receipts for that data node's
    microbatches (0 for a data node it signed receipts for that were never countersigned)."""
    by_epoch: dict[int, list[ClaimRecord]] = defaultdict(list)
    for claim in claims:
        by_epoch[claim.epoch].append(claim)
    paid: dict[int, int] = defaultdict(int)
    for event in chain.paid:
        paid[event.epoch] += event.amount_wei
    epochs = sorted(set(worked) | set(by_epoch) | set(paid))
    return [
        _epoch(run_id, e, worked.get(e, {}), by_epoch[e], chain, paid)
        for e in epochs
        if e in chain.times
    ]


def _epoch(
    run_id: int,
    epoch: int,
    worked: Mapping[str, int],
    claims: list[ClaimRecord],
    chain: ChainView,
    paid: Mapping[int, int],
) -> EpochEarnings:
    book = chain.books.get(epoch)
    phase = phase_of(chain.times[epoch], book, chain.now)
    if phase in SETTLING and any(c.status == "confirmed" for c in claims):
        # The contract pays only settled epochs: a claim confirmed since the chain was last
        # read says more of the epoch than that read's clock does.
        phase = "settled"
    # Addresses compared whatever their case (receipts hold them checksummed).
    names = {d.lower(): d for d in [*worked, *(c.data_node for c in claims)]}
    worked = {data_node.lower(): units for data_node, units in worked.items()}
    by_data_node = {c.data_node.lower(): c for c in claims}
    missed = missed_certificates(worked, by_data_node, chain.certified_by.get(epoch))
    units_missed = sum(worked[data_node] for data_node in missed)
    if units_missed and units_missed == sum(worked.values()):
        phase = "missed"
    certified = [c for c in claims if c.status in ("pending", "confirmed")]
    challenged = sum(c.units for c in claims if _challenged(c))
    claimed_wei = sum(c.amount_wei for c in claims if c.status == "confirmed")
    expected_wei = claimable = None
    if book is not None and book.certified and book.total_units > 0:
        # The contract pays each (epoch, data node) range on its own, rounded down, so the
        # expectation is the sum of those shares: a data node's certified units once a claim
        # has read them, the node's own countersigned units before.
        shares = {
            data_node: reward_wei(book.budget_wei, units, book.total_units)
            for data_node in set(worked) | set(by_data_node)
            if data_node not in missed
            and (units := _expected_units(worked.get(data_node, 0), by_data_node.get(data_node)))
        }
        expected_wei = sum(shares.values())
        open_shares = [
            share
            for data_node, share in shares.items()
            if (c := by_data_node.get(data_node)) is None or c.status not in FINAL
        ]
        claimable = sum(open_shares) if phase == "settled" else 0
    if phase == "missed":
        expected_wei = 0  # known now: nothing will be paid for the epoch's work
    settling = phase in SETTLING
    return EpochEarnings(
        run_id=run_id,
        epoch=epoch,
        phase=phase,  # type: ignore[arg-type]
        units_worked=sum(worked.values()),
        units_certified=sum(c.units for c in certified) if certified else None,
        units_challenged=challenged,
        units_missed=units_missed,
        missed="; ".join(MISSED[missed[d]].format(names[d]) for d in sorted(missed)) or None,
        expected=None if expected_wei is None else Amount.of(expected_wei),
        pending=Amount.of((expected_wei or 0) if settling else 0),
        claimable=Amount.of(claimable or 0),
        claimed=Amount.of(claimed_wei),
        chain_claimed=Amount.of(paid.get(epoch, 0)),
        chain_budget=Amount.of(book.budget_wei) if book is not None and book.certified else None,
        chain_total_units=book.total_units if book is not None else None,
        claims=[claim_view(c) for c in sorted(claims, key=lambda c: c.data_node)],
    )


def missed_certificates(
    worked: Mapping[str, int],
    claims: Mapping[str, ClaimRecord],
    certified_by: frozenset[str] | None,
) -> dict[str, str]:
    """The data nodes (lower case) whose certificate covers none of the units this node
    worked for them, each with why, a key of ``MISSED``: it submitted none before submissions
    closed (as the chain's certificates say once they closed, or the node's claim found at
    settlement), or its certificate leaves this node's hops out (the claim found no range of
    it there)."""
    missed = {}
    for data_node, units in worked.items():
        if units == 0:
            continue  # nothing countersigned: no certificate could have paid it
        claim = claims.get(data_node)
        status = claim.status if claim is not None else None
        if status == "not certified":
            missed[data_node] = "left out"
        elif status == "uncertified" or (
            status is None and certified_by is not None and data_node not in certified_by
        ):
            missed[data_node] = "no certificate"
    return missed


def _challenged(claim: ClaimRecord) -> bool:
    # A refusal is recorded as "<revert name>: <message>".
    return claim.status == "failed" and (claim.error or "").startswith(CHALLENGED)


def _expected_units(worked: int, claim: ClaimRecord | None) -> int:
    """The units one data node's range is expected to pay for."""
    if claim is None:
        return worked
    if claim.status in ("pending", "confirmed"):
        return claim.units  # what the certificate says, read when the claim was built
    # Uncertified, or refused for good (a node records "failed" only for a final revert:
    # challenged, slashed, the claim period over ...): nothing more will be paid.
    return 0


def claim_view(claim: ClaimRecord) -> ClaimView:
    return ClaimView(
        data_node=claim.data_node,
        units=claim.units,
        status=claim.status,
        amount=Amount.of(claim.amount_wei),
        tx_hash=None if claim.tx_hash is None else "0x" + claim.tx_hash.hex(),
        error=claim.error,
    )


def next_claim_at(
    epochs: Sequence[EpochEarnings], times: Mapping[int, EpochTimes], running: EpochTimes | None
) -> int | None:
    """When this node can next claim a reward, by chain time: the oldest epoch it has a reward
    claimable in, or work still to settle in, settles then (a time past: claimable now). With
    neither, the epoch ``running`` now settles then: the soonest any work done now pays."""
    due = [
        times[e.epoch].settles_at
        for e in epochs
        if int(e.claimable.wei) > 0 or (e.phase in SETTLING and e.units_worked > e.units_missed)
    ]
    if due:
        return min(due)
    return running.settles_at if running is not None else None
