"""Attacks on what an honest hop earns, written as "the attack fails", each with the wei at
stake. A run declares a price per certified hop; a certificate reserves every one of its hops
at that price when it is accepted (or is refused), each certified hop earns exactly the price,
a reservation is paid to workers or burned but never returned to the sponsor, and a conviction
touches only the (run, epoch) it proves. The numbering follows the table of attack classes in
gwtf/contracts/README.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from eth_utils.crypto import keccak
from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.certificate_tree import CertificateTree
from gwtf.contracts.encoding import CertifiedHop, CertRef
from gwtf.contracts.rewards import pay_wei
from tests.contracts.conftest import Staffed
from tests.contracts.world import (
    ETH,
    HOP_PRICE,
    REWARD_PER_EPOCH,
    UNITS_PER_HOP,
    NodeKey,
    World,
    reverts,
)

CLAIM_PERIOD_S = 90 * 24 * 3600  # WorkLedger.CLAIM_PERIOD_S
# Two microbatches through a relay: 2 forwards and 2 backwards, 6 hops' price.
TWO_MICROBATCHES = 6 * HOP_PRICE


def paid(w: World, cert: CertRef, tree: CertificateTree, key: NodeKey, wallet: str) -> int:
    """Claims ``key``'s range and returns what its wallet received (the event, checked)."""
    before = w.balance(wallet)
    receipt = w.claim(cert, tree, key, wallet)
    (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert w.balance(wallet) - before + gas == event["args"]["amountWei"]
    return int(event["args"]["amountWei"])


def reserved(w: World, run: int, epoch: int) -> int:
    return int(w.call(w.ledger.functions.epochBook(run, epoch))[0])


def burned(w: World) -> int:
    return int(w.call(w.ledger.functions.burnedWei()))


def refund(w: World, run: int) -> int:
    """Closes the run, waits for its refund and returns what the sponsor received."""
    w.tx(w.ledger.functions.closeRun(run), w.sponsor)
    w.travel_to(max(w.call(w.ledger.functions.refundableAt(run)), w.now() + 1))
    before = w.balance(w.sponsor)
    receipt = w.tx(w.ledger.functions.withdrawRefund(run), w.sponsor)
    return w.balance(w.sponsor) - before + receipt["gasUsed"] * receipt["effectiveGasPrice"]


def conflicting(
    w: World, run: int, epoch: int, data: NodeKey, signer: NodeKey, other: NodeKey
) -> Any:
    """Two receipts of one hop that ``signer`` signed as worker: the proof that slashes it."""
    first = w.receipt(run, epoch, data, signer, other, 99)
    return w.equivocation(signer, first, replace(first, outputDigest=keccak(text="second output")))


# ------------------------------------------------------------ 16. padding and own relays


def test_16_padding_and_the_sponsors_own_relays_change_no_honest_hops_pay(
    staffed: Staffed,
) -> None:
    """The sponsor pads a second data node's certificate to the most the epoch may reserve and
    puts its own relay in the honest data node's tree. Under pro-rata pay this took most of
    the honest relays' share; at a price per hop, a keeps exactly its 2 microbatches' price
    (0.06 ETH at stake) and the padding only spends the sponsor's own escrow."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    padder = w.register("padder", w.sponsor)
    w.add_data_node(run, padder)
    own = w.register("sponsor relay", w.sponsor)
    w.join(run, own, w.sponsor)
    honest = w.certificate_tree(
        w.pipeline_hops(run, 0, data, [a, b], range(2))
        + w.pipeline_hops(run, 0, data, [own, b], range(2, 12))
    )
    cert = w.certify(honest, run, 0, data)
    room = REWARD_PER_EPOCH - reserved(w, run, 0)
    # Padded to the last hop the epoch's cap covers: backwards only, 2 hops' price each.
    count = room // (2 * HOP_PRICE)
    leaf = CertifiedHop(
        0, 0, own.address, 2 * UNITS_PER_HOP, keccak(text="key"), keccak(text="digest"),
        keccak(text="sigs"),
    )  # fmt: skip
    pad = w.dishonest_tree([leaf])
    padded = w.cert_of(pad, run, 0, padder.address, count=count, units=count * 2 * UNITS_PER_HOP)
    w.submit(padded)
    assert reserved(w, run, 0) == REWARD_PER_EPOCH - room % (2 * HOP_PRICE)
    w.to_settled(run, 0)
    assert paid(w, cert, honest, a, w.wallet(0)) == TWO_MICROBATCHES
    # b's 12 microbatches: 12 forwards and 12 backwards, whoever else is in the tree.
    assert paid(w, cert, honest, b, w.wallet(1)) == 36 * HOP_PRICE
    assert pay_wei(6 * UNITS_PER_HOP, HOP_PRICE, UNITS_PER_HOP) == TWO_MICROBATCHES


def test_17_a_certificate_the_escrow_cannot_cover_is_refused(staffed: Staffed) -> None:
    """A certificate that promises more pay than the run's funds (or the epoch's cap) hold
    is refused, so no accepted hop goes unpaid: a run funded with 0.1 ETH accepts 10 forward
    hops' worth and refuses the 11th."""
    s = staffed
    w, data, a, b = s.w, s.data, s.a, s.b
    run = w.open_run(10 * HOP_PRICE)
    w.add_data_node(run, data)
    second = w.register("second data", w.sponsor)
    w.add_data_node(run, second)
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))
    tree = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(1)))  # 6 hops' price
    w.to_submission(run, 0)
    cert = tree.cert_ref(run, 0, data.address)
    w.submit(cert)
    other = w.certificate_tree(w.pipeline_hops(run, 0, second, [a, b], range(1)))
    other_cert = other.cert_ref(run, 0, second.address)
    reverts(
        w, w.submit_fn(other_cert), w.sponsor, "BudgetShort", run, 0, 6 * HOP_PRICE, 4 * HOP_PRICE
    )
    assert int(w.call(w.ledger.functions.getRun(run))[5]) == 4 * HOP_PRICE
    w.to_settled(run, 0)
    assert paid(w, cert, tree, a, w.wallet(0)) == 3 * HOP_PRICE
    assert paid(w, cert, tree, b, w.wallet(1)) == 3 * HOP_PRICE
    # The epoch's cap binds too: a run whose epochs reserve at most 5 hops' price.
    capped = w.open_run(ETH, rewardPerEpochWei=5 * HOP_PRICE)
    w.add_data_node(capped, data)
    w.join(capped, a, w.wallet(0))
    w.join(capped, b, w.wallet(1))
    tree = w.certificate_tree(w.pipeline_hops(capped, 0, data, [a, b], range(1)))
    w.to_submission(capped, 0)
    cert = tree.cert_ref(capped, 0, data.address)
    reverts(w, w.submit_fn(cert), w.sponsor, "BudgetShort", capped, 0, 6 * HOP_PRICE, 5 * HOP_PRICE)


