"""Fraud the chain judges alone: each valid proof slashes and voids, each invalid one reverts
with its own error; index challenges; and replays across run, epoch and chain id are caught."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from web3.logs import DISCARD

from contracts.bindings import ContractRevert
from contracts.encoding import ClaimRef, ledger_domain
from contracts.epoch_tree import EpochTree, SignedReceipt
from tests.contracts.world import ETH, NodeKey, World, expect_revert

BAD_COUNTERSIGNATURE, DOUBLE_CLAIM, OFF_SCHEDULE, WRONG_WORKER = 0, 1, 2, 3
UNBACKED_TOTAL, BROKEN_CHAIN, UNREVEALED = 4, 5, 6


def submitted(
    w: World, run: int, key: NodeKey, wallet: str, tree: EpochTree, **kw: Any
) -> ClaimRef:
    w.to_submission(run, 0)
    claim = tree.claim(run, 0, key.address)
    if kw:
        claim = replace(claim, **kw)
    w.submit(claim, wallet)
    return claim


def assert_convicted(w: World, receipt: Any, claim: ClaimRef, fraud: int, stake: int) -> None:
    (event,) = w.ledger.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["node"] == claim.node and event["args"]["fraud"] == fraud
    assert event["args"]["slashedWei"] == stake and event["args"]["bountyWei"] == stake // 2
    assert w.ledger.functions.claimCommitment(claim.runId, claim.epoch, claim.node).call() == (
        b"\x00" * 31 + b"\x01"
    )
    node = w.registry.functions.getNode(claim.node).call()
    assert node[1] == 0 and node[2] == 4  # stake gone, status Slashed


def with_entry(tree: EpochTree, index: int, entry: SignedReceipt) -> list[SignedReceipt]:
    entries = list(tree.entries)
    entries[index] = entry
    return entries


# ----------------------------------------------------------------- (a) countersignatures


def test_forged_countersignature_is_slashed_and_bounty_is_paid(pair: Any) -> None:
    w, run, a, b = pair
    forger = w.key("forger")  # never joined the run
    honest = w.honest_tree(run, 0, a, b, count=3)
    forged = w.countersign(honest.entries[1].receipt, forger)
    tree = w.tree_of(with_entry(honest, 1, forged))
    claim = submitted(w, run, a, w.wallet(0), tree)
    pool_before = w.ledger.functions.getRun(run).call()[5]
    receipt = w.tx(
        w.ledger.functions.proveBadCountersignature(
            claim.as_tuple(), tree.leaf_proof(1).as_tuple()
        ),
        w.challenger,
    )
    assert_convicted(w, receipt, claim, BAD_COUNTERSIGNATURE, 2 * ETH)
    assert w.ledger.functions.getRun(run).call()[5] == pool_before + ETH + 3 * ETH  # half + budget
    assert w.ledger.functions.epochBook(run, 0).call() == (0, 0, True)
    assert w.ledger.functions.creditWei(w.challenger).call() == ETH
    before = w.balance(w.challenger)
    tx = w.tx(w.ledger.functions.withdrawCredit(), w.challenger)
    assert w.balance(w.challenger) == before + ETH - tx["gasUsed"] * tx["effectiveGasPrice"]
    assert w.registry.functions.totalStakedWei().call() == w.balance(w.registry.address) == 4 * ETH


@pytest.mark.parametrize(
    "kind", ["worker_signs_itself", "garbage_bytes", "signer_not_counterparty"]
)
def test_other_bad_countersignatures(pair: Any, kind: str) -> None:
    w, run, a, b = pair
    honest = w.honest_tree(run, 0, a, b, count=2)
    receipt0 = honest.entries[0].receipt
    if kind == "worker_signs_itself":
        entry = w.countersign(replace(receipt0, counterparty=a.address), a)
    elif kind == "garbage_bytes":
        entry = SignedReceipt(receipt0, b"\x01" * 65)
    else:
        w.join(run, w.register("c", w.wallet(2)), w.wallet(2))
        entry = w.countersign(receipt0, w.key("c"))  # a member, but not the named counterparty
    tree = w.tree_of(with_entry(honest, 0, entry))
    claim = submitted(w, run, a, w.wallet(0), tree)
    receipt = w.tx(
        w.ledger.functions.proveBadCountersignature(
            claim.as_tuple(), tree.leaf_proof(0).as_tuple()
        ),
        w.challenger,
    )
    assert_convicted(w, receipt, claim, BAD_COUNTERSIGNATURE, 2 * ETH)


def test_valid_countersignature_is_not_fraud(pair: Any) -> None:
    w, run, a, b = pair
    tree = w.honest_tree(run, 0, a, b, count=2)
    claim = submitted(w, run, a, w.wallet(0), tree)
    fn = w.ledger.functions.proveBadCountersignature(
        claim.as_tuple(), tree.leaf_proof(0).as_tuple()
    )
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(fn, w.challenger)
    expect_revert(excinfo, "CountersignatureValid", b.address)


# ----------------------------------------------------------------- (b) double claims


def test_double_claim_in_one_tree(pair: Any) -> None:
    w, run, a, b = pair
    honest = w.honest_tree(run, 0, a, b, count=3)
    dup = w.countersign(replace(honest.entries[0].receipt, iteration=99), b)  # same hop key
    tree = w.tree_of(with_entry(honest, 2, dup))
    claim = submitted(w, run, a, w.wallet(0), tree)
    fn = w.ledger.functions.proveDoubleClaim(
        claim.as_tuple(),
        tree.leaf_proof(0).as_tuple(),
        claim.as_tuple(),
        tree.leaf_proof(2).as_tuple(),
    )
    assert_convicted(w, w.tx(fn, w.challenger), claim, DOUBLE_CLAIM, 2 * ETH)


def test_double_claim_across_two_trees_slashes_both(pair: Any) -> None:
    w, run, a, b = pair
    tree_a = w.honest_tree(run, 0, a, b, count=2)
    copy = w.countersign(
        replace(tree_a.entries[0].receipt, worker=b.address, counterparty=a.address), a
    )
    tree_b = w.tree_of([copy])
    claim_a = submitted(w, run, a, w.wallet(0), tree_a)
    claim_b = submitted(w, run, b, w.wallet(1), tree_b)
    fn = w.ledger.functions.proveDoubleClaim(
        claim_a.as_tuple(),
        tree_a.leaf_proof(0).as_tuple(),
        claim_b.as_tuple(),
        tree_b.leaf_proof(0).as_tuple(),
    )
    receipt = w.tx(fn, w.challenger)
    events = w.ledger.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert [(e["args"]["node"], e["args"]["slashedWei"]) for e in events] == [
        (a.address, 2 * ETH),
        (b.address, 4 * ETH),
    ]
    assert w.ledger.functions.creditWei(w.challenger).call() == 3 * ETH


@pytest.mark.parametrize("case", ["different_hops", "same_leaf"])
def test_invalid_double_claim_proofs(pair: Any, case: str) -> None:
    w, run, a, b = pair
    tree = w.honest_tree(run, 0, a, b, count=2)
    claim = submitted(w, run, a, w.wallet(0), tree)
    second = 1 if case == "different_hops" else 0
    fn = w.ledger.functions.proveDoubleClaim(
        claim.as_tuple(),
        tree.leaf_proof(0).as_tuple(),
        claim.as_tuple(),
        tree.leaf_proof(second).as_tuple(),
    )
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(fn, w.challenger)
    expect_revert(excinfo, "NotSameHop" if case == "different_hops" else "SameLeaf")


# ----------------------------------------------------------------- (c) schedule, (d) worker


@pytest.mark.parametrize(
    "change",
    [{"units": 150}, {"stage": 4}, {"runId": 99}, {"epoch": 1}],
    ids=lambda c: next(iter(c)),
)
def test_off_schedule_receipts(pair: Any, change: dict[str, int]) -> None:
    w, run, a, b = pair
    honest = w.honest_tree(run, 0, a, b, count=2)
    off = replace(honest.entries[0].receipt, **change)
    units = off.units + honest.entries[1].receipt.units
    tree = w.tree_of(with_entry(honest, 0, w.countersign(off, b)))
    # Inflated units stay within the submit-time sanity range (count*u .. 2*count*u).
    claim = submitted(w, run, a, w.wallet(0), tree, units=units)
    fn = w.ledger.functions.proveOffSchedule(claim.as_tuple(), tree.leaf_proof(0).as_tuple())
    assert_convicted(w, w.tx(fn, w.challenger), claim, OFF_SCHEDULE, 2 * ETH)


def test_on_schedule_receipt_is_not_fraud(pair: Any) -> None:
    w, run, a, b = pair
    tree = w.honest_tree(run, 0, a, b, count=2)
    claim = submitted(w, run, a, w.wallet(0), tree)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(
            w.ledger.functions.proveOffSchedule(claim.as_tuple(), tree.leaf_proof(1).as_tuple()),
            w.challenger,
        )
    expect_revert(excinfo, "ReceiptOnSchedule")


def test_wrong_worker(pair: Any) -> None:
    w, run, a, b = pair
    stolen = w.honest_tree(run, 0, b, a, count=1)  # b's receipt, countersigned by a
    claim = submitted(w, run, a, w.wallet(0), stolen)
    fn = w.ledger.functions.proveWrongWorker(claim.as_tuple(), stolen.leaf_proof(0).as_tuple())
    assert_convicted(w, w.tx(fn, w.challenger), claim, WRONG_WORKER, 2 * ETH)
    honest = w.honest_tree(run, 0, b, a, count=1)
    claim_b = submitted(w, run, b, w.wallet(1), honest)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(
            w.ledger.functions.proveWrongWorker(
                claim_b.as_tuple(), honest.leaf_proof(0).as_tuple()
            ),
            w.challenger,
        )
    expect_revert(excinfo, "WorkerMatches", b.address)


# ----------------------------------------------------------------- (e) count and units


@pytest.mark.parametrize("case", ["inflated_units", "first_leaf_offset", "beyond_count"])
def test_unbacked_totals(pair: Any, case: str) -> None:
    w, run, a, b = pair
    honest = w.honest_tree(run, 0, a, b, count=3)  # units 100, 200, 100 -> 400
    if case == "inflated_units":
        tree, overrides, index = honest, {"units": 500}, 2
    elif case == "first_leaf_offset":
        tree = w.tree_of(honest.entries, units_before=[100, 200, 400])
        overrides, index = {"units": 500}, 0
    else:
        tree, overrides, index = honest, {"count": 2, "units": 300}, 2
    claim = submitted(w, run, a, w.wallet(0), tree, **overrides)
    fn = w.ledger.functions.proveUnbackedTotal(claim.as_tuple(), tree.leaf_proof(index).as_tuple())
    assert_convicted(w, w.tx(fn, w.challenger), claim, UNBACKED_TOTAL, 2 * ETH)


def test_backed_total_is_not_fraud(pair: Any) -> None:
    w, run, a, b = pair
    tree = w.honest_tree(run, 0, a, b, count=3)
    claim = submitted(w, run, a, w.wallet(0), tree)
    for index in (0, 1, 2):
        fn = w.ledger.functions.proveUnbackedTotal(
            claim.as_tuple(), tree.leaf_proof(index).as_tuple()
        )
        with pytest.raises(ContractRevert) as excinfo:
            w.tx(fn, w.challenger)
        expect_revert(excinfo, "TotalBacked", index)


def test_broken_prefix_chain(pair: Any) -> None:
    w, run, a, b = pair
    honest = w.honest_tree(run, 0, a, b, count=3)
    tree = w.tree_of(honest.entries, units_before=[0, 100, 400])  # 100+200 != 400
    claim = submitted(w, run, a, w.wallet(0), tree, units=500)
    good = w.ledger.functions.proveBrokenChain(
        claim.as_tuple(), tree.leaf_proof(0).as_tuple(), tree.leaf_proof(1).as_tuple()
    )
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(good, w.challenger)
    expect_revert(excinfo, "ChainConsistent", 0)
    apart = w.ledger.functions.proveBrokenChain(
        claim.as_tuple(), tree.leaf_proof(0).as_tuple(), tree.leaf_proof(2).as_tuple()
    )
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(apart, w.challenger)
    expect_revert(excinfo, "LeavesNotAdjacent", 0, 2)
    fn = w.ledger.functions.proveBrokenChain(
        claim.as_tuple(), tree.leaf_proof(1).as_tuple(), tree.leaf_proof(2).as_tuple()
    )
    assert_convicted(w, w.tx(fn, w.challenger), claim, BROKEN_CHAIN, 2 * ETH)


# ----------------------------------------------------------------- proof plumbing


def test_proofs_need_the_real_claim_a_real_leaf_and_the_window(pair: Any) -> None:
    w, run, a, b = pair
    tree = w.honest_tree(run, 0, a, b, count=2)
    claim = submitted(w, run, a, w.wallet(0), tree)
    leaf = tree.leaf_proof(0)
    cases = [
        (replace(claim, units=claim.units + 1), leaf, "ClaimMismatch", (run, 0, a.address)),
        (replace(claim, node=b.address), leaf, "ClaimNotOpen", (run, 0, b.address)),
        (claim, replace(leaf, unitsBefore=5), "LeafNotInTree", (a.address, 0)),
        (claim, replace(leaf, proof=()), "LeafNotInTree", (a.address, 0)),
    ]
    for bad_claim, bad_leaf, name, args in cases:
        with pytest.raises(ContractRevert) as excinfo:
            w.tx(
                w.ledger.functions.proveWrongWorker(bad_claim.as_tuple(), bad_leaf.as_tuple()),
                w.challenger,
            )
        expect_revert(excinfo, name, *args)
    settles_at = w.epoch_times(run, 0)[3]
    w.to_settled(run, 0)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(w.ledger.functions.proveWrongWorker(claim.as_tuple(), leaf.as_tuple()), w.challenger)
    expect_revert(excinfo, "ChallengePeriodOver", run, 0, settles_at)


def test_a_voided_claim_cannot_be_convicted_twice_or_paid(pair: Any) -> None:
    w, run, a, b = pair
    stolen = w.honest_tree(run, 0, b, a, count=1)
    claim = submitted(w, run, a, w.wallet(0), stolen)
    fn = w.ledger.functions.proveWrongWorker(claim.as_tuple(), stolen.leaf_proof(0).as_tuple())
    w.tx(fn, w.challenger)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(fn, w.challenger)
    expect_revert(excinfo, "ClaimNotOpen", run, 0, a.address)
    w.to_settled(run, 0)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(w.ledger.functions.claimReward(claim.as_tuple()), w.wallet(0))
    expect_revert(excinfo, "ClaimNotOpen", run, 0, a.address)


# ----------------------------------------------------------------- replay


def test_receipt_replayed_into_another_epoch_is_off_schedule(pair: Any) -> None:
    w, run, a, b = pair
    tree0 = w.honest_tree(run, 0, a, b, count=2)
    submitted(w, run, a, w.wallet(0), tree0)
    w.to_submission(run, 1)
    replayed = w.tree_of(tree0.entries)  # the same signed receipts, claimed again in epoch 1
    claim1 = replace(replayed.claim(run, 1, a.address))
    w.submit(claim1, w.wallet(0))
    fn = w.ledger.functions.proveOffSchedule(claim1.as_tuple(), replayed.leaf_proof(0).as_tuple())
    assert_convicted(w, w.tx(fn, w.challenger), claim1, OFF_SCHEDULE, 2 * ETH)


def test_receipt_replayed_into_another_run_fails_its_countersignature(pair: Any) -> None:
    w, run, a, b = pair
    other_run = w.open_run()
    w.join(other_run, a, w.wallet(0))
    w.join(other_run, b, w.wallet(1))
    signed = w.honest_tree(run, 0, a, b, count=1).entries[0]
    # Rewriting the run id to fit the other run breaks b's signature.
    moved = SignedReceipt(replace(signed.receipt, runId=other_run), signed.counterparty_signature)
    tree = w.tree_of([moved])
    w.to_submission(other_run, 0)
    claim = tree.claim(other_run, 0, a.address)
    w.submit(claim, w.wallet(0))
    fn = w.ledger.functions.proveBadCountersignature(
        claim.as_tuple(), tree.leaf_proof(0).as_tuple()
    )
    assert_convicted(w, w.tx(fn, w.challenger), claim, BAD_COUNTERSIGNATURE, 2 * ETH)


def test_receipt_signed_for_another_chain_id_is_rejected(pair: Any) -> None:
    w, run, a, b = pair
    receipt0 = w.honest_tree(run, 0, a, b, count=1).entries[0].receipt
    foreign = ledger_domain(w.w3.eth.chain_id + 1, w.ledger.address)
    signed_elsewhere = w.countersign(receipt0, b, domain=foreign)
    # The contract recovers someone other than b from that signature on this chain.
    digest = w.ledger.functions.receiptDigest(receipt0.as_tuple()).call()
    assert digest != w.countersign(receipt0, b).receipt and digest
    tree = w.tree_of([signed_elsewhere])
    claim = submitted(w, run, a, w.wallet(0), tree)
    fn = w.ledger.functions.proveBadCountersignature(
        claim.as_tuple(), tree.leaf_proof(0).as_tuple()
    )
    assert_convicted(w, w.tx(fn, w.challenger), claim, BAD_COUNTERSIGNATURE, 2 * ETH)
