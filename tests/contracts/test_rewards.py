"""The reward arithmetic of `WorkLedger.claimReward`, on a real chain.

Property: once an epoch settles, each worker is paid ``budget × units // totalUnits`` for its
range of each data node's certificate tree, where ``totalUnits`` are the certified units of the
epoch's certificates that were not voided and ``budget = min(rewardPerEpoch, funds available)``
as the epoch's first certificate fixed it. So equal units earn equal pay whatever the order of
the claims and whatever was voided before settlement; the last claim returns the rounding dust
and paid + returned equals the budget to the wei; a slashed worker's share goes back to the
run's pool; an epoch left with no certificate returns its budget; each range is paid once,
never before settlement and never after the epoch closed (all claimed, or the claim period
over, when what is unclaimed returns to the pool); and a dishonest tree whose ranges overlap
cannot pay out more than its own epoch's budget, so every other epoch's and run's money stays
where it is.

The budget here (``BUDGET``) is odd and the units do not divide it, so every claim rounds down
and the dust is never zero.

``test_units_a_tree_does_not_hold_are_provable`` fails against the current contracts on
purpose: a certificate can claim units its tree does not hold (a gap in the leaf indices) and
no fraud proof catches it, so it dilutes the other data nodes' workers; see its docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import permutations
from typing import Any

import pytest
from eth_utils.crypto import keccak
from web3.logs import DISCARD

from contracts import fraud_proofs
from contracts.bindings import ContractRevert
from contracts.certificate_tree import CertificateTree, SignedReceipt
from contracts.encoding import CertifiedHop, CertRef, sign_receipt
from tests.contracts.world import ETH, UNITS_PER_HOP, NodeKey, World, reverts

BUDGET = 10**18 + 7  # rewardPerEpochWei of the runs here: odd, so no share divides it
FUNDING = 10 * ETH
SLASHED = 4  # NodeRegistry.NodeStatus.Slashed
CLAIM_PERIOD_S = 90 * 24 * 3600  # WorkLedger.CLAIM_PERIOD_S
# 1 forward (UNITS_PER_HOP) + 1 backward (2 × UNITS_PER_HOP) per relay and microbatch.
PER_MICROBATCH = 3 * UNITS_PER_HOP


@dataclass(frozen=True)
class Crew:
    """A run paying ``BUDGET`` per epoch with two data nodes of the sponsor and three relays."""

    w: World
    run: int
    data: NodeKey
    data2: NodeKey
    a: NodeKey  # wallet 0
    b: NodeKey  # wallet 1
    c: NodeKey  # wallet 2

    def wallet_of(self, key: NodeKey) -> str:
        return {self.a: self.w.wallet(0), self.b: self.w.wallet(1), self.c: self.w.wallet(2)}[key]


@pytest.fixture
def crew(world: World) -> Crew:
    w = world

    def build() -> tuple[int, NodeKey, NodeKey, NodeKey, NodeKey, NodeKey]:
        data = w.register("rewards data", w.sponsor)
        data2 = w.register("rewards data2", w.sponsor)
        a = w.register("rewards a", w.wallet(0))
        b = w.register("rewards b", w.wallet(1))
        c = w.register("rewards c", w.wallet(2))
        run = w.open_run(FUNDING, rewardPerEpochWei=BUDGET)
        w.add_data_node(run, data)
        w.add_data_node(run, data2)
        for key, i in ((a, 0), (b, 1), (c, 2)):
            w.join(run, key, w.wallet(i))
        return run, data, data2, a, b, c

    return Crew(w, *w.scenario("rewards crew", build))


# ------------------------------------------------------------------ helpers


def hops(
    crew: Crew, data: NodeKey, routes: Sequence[tuple[Sequence[NodeKey], int]], epoch: int = 0
) -> list[SignedReceipt]:
    """Every hop of the microbatches ``(relays, microbatch)`` of ``data`` in ``epoch``."""
    out: list[SignedReceipt] = []
    for relays, microbatch in routes:
        out += crew.w.pipeline_hops(crew.run, epoch, data, relays, [microbatch])
    return out


def available(w: World, run: int) -> int:
    return int(w.call(w.ledger.functions.getRun(run))[5])


def book(w: World, run: int, epoch: int) -> tuple[int, int, bool, int, int, bool]:
    """(budgetWei, totalUnits, budgetFixed, paidUnits, paidWei, closed)."""
    return tuple(w.call(w.ledger.functions.epochBook(run, epoch)))  # type: ignore[return-value]


def returned(w: World, receipt: Any) -> int | None:
    """What the EpochClosed event of ``receipt`` returned to the pool (None: no event)."""
    events = w.ledger.events.EpochClosed().process_receipt(receipt, errors=DISCARD)
    assert len(events) <= 1
    return int(events[0]["args"]["returnedWei"]) if events else None


def gas_of(receipt: Any) -> int:
    return int(receipt["gasUsed"] * receipt["effectiveGasPrice"])


def claimed(w: World, cert: CertRef, tree: CertificateTree, key: NodeKey, wallet: str) -> int:
    """Claims ``key``'s range; asserts the wallet received exactly what the event says and
    returns it."""
    before = w.balance(wallet)
    receipt = w.claim(cert, tree, key, wallet)
    (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
    args = event["args"]
    span = tree.worker_range(key.address)
    assert span is not None
    assert (args["node"], args["dataNode"], args["wallet"]) == (key.address, cert.dataNode, wallet)
    assert args["units"] == span.units
    assert w.balance(wallet) - before + gas_of(receipt) == args["amountWei"]
    return int(args["amountWei"])


def share(budget: int, units: int, total: int) -> int:
    return budget * units // total


def lying_totals(crew: Crew, tree: CertificateTree, epoch: int = 0) -> CertRef:
    """Submits ``tree`` for data2 claiming one hop's worth of units more than its leaves sum to
    (a certificate ``proveBadTotals`` voids)."""
    w = crew.w
    w.to_submission(crew.run, epoch)
    cert = replace(
        tree.cert_ref(crew.run, epoch, crew.data2.address), units=tree.units + UNITS_PER_HOP
    )
    w.submit(cert)
    return cert


def void_by_bad_totals(w: World, cert: CertRef, tree: CertificateTree) -> None:
    proof = fraud_proofs.bad_totals(cert, tree.leaf_proof(tree.count - 1))
    receipt = w.prove(proof)
    (event,) = w.ledger.events.CertificateVoided().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["dataNode"] == cert.dataNode and event["args"]["units"] == cert.units


def leaf(index: int, units_before: int, worker: NodeKey, units: int) -> CertifiedHop:
    """A hand-made certificate leaf, for dishonest trees."""
    seed = f"{index} {units_before} {worker.address} {units}"
    return CertifiedHop(
        index, units_before, worker.address, units, keccak(text=f"key {seed}"),
        keccak(text=f"digest {seed}"), keccak(text=f"sigs {seed}"),
    )  # fmt: skip


# ------------------------------------------------------------------ pro rata


def test_each_claim_pays_the_budget_times_its_units_over_the_certified_total(crew: Crew) -> None:
    w, run = crew.w, crew.run
    # a: 2 microbatches, b: 3, c: 1 -> 600 + 900 + 300 = 1,800 units.
    entries = hops(
        crew, crew.data, [([crew.a, crew.b], 0), ([crew.a, crew.b], 1), ([crew.c, crew.b], 2)]
    )
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, run, 0, crew.data)
    assert book(w, run, 0) == (BUDGET, 1_800, True, 0, 0, False)
    assert available(w, run) == FUNDING - BUDGET
    w.to_settled(run, 0)
    units = {crew.a: 600, crew.b: 900, crew.c: 300}
    paid = 0
    for key in (crew.b, crew.c):
        amount = claimed(w, cert, tree, key, crew.wallet_of(key))
        assert amount == share(BUDGET, units[key], 1_800)
        paid += amount
        assert available(w, run) == FUNDING - BUDGET  # nothing returns before the last claim
    receipt = w.claim(cert, tree, crew.a, w.wallet(0))
    paid += share(BUDGET, 600, 1_800)
    dust = BUDGET - paid
    assert dust == 2  # floor(B/2) + floor(B/6) + floor(B/3) = B - 2
    assert returned(w, receipt) == dust  # the last claim closes the epoch
    assert available(w, run) == FUNDING - BUDGET + dust
    assert book(w, run, 0) == (BUDGET, 1_800, True, 1_800, paid, True)
    # The ledger holds exactly what the pool still has: paid + returned = budget.
    assert w.balance(w.ledger.address) == FUNDING - BUDGET + dust


def equal_units_setup(crew: Crew, other: str) -> tuple[CertificateTree, CertRef, Any]:
    """a, b and c with 600 units each in data's tree; ``other`` says what data2 did in the
    same epoch: nothing, a certificate that was voided before settlement, or a valid one."""
    w, run = crew.w, crew.run

    def build() -> tuple[CertificateTree, CertRef, Any]:
        routes = [([crew.a, crew.b], 0), ([crew.b, crew.c], 1), ([crew.c, crew.a], 2)]
        tree = w.certificate_tree(hops(crew, crew.data, routes))
        cert = w.certify(tree, run, 0, crew.data)
        extra: Any = None
        if other != "none":
            other_tree = w.certificate_tree(hops(crew, crew.data2, [([crew.a, crew.b], 0)]))
            if other == "voided":
                void_by_bad_totals(w, lying_totals(crew, other_tree), other_tree)
            else:
                extra = (other_tree, w.certify(other_tree, run, 0, crew.data2))
        w.to_settled(run, 0)
        return tree, cert, extra

    return w.scenario(f"rewards equal units {other}", build)  # type: ignore[no-any-return]


@pytest.mark.parametrize("other", ["none", "voided", "valid"])
@pytest.mark.parametrize("order", list(permutations(range(3))))
def test_equal_units_are_paid_equally_in_any_order(
    crew: Crew, other: str, order: tuple[int, ...]
) -> None:
    w, run = crew.w, crew.run
    tree, cert, extra = equal_units_setup(crew, other)
    workers = [crew.a, crew.b, crew.c]
    # A voided certificate's units leave the total: the pay is as if it had never been.
    total = 1_800 + (600 if other == "valid" else 0)
    assert book(w, run, 0)[:3] == (BUDGET, total, True)
    paid = 0
    if extra is not None:  # data2's workers claim first, so that a claim of data's is last
        other_tree, other_cert = extra
        for key in (crew.a, crew.b):
            amount = claimed(w, other_cert, other_tree, key, crew.wallet_of(key))
            assert amount == share(BUDGET, PER_MICROBATCH, total)
            paid += amount
    amounts = []
    for i in order:
        assert available(w, run) == FUNDING - BUDGET
        amounts.append(claimed(w, cert, tree, workers[i], crew.wallet_of(workers[i])))
    assert amounts == [share(BUDGET, 600, total)] * 3
    paid += sum(amounts)
    dust = BUDGET - paid
    assert dust > 0
    assert available(w, run) == FUNDING - BUDGET + dust
    assert book(w, run, 0)[3:] == (total, paid, True)


def test_a_slashed_worker_is_not_paid_and_its_share_returns_with_the_claim_period(
    crew: Crew,
) -> None:
    w, run = crew.w, crew.run
    entries = hops(
        crew, crew.data, [([crew.a, crew.b], 0), ([crew.a, crew.b], 1), ([crew.c, crew.b], 2)]
    )
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, run, 0, crew.data)
    # c signs a second, different receipt for one of its certified hops: equivocation.
    entry = next(e for e in tree.entries if e is not None and e.receipt.worker == crew.c.address)
    conflicting = replace(entry.receipt, outputDigest=keccak(text="another output"))
    signature = sign_receipt(conflicting, w.ledger_domain, crew.c.private_key)
    w.prove(
        fraud_proofs.equivocation(
            crew.c.address, entry.receipt, entry.worker_signature, conflicting, signature
        )
    )
    assert w.status_of(crew.c) == SLASHED
    w.to_settled(run, 0)
    # Nobody but a node's wallet may claim for a node that was not slashed.
    reverts(
        w, w.claim_fn(cert, tree, crew.a), w.stranger, "NotNodeWallet", crew.a.address, w.stranger
    )
    # Nobody at all for a slashed one: not its wallet, not a stranger settling it early (who
    # could take only part of its range and leave the rest unclaimable).
    for sender in (crew.wallet_of(crew.c), w.stranger):
        reverts(w, w.claim_fn(cert, tree, crew.c), sender, "ClaimantSlashed", crew.c.address)
    paid = sum(claimed(w, cert, tree, key, crew.wallet_of(key)) for key in (crew.a, crew.b))
    assert paid == share(BUDGET, 600, 1_800) + share(BUDGET, 900, 1_800)
    assert book(w, run, 0)[3:] == (1_500, paid, False)  # c's 300 units stay unclaimed
    *_, settles_at = w.epoch_times(run, 0)
    w.travel_to(settles_at + CLAIM_PERIOD_S)
    receipt = w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    # paid + returned = budget: c's share and the dust are back in the pool.
    assert returned(w, receipt) == BUDGET - paid
    assert available(w, run) == FUNDING - BUDGET + (BUDGET - paid)


def test_several_data_nodes_a_worker_claims_once_per_data_node(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree1 = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)]))
    tree2 = w.certificate_tree(
        hops(crew, crew.data2, [([crew.a, crew.c], 0), ([crew.c, crew.a], 1)])
    )
    cert1 = w.certify(tree1, run, 0, crew.data)
    cert2 = w.certify(tree2, run, 0, crew.data2)
    total = 600 + 1_200
    assert book(w, run, 0)[:3] == (BUDGET, total, True)  # one budget for the epoch, both trees
    w.to_settled(run, 0)
    paid = claimed(w, cert1, tree1, crew.a, w.wallet(0))
    assert paid == share(BUDGET, 300, total)
    assert not w.call(w.ledger.functions.isClaimed(run, 0, crew.data2.address, crew.a.address))
    amount = claimed(w, cert2, tree2, crew.a, w.wallet(0))  # the same worker, the other tree
    assert amount == share(BUDGET, 600, total)
    paid += amount
    for cert, tree in ((cert1, tree1), (cert2, tree2)):
        reverts(
            w, w.claim_fn(cert, tree, crew.a), w.wallet(0), "AlreadyClaimed", run, 0,
            cert.dataNode, crew.a.address,
        )  # fmt: skip
    paid += claimed(w, cert1, tree1, crew.b, w.wallet(1))
    assert available(w, run) == FUNDING - BUDGET  # c's range of tree2 is still unclaimed
    paid += claimed(w, cert2, tree2, crew.c, w.wallet(2))
    assert paid == 2 * share(BUDGET, 300, total) + 2 * share(BUDGET, 600, total)
    assert available(w, run) == FUNDING - BUDGET + (BUDGET - paid)


# ------------------------------------------------------------------ budgets


def budget_events(w: World, receipt: Any) -> list[int]:
    events = w.ledger.events.EpochBudgetFixed().process_receipt(receipt, errors=DISCARD)
    return [int(e["args"]["budgetWei"]) for e in events]


def test_the_budget_is_the_reward_capped_by_the_funds_when_the_first_certificate_comes(
    crew: Crew,
) -> None:
    w, a, b = crew.w, crew.a, crew.b
    run = w.open_run(BUDGET + BUDGET // 2, rewardPerEpochWei=BUDGET)
    w.add_data_node(run, crew.data)
    w.add_data_node(run, crew.data2)
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))

    def submit(epoch: int, data: NodeKey) -> tuple[CertificateTree, CertRef, list[int]]:
        tree = w.certificate_tree(w.pipeline_hops(run, epoch, data, [a, b], [0]))
        w.to_submission(run, epoch)
        cert = tree.cert_ref(run, epoch, data.address)
        return tree, cert, budget_events(w, w.submit(cert))

    _, _, fixed = submit(0, crew.data)
    assert fixed == [BUDGET] and available(w, run) == BUDGET // 2
    # Money that arrives after the first certificate does not change the epoch's budget.
    w.tx(w.ledger.functions.fundRun(run), w.sponsor, 2 * BUDGET)
    _, _, fixed = submit(0, crew.data2)
    assert fixed == [] and book(w, run, 0)[:3] == (BUDGET, 2 * 600, True)
    assert available(w, run) == BUDGET // 2 + 2 * BUDGET
    # Later epochs take rewardPerEpoch while the pool has it, then what is left, then nothing.
    expected = [BUDGET, BUDGET, BUDGET // 2, 0]
    certs = {}
    for epoch, budget in enumerate(expected, start=1):
        tree, cert, fixed = submit(epoch, crew.data)
        assert fixed == [budget] and book(w, run, epoch)[0] == budget
        certs[epoch] = (tree, cert)
    assert available(w, run) == 0
    # A zero budget pays zero, and still counts every claim.
    tree, cert = certs[4]
    w.to_settled(run, 4)
    for key, wallet in ((a, w.wallet(0)), (b, w.wallet(1))):
        assert claimed(w, cert, tree, key, wallet) == 0
    assert book(w, run, 4) == (0, 600, True, 600, 0, True)
    # The ledger holds the untouched budgets of epochs 0..3 and nothing else of this run.
    reserved = sum(book(w, run, e)[0] for e in range(4))
    assert reserved == 3 * BUDGET + BUDGET // 2
    assert w.balance(w.ledger.address) == available(w, crew.run) + reserved + available(w, run)


def test_an_epoch_whose_certificates_are_all_voided_returns_its_budget_and_can_be_refixed(
    crew: Crew,
) -> None:
    w, run = crew.w, crew.run
    bad_tree = w.certificate_tree(hops(crew, crew.data2, [([crew.a, crew.b], 0)]))
    bad = lying_totals(crew, bad_tree)
    assert book(w, run, 0)[:3] == (BUDGET, 600 + UNITS_PER_HOP, True)
    assert available(w, run) == FUNDING - BUDGET
    void_by_bad_totals(w, bad, bad_tree)
    assert book(w, run, 0) == (0, 0, False, 0, 0, False)
    assert available(w, run) == FUNDING  # the whole budget is back
    # A later certificate in the same submission window fixes a budget again.
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.b, crew.c], 0), ([crew.c, crew.b], 1)]))
    cert = tree.cert_ref(run, 0, crew.data.address)
    assert budget_events(w, w.submit(cert)) == [BUDGET]
    assert book(w, run, 0) == (BUDGET, 1_200, True, 0, 0, False)
    assert available(w, run) == FUNDING - BUDGET
    w.to_settled(run, 0)
    reverts(
        w, w.claim_fn(bad, bad_tree, crew.a), w.wallet(0), "CertificateNotOpen", run, 0,
        crew.data2.address,
    )  # fmt: skip
    paid = claimed(w, cert, tree, crew.b, w.wallet(1)) + claimed(w, cert, tree, crew.c, w.wallet(2))
    assert paid == 2 * (BUDGET // 2)
    assert available(w, run) == FUNDING - BUDGET + (BUDGET - paid)


def test_voiding_one_of_two_certificates_keeps_the_budget_for_the_other(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.b, crew.c], 0)]))
    cert = w.certify(tree, run, 0, crew.data)
    bad_tree = w.certificate_tree(hops(crew, crew.data2, [([crew.a, crew.b], 0)]))
    void_by_bad_totals(w, lying_totals(crew, bad_tree), bad_tree)
    assert book(w, run, 0) == (BUDGET, 600, True, 0, 0, False)
    assert available(w, run) == FUNDING - BUDGET
    w.to_settled(run, 0)
    paid = claimed(w, cert, tree, crew.b, w.wallet(1)) + claimed(w, cert, tree, crew.c, w.wallet(2))
    assert paid == 2 * (BUDGET // 2)
    assert available(w, run) == FUNDING - BUDGET + 1


# ------------------------------------------------------------------ refusals


def test_claims_before_the_epoch_settles_are_refused(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)]))
    cert = w.certify(tree, run, 0, crew.data)
    *_, settles_at = w.epoch_times(run, 0)
    fn = w.claim_fn(cert, tree, crew.a)
    reverts(w, fn, w.wallet(0), "NotSettled", run, 0, settles_at)
    w.travel_to(settles_at - 1)  # the last second of the challenge window
    reverts(w, fn, w.wallet(0), "NotSettled", run, 0, settles_at)
    assert w.now() + 1 == settles_at  # the next block is the first of the settled epoch
    assert claimed(w, cert, tree, crew.a, w.wallet(0)) == BUDGET // 2


def test_a_range_is_paid_once(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0), ([crew.a, crew.b], 1)]))
    cert = w.certify(tree, run, 0, crew.data)
    w.to_settled(run, 0)
    assert claimed(w, cert, tree, crew.a, w.wallet(0)) == BUDGET // 2
    args = (run, 0, crew.data.address, crew.a.address)
    reverts(w, w.claim_fn(cert, tree, crew.a), w.wallet(0), "AlreadyClaimed", *args)
    # Nor can the worker come back for a part of its range: the claim is per worker and tree.
    span = tree.worker_range(crew.a.address)
    assert span is not None and span.first.hop.index != span.last.hop.index
    first, first_proof = span.first.as_args()
    partial = w.ledger.functions.claimReward(
        cert.as_tuple(), first, first_proof, first, first_proof
    )
    reverts(w, partial, w.wallet(0), "AlreadyClaimed", *args)
    assert book(w, run, 0)[3:] == (600, BUDGET // 2, False)


# ------------------------------------------------------------------ dishonest trees


def test_an_overlapping_tree_cannot_pay_more_than_its_epochs_budget(crew: Crew) -> None:
    """data2's tree gives x units 0..200 and y units 100..300 of a certificate of 300: both
    ranges verify, but together they claim 400. x is paid 200/300 of the epoch's budget; y is
    refused; the next epoch and another run keep every wei of theirs."""
    w, run = crew.w, crew.run
    x = w.register("rewards x", w.attacker)
    y = w.register("rewards y", w.accomplice)
    other_run = w.open_run(5 * ETH, rewardPerEpochWei=BUDGET)  # the sponsor's second run
    overlap = w.dishonest_tree([leaf(0, 0, x, 200), leaf(1, 100, y, 200)])
    assert overlap.units == 300 and overlap.count == 2
    bad = w.certify(overlap, run, 0, crew.data2)
    honest = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)], epoch=1))
    cert1 = w.certify(honest, run, 1, crew.data)  # epoch 1's budget is reserved too
    assert available(w, run) == FUNDING - 2 * BUDGET
    w.to_settled(run, 0)
    before = w.balance(w.attacker)
    receipt = w.claim(bad, overlap, x, w.attacker)
    assert w.balance(w.attacker) - before + gas_of(receipt) == share(BUDGET, 200, 300)
    reverts(w, w.claim_fn(bad, overlap, y), w.accomplice, "ClaimsExceedCertificate", 400, 300)
    assert book(w, run, 0) == (BUDGET, 300, True, 200, share(BUDGET, 200, 300), False)
    # The ledger still holds every other obligation exactly: the pools, epoch 0's unpaid third
    # and epoch 1's budget.
    assert w.balance(w.ledger.address) == (
        available(w, run) + available(w, other_run) + BUDGET - share(BUDGET, 200, 300) + BUDGET
    )
    w.to_settled(run, 1)
    paid = claimed(w, cert1, honest, crew.a, w.wallet(0)) + claimed(
        w, cert1, honest, crew.b, w.wallet(1)
    )
    assert paid == 2 * (BUDGET // 2)
    w.tx(w.ledger.functions.closeRun(other_run), w.sponsor)
    w.travel_to(max(w.call(w.ledger.functions.refundableAt(other_run)), w.now() + 1))
    before = w.balance(w.sponsor)
    receipt = w.tx(w.ledger.functions.withdrawRefund(other_run), w.sponsor)
    assert w.balance(w.sponsor) - before + gas_of(receipt) == 5 * ETH


def test_a_range_of_every_unit_closes_the_epoch_for_the_overlapping_ones(crew: Crew) -> None:
    """x's range covers all 200 certified units and y's the same 200 again: x's claim pays the
    whole budget and closes the epoch, so y's claim is refused."""
    w, run = crew.w, crew.run
    x = w.register("rewards x", w.attacker)
    y = w.register("rewards y", w.accomplice)
    overlap = w.dishonest_tree([leaf(0, 0, x, 200), leaf(1, 0, y, 200)])
    bad = w.certify(overlap, run, 0, crew.data2)
    w.to_settled(run, 0)
    w.claim(bad, overlap, x, w.attacker)
    *_, settles_at = w.epoch_times(run, 0)
    reverts(
        w, w.claim_fn(bad, overlap, y), w.accomplice, "ClaimPeriodOver", run, 0,
        settles_at + CLAIM_PERIOD_S,
    )  # fmt: skip
    assert book(w, run, 0) == (BUDGET, 200, True, 200, BUDGET, True)
    assert w.balance(w.ledger.address) == available(w, run) == FUNDING - BUDGET