# ------------------------------------------------------------ 18. one conviction, one epoch


def test_18_convicting_a_data_node_voids_only_the_certificate_proven_wrong(
    staffed: Staffed,
) -> None:
    """The data node's epoch-1 certificate is fraudulent and it is convicted during epoch 2.
    The honest relays' epochs 0 and 2 (done while it was bonded) stay certified and paid:
    0.12 ETH at stake for a and b. The fraudulent certificate's reservation is burned, so the
    sponsor, who loses the data node's stake, wins none of it back."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    first = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(2)))
    first_cert = w.certify(first, run, 0, data)
    # Epoch 1: leaf 0 has units before it, which proveBadTotals shows.
    bad = w.dishonest_tree([
        CertifiedHop(0, 100, a.address, 100, keccak(text="k"), keccak(text="d"), keccak(text="s")),
    ])  # fmt: skip
    bad_cert = w.certify(bad, run, 1, data)
    voided = reserved(w, run, 1)
    assert voided == 2 * HOP_PRICE
    w.prove(fraud_proofs.bad_totals(bad_cert, bad.leaf_proof(0)))
    assert w.stake_of(data) == 0 and reserved(w, run, 1) == 0 and burned(w) == voided
    third = w.certificate_tree(w.pipeline_hops(run, 2, data, [a, b], range(2)))
    third_cert = w.certify(third, run, 2, data)  # epoch 2 began before the conviction
    w.to_submission(run, 3)
    fn = w.submit_fn(w.cert_of(third, run, 3, data.address, count=1, units=100))
    reverts(w, fn, w.sponsor, "NodeNotBonded", data.address)  # slashed before epoch 3 began
    w.to_settled(run, 2)
    for cert, tree in ((first_cert, first), (third_cert, third)):
        assert paid(w, cert, tree, a, w.wallet(0)) == TWO_MICROBATCHES
        assert paid(w, cert, tree, b, w.wallet(1)) == TWO_MICROBATCHES
    assert refund(w, run) == 10 * ETH - 2 * 2 * TWO_MICROBATCHES - voided


# ------------------------------------------------------------ 19. a conviction elsewhere


def test_19_a_conviction_refuses_pay_only_in_its_own_run_and_epoch(staffed: Staffed) -> None:
    """Relay a works in two runs and is convicted of equivocating in run 1's epoch 1. Its work
    that no proof touches (run 1's epoch 0, run 2's epoch 0: 0.12 ETH) is still paid; its pay
    in the convicted epoch (0.06 ETH) goes to nobody: it is burned when the epoch closes, not
    returned to the sponsor, so a conviction pays the sponsor nothing."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    other_data = w.register("other data", w.sponsor)
    other = w.open_run()
    w.add_data_node(other, other_data)
    w.join(other, a, w.wallet(0))
    w.join(other, b, w.wallet(1))
    trees = {
        (run, 0): w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(2))),
        (other, 0): w.certificate_tree(w.pipeline_hops(other, 0, other_data, [a, b], range(2))),
        (run, 1): w.certificate_tree(w.pipeline_hops(run, 1, data, [a, b], range(2))),
    }
    certs = {
        (run, 0): w.certify(trees[run, 0], run, 0, data),
        (other, 0): w.certify(trees[other, 0], other, 0, other_data),
    }
    w.prove(conflicting(w, run, 1, data, a, b))
    assert w.stake_of(a) == 0
    assert w.call(w.ledger.functions.isConvictedIn(run, 1, a.address))
    certs[run, 1] = w.certify(trees[run, 1], run, 1, data)
    w.to_settled(run, 1)
    w.to_settled(other, 0)
    for key in ((run, 0), (other, 0)):
        assert paid(w, certs[key], trees[key], a, w.wallet(0)) == TWO_MICROBATCHES
    reverts(
        w, w.claim_fn(certs[run, 1], trees[run, 1], a), w.wallet(0), "ClaimantConvicted",
        run, 1, a.address,
    )  # fmt: skip
    assert paid(w, certs[run, 1], trees[run, 1], b, w.wallet(1)) == TWO_MICROBATCHES
    settles_at = w.epoch_times(run, 1)[3]
    w.travel_to(settles_at + CLAIM_PERIOD_S)
    before = burned(w)
    receipt = w.tx(w.ledger.functions.closeEpoch(run, 1), w.stranger)
    (event,) = w.ledger.events.EpochClosed().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["burnedWei"] == TWO_MICROBATCHES == burned(w) - before
    spent = sum(reserved(w, run, e) for e in (0, 1))
    assert refund(w, run) == 10 * ETH - spent  # a's refused pay is not among it


