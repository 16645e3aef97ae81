"""The pay arithmetic of `WorkLedger`, on a real chain.

Property: a run declares a price per certified hop (``PRICE`` for a forward of
``UNITS_PER_HOP`` units, twice that for a backward). A certificate is accepted only if the
run's funds and the epoch's cap cover every hop at that price, and reserves that pay at once.
Once the epoch settles, each worker is paid ``units × PRICE / UNITS_PER_HOP`` for its range of
each data node's tree, whatever else was certified, voided or claimed and in whatever order;
each range is paid once, never before settlement and never after the epoch closed. A
reservation is paid or burned, never refunded: a voided certificate's at once, what is left
unclaimed (a convicted worker's pay included) when the claim period ends. A dishonest tree
whose ranges overlap cannot pay out more than its own certificate reserved, so every other
certificate's, epoch's and run's money stays where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import permutations
from typing import Any

import pytest
from eth_utils.crypto import keccak
from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.certificate_tree import CertificateTree, SignedReceipt, claim_reward_args
from gwtf.contracts.encoding import CertifiedHop, CertRef, WorkerSpan, sign_receipt
from gwtf.contracts.rewards import pay_wei
from tests.contracts.world import ETH, UNITS_PER_HOP, NodeKey, World, reverts

PRICE = 10**15 + 7  # hopPriceWei of the runs here: odd, so a wrong division would show
CAP = 100 * PRICE  # rewardPerEpochWei: what one epoch may reserve
FUNDING = 10 * ETH
CLAIM_PERIOD_S = 90 * 24 * 3600  # WorkLedger.CLAIM_PERIOD_S
# 1 forward (UNITS_PER_HOP) + 1 backward (2 × UNITS_PER_HOP) per relay and microbatch.
PER_MICROBATCH = 3 * UNITS_PER_HOP


@dataclass(frozen=True)
class Crew:
    """A run at ``PRICE`` per hop with two data nodes of the sponsor and three relays."""

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
        run = w.open_run(FUNDING, rewardPerEpochWei=CAP, hopPriceWei=PRICE)
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
    """(budgetWei: reserved, totalUnits, certified, paidUnits, paidWei, closed)."""
    return tuple(w.call(w.ledger.functions.epochBook(run, epoch)))  # type: ignore[return-value]


def closed_burning(w: World, receipt: Any) -> int | None:
    """What the EpochClosed event of ``receipt`` burned (None: no event)."""
    events = w.ledger.events.EpochClosed().process_receipt(receipt, errors=DISCARD)
    assert len(events) <= 1
    return int(events[0]["args"]["burnedWei"]) if events else None


def burned(w: World) -> int:
    return int(w.call(w.ledger.functions.burnedWei()))


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


def pay(units: int) -> int:
    """What ``units`` earn in the runs here (the mirror, checked against ``payOf``)."""
    return pay_wei(units, PRICE, UNITS_PER_HOP)


def lying_totals(crew: Crew, tree: CertificateTree, epoch: int = 0) -> CertRef:
    """Submits ``tree`` for data2 claiming one hop's worth of units more than its leaves sum to
    (a certificate ``proveBadTotals`` voids)."""
    w = crew.w
    w.to_submission(crew.run, epoch)
    cert = w.cert_of(tree, crew.run, epoch, crew.data2.address, units=tree.units + UNITS_PER_HOP)
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


# ------------------------------------------------------------------ the price


def test_each_claim_pays_its_units_at_the_runs_price(crew: Crew) -> None:
    w, run = crew.w, crew.run
    # a: 2 microbatches, b: 3, c: 1 -> 600 + 900 + 300 = 1,800 units.
    entries = hops(
        crew, crew.data, [([crew.a, crew.b], 0), ([crew.a, crew.b], 1), ([crew.c, crew.b], 2)]
    )
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, run, 0, crew.data)
    assert book(w, run, 0) == (pay(1_800), 1_800, True, 0, 0, False)
    assert available(w, run) == FUNDING - pay(1_800)
    assert w.call(w.ledger.functions.payOf(run, 1_800)) == pay(1_800) == 18 * PRICE
    w.to_settled(run, 0)
    units = {crew.a: 600, crew.b: 900, crew.c: 300}
    for key in (crew.b, crew.c):
        assert claimed(w, cert, tree, key, crew.wallet_of(key)) == pay(units[key])
    receipt = w.claim(cert, tree, crew.a, w.wallet(0))
    assert closed_burning(w, receipt) == 0  # the last claim closes the epoch: nothing left
    assert book(w, run, 0) == (pay(1_800), 1_800, True, 1_800, pay(1_800), True)
    assert w.balance(w.ledger.address) == available(w, run) == FUNDING - pay(1_800)


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
    total = 1_800 + (600 if other == "valid" else 0)
    assert book(w, run, 0)[:3] == (pay(total), total, True)
    if extra is not None:
        other_tree, other_cert = extra
        for key in (crew.a, crew.b):
            assert claimed(w, other_cert, other_tree, key, crew.wallet_of(key)) == pay(
                PER_MICROBATCH
            )
    amounts = [claimed(w, cert, tree, workers[i], crew.wallet_of(workers[i])) for i in order]
    assert amounts == [pay(600)] * 3
    assert book(w, run, 0)[3:] == (total, pay(total), True)


def test_a_convicted_worker_is_not_paid_in_its_epoch_and_its_pay_is_burned(crew: Crew) -> None:
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
    assert w.call(w.ledger.functions.isConvictedIn(run, 0, crew.c.address))
    assert not w.call(w.ledger.functions.isConvictedIn(run, 1, crew.c.address))
    w.to_settled(run, 0)
    reverts(
        w, w.claim_fn(cert, tree, crew.a), w.stranger, "NotNodeWallet", crew.a.address, w.stranger
    )
    # Nobody at all for the convicted one: not its wallet, not a stranger.
    for sender in (crew.wallet_of(crew.c), w.stranger):
        reverts(
            w, w.claim_fn(cert, tree, crew.c), sender, "ClaimantConvicted", run, 0, crew.c.address
        )
    paid = sum(claimed(w, cert, tree, key, crew.wallet_of(key)) for key in (crew.a, crew.b))
    assert paid == pay(600) + pay(900)
    assert book(w, run, 0)[3:] == (1_500, paid, False)  # c's 300 units stay unclaimed
    *_, settles_at = w.epoch_times(run, 0)
    w.travel_to(settles_at + CLAIM_PERIOD_S)
    before = burned(w)
    receipt = w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    # c's pay is burned, not returned to the pool.
    assert closed_burning(w, receipt) == pay(300) == burned(w) - before
    assert available(w, run) == FUNDING - pay(1_800)


def test_several_data_nodes_a_worker_claims_once_per_data_node(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree1 = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)]))
    tree2 = w.certificate_tree(
        hops(crew, crew.data2, [([crew.a, crew.c], 0), ([crew.c, crew.a], 1)])
    )
    cert1 = w.certify(tree1, run, 0, crew.data)
    cert2 = w.certify(tree2, run, 0, crew.data2)
    total = 600 + 1_200
    assert book(w, run, 0)[:3] == (pay(total), total, True)  # both trees' reservations
    w.to_settled(run, 0)
    assert claimed(w, cert1, tree1, crew.a, w.wallet(0)) == pay(300)
    assert not w.call(w.ledger.functions.isClaimed(run, 0, crew.data2.address, crew.a.address))
    assert claimed(w, cert2, tree2, crew.a, w.wallet(0)) == pay(600)
    for cert, tree in ((cert1, tree1), (cert2, tree2)):
        reverts(
            w, w.claim_fn(cert, tree, crew.a), w.wallet(0), "AlreadyClaimed", run, 0,
            cert.dataNode, crew.a.address,
        )  # fmt: skip
    claimed(w, cert1, tree1, crew.b, w.wallet(1))
    claimed(w, cert2, tree2, crew.c, w.wallet(2))
    assert book(w, run, 0)[3:] == (total, pay(total), True)


# ------------------------------------------------------------------ reservations


def test_a_certificate_reserves_its_pay_within_the_funds_and_the_epochs_cap(crew: Crew) -> None:
    w, a, b = crew.w, crew.a, crew.b
    # Funds for 8 forward hops' price; each tree here is 1 microbatch through a and b: 6.
    run = w.open_run(8 * PRICE, rewardPerEpochWei=CAP, hopPriceWei=PRICE)
    w.add_data_node(run, crew.data)
    w.add_data_node(run, crew.data2)
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))

    def submit_fn(epoch: int, data: NodeKey) -> tuple[CertificateTree, CertRef, Any]:
        tree = w.certificate_tree(w.pipeline_hops(run, epoch, data, [a, b], [0]))
        w.to_submission(run, epoch)
        cert = tree.cert_ref(run, epoch, data.address)
        return tree, cert, w.submit_fn(cert)

    tree, cert, fn = submit_fn(0, crew.data)
    receipt = w.tx(fn, w.sponsor)
    (event,) = w.ledger.events.PayReserved().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["reservedWei"] == 6 * PRICE and available(w, run) == 2 * PRICE
    _, _, fn = submit_fn(0, crew.data2)
    reverts(w, fn, w.sponsor, "BudgetShort", run, 0, 6 * PRICE, 2 * PRICE)
    # Funding arrives within the submission period: the certificate is accepted.
    w.tx(w.ledger.functions.fundRun(run), w.sponsor, 4 * PRICE)
    w.tx(fn, w.sponsor)
    assert book(w, run, 0)[:3] == (12 * PRICE, 1_200, True) and available(w, run) == 0
    w.to_settled(run, 0)
    assert claimed(w, cert, tree, a, w.wallet(0)) == 3 * PRICE
    # The ledger holds this run's reservations and every other run's funds, nothing more.
    assert w.balance(w.ledger.address) == available(w, crew.run) + 9 * PRICE


def test_a_voided_certificates_reservation_is_burned_and_others_stand(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.b, crew.c], 0)]))
    cert = w.certify(tree, run, 0, crew.data)
    bad_tree = w.certificate_tree(hops(crew, crew.data2, [([crew.a, crew.b], 0)]))
    bad = lying_totals(crew, bad_tree)
    assert book(w, run, 0)[:3] == (pay(600) + pay(700), 1_300, True)
    void_by_bad_totals(w, bad, bad_tree)
    assert book(w, run, 0) == (pay(600), 600, True, 0, 0, False)
    assert burned(w) == pay(700)
    assert available(w, run) == FUNDING - pay(600) - pay(700)  # not back in the pool
    w.to_settled(run, 0)
    reverts(
        w, w.claim_fn(bad, bad_tree, crew.a), w.wallet(0), "CertificateNotOpen", run, 0,
        crew.data2.address,
    )  # fmt: skip
    paid = claimed(w, cert, tree, crew.b, w.wallet(1)) + claimed(w, cert, tree, crew.c, w.wallet(2))
    assert paid == 2 * pay(PER_MICROBATCH)
    assert w.balance(w.ledger.address) == available(w, run) + burned(w)


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
    assert claimed(w, cert, tree, crew.a, w.wallet(0)) == pay(PER_MICROBATCH)


def test_a_range_is_paid_once(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0), ([crew.a, crew.b], 1)]))
    cert = w.certify(tree, run, 0, crew.data)
    w.to_settled(run, 0)
    assert claimed(w, cert, tree, crew.a, w.wallet(0)) == pay(600)
    args = (run, 0, crew.data.address, crew.a.address)
    reverts(w, w.claim_fn(cert, tree, crew.a), w.wallet(0), "AlreadyClaimed", *args)
    # Nor can the worker come back for a part of its range: the claim is per worker and tree.
    span = tree.worker_range(crew.a.address)
    assert span is not None and span.first.hop.index != span.last.hop.index
    partial = w.ledger.functions.claimReward(
        *claim_reward_args(cert, span.first, span.first, span.range_proof)
    )
    index = span.first.hop.index
    reverts(w, partial, w.wallet(0), "NotWorkersRange", crew.a.address, index, index)
    assert book(w, run, 0)[3:] == (600, pay(600), False)


# ------------------------------------------------------------------ dishonest trees


def test_an_overlapping_tree_pays_each_worker_its_span_and_no_more(crew: Crew) -> None:
    """data2's tree gives x units 0..200 and y units 100..300 of a certificate of 300, and its
    spans give x 0..200 and y 200..300. x is paid its span; y's leaf bounds no span and is
    refused; the next epoch and another run keep every wei of theirs."""
    w, run = crew.w, crew.run
    first, second = w.register("rewards x", w.attacker), w.register("rewards y", w.accomplice)
    wallet_of = {first.address: w.attacker, second.address: w.accomplice}
    x, y = sorted((first, second), key=lambda k: int(k.address, 16))  # spans go by worker
    other_run = w.open_run(5 * ETH, hopPriceWei=PRICE)  # the sponsor's second run
    overlap = w.dishonest_tree(
        [leaf(0, 0, x, 200), leaf(1, 100, y, 200)],
        [WorkerSpan(x.address, 0, 200), WorkerSpan(y.address, 1, 300)],
    )
    assert overlap.units == 300 and overlap.count == 2
    bad = w.certify(overlap, run, 0, crew.data2)
    honest = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)], epoch=1))
    cert1 = w.certify(honest, run, 1, crew.data)
    assert available(w, run) == FUNDING - pay(300) - pay(600)
    w.to_settled(run, 0)
    before = w.balance(wallet_of[x.address])
    receipt = w.claim(bad, overlap, x, wallet_of[x.address])
    assert w.balance(wallet_of[x.address]) - before + gas_of(receipt) == pay(200)
    reverts(
        w, w.claim_fn(bad, overlap, y), wallet_of[y.address], "NotWorkersRange", y.address, 1, 1
    )
    assert book(w, run, 0) == (pay(300), 300, True, 200, pay(200), False)
    assert w.balance(w.ledger.address) == (
        available(w, run) + available(w, other_run) + pay(100) + pay(600)
    )
    w.to_settled(run, 1)
    paid = claimed(w, cert1, honest, crew.a, w.wallet(0)) + claimed(
        w, cert1, honest, crew.b, w.wallet(1)
    )
    assert paid == pay(600)
    w.tx(w.ledger.functions.closeRun(other_run), w.sponsor)
    w.travel_to(max(w.call(w.ledger.functions.refundableAt(other_run)), w.now() + 1))
    before = w.balance(w.sponsor)
    receipt = w.tx(w.ledger.functions.withdrawRefund(other_run), w.sponsor)
    assert w.balance(w.sponsor) - before + gas_of(receipt) == 5 * ETH


def test_an_overlap_in_one_tree_cannot_take_the_honest_certificates_pay(crew: Crew) -> None:
    """An overlapping tree next to an honest one: its claims are held to its own spans, so the
    honest workers are paid in full in whatever order."""
    w, run = crew.w, crew.run
    x = w.register("rewards x", w.attacker)
    y = w.register("rewards y", w.accomplice)
    honest = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0)]))  # 600
    cert = w.certify(honest, run, 0, crew.data)
    overlap = w.dishonest_tree([leaf(0, 0, x, 200), leaf(1, 0, y, 200)])
    bad = w.certify(overlap, run, 0, crew.data2)
    w.to_settled(run, 0)
    # Its 200 units cannot be split into spans of both (the leaves say 400): it is submitted as
    # one span of x's over both leaves, which neither worker's leaves bound.
    for key, wallet in ((x, w.attacker), (y, w.accomplice)):
        span = overlap.worker_range(key.address)
        assert span is not None
        reverts(
            w, w.claim_fn(bad, overlap, key), wallet, "NotWorkersRange", key.address,
            span.first.hop.index, span.last.hop.index,
        )  # fmt: skip
    assert claimed(w, cert, honest, crew.a, w.wallet(0)) == pay(300)
    assert claimed(w, cert, honest, crew.b, w.wallet(1)) == pay(300)
    assert book(w, run, 0) == (pay(800), 800, True, 600, pay(600), False)


def test_a_span_of_zero_units_is_refused(crew: Crew) -> None:
    """A dishonest tree may hold a leaf of 0 units (z's below), but no span may have 0 units:
    the spans its leaves give are refused (BadSpans), so every span a claim is held to pays."""
    w, run = crew.w, crew.run
    x, y, z = sorted(
        (w.register(f"rewards {n}", w.sponsor) for n in "xyz"), key=lambda k: int(k.address, 16)
    )
    # count 3, units 600: within [count × unitsPerHop, 2 × count × unitsPerHop].
    tree = w.dishonest_tree([leaf(0, 0, x, 300), leaf(1, 300, y, 300), leaf(2, 600, z, 0)])
    spans = [WorkerSpan(x.address, 0, 300), WorkerSpan(y.address, 1, 600)]
    spans.append(WorkerSpan(z.address, 2, 600))
    w.to_submission(run, 0)
    cert = tree.cert_ref(run, 0, crew.data2.address)
    reverts(w, w.submit_fn(cert, spans=spans), w.sponsor, "BadSpans", 2)


# ------------------------------------------------------------------ the claim period


def test_what_is_unclaimed_is_burned_when_the_claim_period_ends(crew: Crew) -> None:
    w, run = crew.w, crew.run
    tree = w.certificate_tree(hops(crew, crew.data, [([crew.a, crew.b], 0), ([crew.c, crew.a], 1)]))
    cert = w.certify(tree, run, 0, crew.data)
    *_, settles_at = w.epoch_times(run, 0)
    closes_at = settles_at + CLAIM_PERIOD_S
    w.to_settled(run, 0)
    paid = claimed(w, cert, tree, crew.a, w.wallet(0))  # 600 of 1,200 units
    assert paid == pay(600)
    close = w.ledger.functions.closeEpoch(run, 0)
    reverts(w, close, w.stranger, "ClaimPeriodOpen", run, 0, closes_at)
    w.travel_to(closes_at - 1)
    reverts(w, close, w.stranger, "ClaimPeriodOpen", run, 0, closes_at)
    # b and c never claimed: from closesAt anyone may close the epoch, burning their pay.
    receipt = w.tx(close, w.stranger)
    assert closed_burning(w, receipt) == pay(600) == burned(w)
    assert available(w, run) == FUNDING - pay(1_200)
    assert book(w, run, 0) == (pay(1_200), 1_200, True, 600, paid, True)
    assert w.balance(w.ledger.address) == available(w, run) + burned(w)
    reverts(w, close, w.stranger, "ClaimPeriodOver", run, 0, closes_at)
    reverts(w, w.claim_fn(cert, tree, crew.b), w.wallet(1), "ClaimPeriodOver", run, 0, closes_at)


# ------------------------------------------------------------------ index gaps


@pytest.mark.parametrize("gap", ["phantom count", "skipped indices"])
def test_units_a_tree_does_not_hold_change_no_pay_and_cost_their_sponsor(
    crew: Crew, gap: str
) -> None:
    """Units a certificate's tree does not hold escape every proof (the proofs check totals at
    index 0 and count-1 and the chain between leaves i and i+1, and a leaf that was never made
    has no preimage):

    * "phantom count": the tree's 4 real leaves (indices 0..3), submitted with count 40 and
      units 4,000: no leaf has index 39, so nothing contradicts the totals;
    * "skipped indices": the same leaves, the last with index 39 and ending at 4,000: leaves 2
      and 39 are not adjacent, so their broken chain cannot be shown.

    They change no worker's pay (each hop earns the run's price) and reserve the sponsor's own
    funds, burned when the claim period ends. No honest node is slashed."""
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
    cert = w.cert_of(tree, run, 0, crew.data2.address, count=40, units=4_000)
    w.submit(cert)
    assert book(w, run, 0)[:2] == (pay(600 + 4_000), 600 + 4_000)
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
    assert claimed(w, honest_cert, honest, crew.a, w.wallet(0)) == pay(300)  # not diluted
    *_, settles_at = w.epoch_times(run, 0)
    w.travel_to(settles_at + CLAIM_PERIOD_S)
    receipt = w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    assert closed_burning(w, receipt) == pay(4_600) - pay(300)
    assert w.balance(w.ledger.address) == available(w, run) + burned(w), "nothing locked"
    for key in (crew.data, crew.a, crew.b):
        assert w.status_of(key) == 1