def test_an_overlap_in_one_tree_cannot_take_the_honest_certificates_share(crew: Crew) -> None:
    """The cap is each certificate's own units: an overlapping tree next to an honest one takes
    at most its own 200 units, so the honest workers are paid their full share of the epoch in
    whatever order everyone claims."""
    w, run = crew.w, crew.run
    x = w.register("rewards x", w.attacker)
    y = w.register("rewards y", w.accomplice)
    honest = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)]))  # 600
    cert = w.certify(honest, run, 0, crew.data)
    overlap = w.dishonest_tree([leaf(0, 0, x, 200), leaf(1, 0, y, 200)])
    bad = w.certify(overlap, run, 0, crew.data2)
    w.to_settled(run, 0)
    w.claim(bad, overlap, x, w.attacker)
    reverts(w, w.claim_fn(bad, overlap, y), w.accomplice, "ClaimsExceedCertificate", 400, 200)
    assert claimed(w, cert, honest, crew.a, w.wallet(0)) == share(BUDGET, 300, 800)
    assert claimed(w, cert, honest, crew.b, w.wallet(1)) == share(BUDGET, 300, 800)
    budget, total, _, paid_units, _, closed = book(w, run, 0)
    assert (budget, total, paid_units, closed) == (BUDGET, 800, 800, True)
    assert w.balance(w.ledger.address) == available(w, run)