def test_20_a_withheld_tree_wins_the_sponsor_nothing_back(staffed: Staffed) -> None:
    """The sponsor certifies the epoch and withholds the tree, so nobody can claim. What the
    certificate reserved (0.12 ETH of honest pay) is burned when the claim period ends, not
    refunded: withholding costs the sponsor what honest pay would have."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    tree = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(2)))
    w.certify(tree, run, 0, data)
    held = reserved(w, run, 0)
    assert held == 2 * TWO_MICROBATCHES
    w.travel_to(w.epoch_times(run, 0)[3] + CLAIM_PERIOD_S)
    w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    assert burned(w) == held
    assert refund(w, run) == 10 * ETH - held


def test_23_a_late_overlapping_tree_cannot_use_up_the_honest_ranges(staffed: Staffed) -> None:
    """The sponsor's data node certifies a and b (two microbatches each) and its colluder x (one
    hop), but the tree behind its root gives x's leaf units 0 to the certificate's total, over
    a's and b's ranges; it withholds the tree until the epoch settles, when no proof can land.
    The spans committed with the root partition the units, so x, claiming first, cannot take
    a's or b's: a and b are paid in full, and the sponsor gets nothing back through x."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    x = w.register("colluder x", w.accomplice)
    w.join(run, x, w.accomplice)
    entries = w.pipeline_hops(run, 0, data, [a, b], range(2))
    entries.append(w.signed(w.receipt(run, 0, data, x, data, 100), x, data))
    honest = w.certificate_tree(entries)
    assert honest.spans is not None and len(honest.spans) == 3
    total = honest.units
    overlapping = [
        replace(hop, unitsBefore=0, units=total) if hop.worker == x.address else hop
        for hop in honest.hops
    ]
    # The spans must partition what it certifies (BadSpans otherwise): the honest ones.
    tree = w.dishonest_tree(overlapping, honest.spans)
    cert = tree.cert_ref(run, 0, data.address)
    assert (cert.count, cert.units) == (honest.count, total)
    w.to_submission(run, 0)
    w.submit(cert, spans=honest.spans)
    assert reserved(w, run, 0) == 2 * TWO_MICROBATCHES + HOP_PRICE
    # The spans are on chain from the submission: each relay can check its own before the
    # epoch settles, whatever the tree behind the root says.
    stored = w.call(w.ledger.functions.certificateCommitment(run, 0, data.address))
    assert tree.ranges is not None and cert.rangesRoot == tree.ranges.root
    assert stored == cert.commitment()
    w.to_settled(run, 0)  # the tree is published only now: no proof can land
    grab = tree.worker_range(x.address)
    assert grab is not None and grab.units == total  # x's leaf covers every unit
    reverts(
        w, w.ledger.functions.claimReward(*grab.claim_args(cert)), w.accomplice,
        "NotWorkersRange", x.address, grab.first.hop.index, grab.last.hop.index,
    )  # fmt: skip
    assert paid(w, cert, tree, a, w.wallet(0)) == TWO_MICROBATCHES
    assert paid(w, cert, tree, b, w.wallet(1)) == TWO_MICROBATCHES
    # x's leaf matches no span, so its one hop is unpaid too; its reservation is burned.
    w.travel_to(w.epoch_times(run, 0)[3] + CLAIM_PERIOD_S)
    w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    assert burned(w) == HOP_PRICE
    assert refund(w, run) == 10 * ETH - 2 * TWO_MICROBATCHES - HOP_PRICE