def test_a_zero_unit_range_is_refused_so_the_dust_returns_once(crew: Crew) -> None:
    """A dishonest tree may hold a range of 0 units (z's leaf below). Claimed after the last
    paying claim it would add nothing to the paid units and, were it accepted, close the epoch
    a second time; it is refused (EmptyRange) and the dust returns exactly once."""
    w, run = crew.w, crew.run
    x = w.register("rewards x", w.sponsor)
    y = w.register("rewards y", w.sponsor)
    z = w.register("rewards z", w.sponsor)
    # count 3, units 600: within [count × unitsPerHop, 2 × count × unitsPerHop].
    tree = w.dishonest_tree([leaf(0, 0, x, 300), leaf(1, 300, y, 300), leaf(2, 600, z, 0)])
    cert = w.certify(tree, run, 0, crew.data2)
    w.to_settled(run, 0)
    reverts(w, w.claim_fn(cert, tree, z), w.sponsor, "EmptyRange", z.address)
    w.claim(cert, tree, x, w.sponsor)
    receipt = w.claim(cert, tree, y, w.sponsor)
    assert returned(w, receipt) == BUDGET - 2 * (BUDGET // 2) == 1
    pool = available(w, run)
    assert pool == FUNDING - BUDGET + 1
    assert w.balance(w.ledger.address) == pool
    # Once closed, the epoch takes no claim at all.
    *_, settles_at = w.epoch_times(run, 0)
    reverts(
        w, w.claim_fn(cert, tree, z), w.sponsor, "ClaimPeriodOver", run, 0,
        settles_at + CLAIM_PERIOD_S,
    )  # fmt: skip
    assert available(w, run) == pool and w.balance(w.ledger.address) == pool


# ------------------------------------------------------------------ the claim period


def test_what_is_unclaimed_returns_to_the_pool_when_the_claim_period_ends(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0), ([crew.c, crew.a], 1)]))
    cert = w.certify(tree, run, 0, crew.data)
    *_, settles_at = w.epoch_times(run, 0)
    closes_at = settles_at + CLAIM_PERIOD_S
    w.to_settled(run, 0)
    paid = claimed(w, cert, tree, crew.a, w.wallet(0))  # 600 of 1,200 units
    assert paid == BUDGET // 2
    close = w.ledger.functions.closeEpoch(run, 0)
    reverts(w, close, w.stranger, "ClaimPeriodOpen", run, 0, closes_at)
    w.travel_to(closes_at - 1)
    reverts(w, close, w.stranger, "ClaimPeriodOpen", run, 0, closes_at)
    # b and c never claimed: from closesAt anyone may return their share to the pool.
    receipt = w.tx(close, w.stranger)
    assert returned(w, receipt) == BUDGET - paid
    assert available(w, run) == FUNDING - BUDGET + (BUDGET - paid)
    assert book(w, run, 0) == (BUDGET, 1_200, True, 600, paid, True)
    assert w.balance(w.ledger.address) == available(w, run)
    reverts(w, close, w.stranger, "ClaimPeriodOver", run, 0, closes_at)
    reverts(w, w.claim_fn(cert, tree, crew.b), w.wallet(1), "ClaimPeriodOver", run, 0, closes_at)


# ------------------------------------------------------------------ index gaps


@pytest.mark.parametrize("gap", ["phantom count", "skipped indices"])
def test_units_a_tree_does_not_hold_dilute_the_epoch_and_return_to_the_pool(
    crew: Crew, gap: str
) -> None:
    """A certificate's units enter the epoch's total. Units its tree does not hold escape every
    proof (the proofs check totals at index 0 and count-1 and the chain between leaves i and
    i+1, and a leaf that was never made has no preimage):

    * "phantom count": the tree's 4 real leaves (indices 0..3), submitted with count 40 and
      units 4,000: no leaf has index 39, so nothing contradicts the totals;
    * "skipped indices": the same leaves, the last with index 39 and ending at 4,000: leaves 2
      and 39 are not adjacent, so their broken chain cannot be shown.

    This is one of the things the run's sponsor, whose data nodes these are, is trusted with
    (contracts/README.md): the phantom units dilute that epoch's workers (paid 600/4,600 of the
    budget instead of 600/1,200) and, no claim reaching them, return to the sponsor's pool when
    the claim period ends. Nothing is locked, no honest node is slashed."""
    w, run = crew.w, crew.run
    honest = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)]))
    honest_cert = w.certify(honest, run, 0, crew.data)
    real = w.certificate_tree(hops(crew, crew.data2, [([crew.a, crew.b], 0)]))  # 4 valid hops
    leaves = list(real.hops)
    if gap == "skipped indices":
        leaves[-1] = replace(leaves[-1], index=39, unitsBefore=4_000 - leaves[-1].units)
        tree = w.dishonest_tree(leaves)
    else:
        tree = real
    cert = replace(tree.cert_ref(run, 0, crew.data2.address), count=40, units=4_000)
    w.submit(cert)
    assert book(w, run, 0)[1] == 600 + 4_000
    entries = list(real.entries)
    for i in range(tree.count):
        leaf_proof = tree.leaf_proof(i)
        entry = entries[i]
        assert entry is not None
        candidates = [fraud_proofs.bad_totals(cert, leaf_proof)]
        candidates.append(fraud_proofs.invalid_hop(cert, leaf_proof, entry))
        candidates += [
            fraud_proofs.bad_sequence(cert, leaf_proof, tree.leaf_proof(j))
            for j in range(tree.count)
        ]
        for proof in candidates:
            salt = w.commit(proof, w.challenger)
            with pytest.raises(ContractRevert):
                w.tx(w.reveal_fn(proof, salt), w.challenger)
    w.to_settled(run, 0)
    pay = claimed(w, honest_cert, honest, crew.a, w.wallet(0))
    assert pay == share(BUDGET, 300, 4_600)  # diluted, as every worker of the epoch is
    *_, settles_at = w.epoch_times(run, 0)
    w.travel_to(settles_at + CLAIM_PERIOD_S)
    receipt = w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    assert returned(w, receipt) == BUDGET - pay
    assert w.balance(w.ledger.address) == available(w, run), "nothing stays locked"
    for key in (crew.data, crew.a, crew.b):
        assert w.status_of(key) == 1
