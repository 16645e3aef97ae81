"""Fraud the chain judges alone: each rule of a certified hop, a certificate's totals and its
sequence, and equivocation. A valid proof slashes the key that signed or committed the fraud
(the challenger's bounty is 5 %, the rest burned) and voids a fraudulent certificate; a proof
against honest data reverts with its own error; proofs need a commitment from an earlier block,
revealed within the reveal window, and close when the epoch settles."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from eth_utils.crypto import keccak
from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import CertifiedHop, CertRef, certify_hop, sign_receipt
from gwtf.contracts.fraud_proofs import Fraud
from tests.contracts.conftest import Certified, Staffed
from tests.contracts.world import ETH, UNITS_PER_HOP, NodeKey, World, proof_reverts, reverts

BOUNTY_BPS = 500
SLASHED = 4
VOIDED = b"\x00" * 31 + b"\x01"


def assert_slashed(w: World, receipt: Any, node: NodeKey, fraud: Fraud, stake: int) -> None:
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["node"] == node.address and event["args"]["fraud"] == fraud
    bounty = stake * BOUNTY_BPS // 10_000
    assert event["args"]["slashedWei"] == stake and event["args"]["bountyWei"] == bounty
    assert w.stake_of(node) == 0 and w.status_of(node) == SLASHED


def assert_voided(w: World, cert: CertRef) -> None:
    stored = w.call(w.ledger.functions.certificateCommitment(cert.runId, cert.epoch, cert.dataNode))
    assert stored == VOIDED


def certified_with(s: Staffed, entries: list[SignedReceipt]) -> tuple[Any, CertRef]:
    """The data node's honest-shaped tree of ``entries``, submitted for epoch 0."""
    tree = s.w.certificate_tree(entries)
    return tree, s.w.certify(tree, s.run, 0, s.data)


def one_hop(s: Staffed, **overrides: Any) -> SignedReceipt:
    """A forward of microbatch 0 by a (stage 1), countersigned by b, with ``overrides``."""
    w = s.w
    worker = overrides.pop("worker_key", s.a)
    counterparty = overrides.pop("counterparty_key", s.b)
    receipt = replace(w.receipt(s.run, 0, s.data, worker, counterparty, 0), **overrides)
    return w.signed(receipt, worker, counterparty)


# ----------------------------------------------------------------- invalid hops


INVALID_RECEIPTS = {
    "another run": {"runId": 99},
    "another epoch": {"epoch": 1},
    "stage 0": {"stage": 0},
    "stage past the run's": {"stage": 3},
    "units off the schedule": {"units": UNITS_PER_HOP + 1},
}


@pytest.mark.parametrize("overrides", INVALID_RECEIPTS.values(), ids=INVALID_RECEIPTS.keys())
def test_a_certified_hop_off_the_schedule_slashes_the_data_node(
    staffed: Staffed, overrides: dict[str, Any]
) -> None:
    w = staffed.w
    tree, cert = certified_with(staffed, [one_hop(staffed, **overrides)])
    proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0])
    receipt = w.prove(proof)
    assert_slashed(w, receipt, staffed.data, Fraud.INVALID_HOP, 2 * ETH)
    assert_voided(w, cert)
    # The epoch lost its only certificate: its budget is back in the pool.
    assert w.call(w.ledger.functions.epochBook(staffed.run, 0))[:3] == (0, 0, False)
    w.award(staffed.data.address)
    assert w.call(w.disputes.functions.creditWei(w.challenger)) == 2 * ETH * BOUNTY_BPS // 10_000
    assert w.call(w.disputes.functions.burnedWei()) == 2 * ETH * (10_000 - BOUNTY_BPS) // 10_000


def test_a_hop_of_another_data_node_is_fraud(staffed: Staffed) -> None:
    w = staffed.w
    other = w.key("other data node")
    tree, cert = certified_with(staffed, [one_hop(staffed, dataNode=other.address)])
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0]))
    assert_voided(w, cert)


def resigned(
    w: World, entry: SignedReceipt, worker: NodeKey | None, counterparty: NodeKey | None
) -> SignedReceipt:
    """``entry`` with its worker signature and/or countersignature made by other keys."""
    domain, receipt = w.ledger_domain, entry.receipt
    return SignedReceipt(
        receipt,
        sign_receipt(receipt, domain, worker.private_key) if worker else entry.worker_signature,
        sign_receipt(receipt, domain, counterparty.private_key)
        if counterparty
        else entry.counterparty_signature,
    )


@pytest.mark.parametrize("which", ["worker", "counterparty", "garbage"])
def test_a_signature_that_is_not_the_partys_is_fraud(staffed: Staffed, which: str) -> None:
    w, c = staffed.w, staffed.c
    hop = one_hop(staffed)
    if which == "worker":
        hop = resigned(w, hop, c, None)
    elif which == "counterparty":
        hop = resigned(w, hop, None, c)
    else:
        hop = SignedReceipt(hop.receipt, hop.worker_signature, b"\x01" * 65)
    tree, cert = certified_with(staffed, [hop])
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0]))
    assert_voided(w, cert)


def test_a_worker_countersigning_itself_is_fraud(staffed: Staffed) -> None:
    w = staffed.w
    hop = one_hop(staffed, counterparty_key=staffed.a)
    tree, cert = certified_with(staffed, [hop])
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0]))
    assert_voided(w, cert)


def test_parties_must_have_taken_part_in_the_run_during_the_epoch(staffed: Staffed) -> None:
    w = staffed.w
    outsider = w.register("outsider", w.wallet(3))  # staked, never joined the run
    for hop in (one_hop(staffed, worker_key=outsider), one_hop(staffed, counterparty_key=outsider)):
        snapshot = w.tester.take_snapshot()
        tree, cert = certified_with(staffed, [hop])
        w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0]))
        assert_voided(w, cert)
        w.tester.revert_to_snapshot(snapshot)


def test_a_counterparty_that_unbonded_before_the_epoch_is_fraud(world: World) -> None:
    """A countersigner must have been bonded during the epoch of the work: one that left and
    withdrew before it counts for nothing (a data node that certifies it pays)."""
    w = world
    data = w.register("data", w.sponsor)
    a = w.register("a", w.wallet(0))
    gone = w.register("gone", w.wallet(1))
    run = w.open_run()
    w.add_data_node(run, data)
    w.join(run, a, w.wallet(0))
    w.join(run, gone, w.wallet(1))
    w.tx(w.registry.functions.requestUnstake(gone.address), w.wallet(1))
    starts, _, _, _ = w.epoch_times(run, 1)
    w.travel_to(starts + 10)  # epoch 1: gone unbonded during epoch 0
    receipt = w.receipt(run, 1, data, a, gone, 5)
    entry = w.signed(receipt, a, gone)
    tree = w.certificate_tree([entry])
    cert = w.certify(tree, run, 1, data)
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0]))
    assert_voided(w, cert)


def test_a_leaf_that_does_not_match_its_receipt_is_fraud(staffed: Staffed) -> None:
    w = staffed.w
    hop = one_hop(staffed)
    leaf = certify_hop(
        hop.receipt, w.ledger_domain, hop.worker_signature, hop.counterparty_signature
    )
    inflated = replace(leaf, units=2 * UNITS_PER_HOP)  # the receipt says 100
    tree = w.dishonest_tree([inflated])
    cert = w.certify(tree, staffed.run, 0, staffed.data)
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), hop))
    assert_voided(w, cert)


def test_a_valid_hop_cannot_be_proven_and_a_foreign_receipt_cannot_be_judged(
    certified: Certified,
) -> None:
    w, tree, cert = certified.w, certified.tree, certified.cert
    for index in range(tree.count):
        entry = tree.entries[index]
        assert entry is not None
        proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(index), entry)
        proof_reverts(w, proof, "HopValid", index)
    other = tree.entries[1]
    assert other is not None
    mismatched = fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), other)
    proof_reverts(w, mismatched, "NotTheLeafsReceipt", 0)
    assert w.stake_of(certified.data) == 2 * ETH


# ----------------------------------------------------------------- totals and sequence


def hand_made(w: World, s: Staffed, specs: list[tuple[int, int, NodeKey, int, int]]) -> Any:
    """A tree of leaves (index, unitsBefore, worker, units, key seed) made by hand."""
    hops = [
        CertifiedHop(i, before, worker.address, units, keccak(text=f"key {seed}"),
                     keccak(text=f"digest {seed}"), keccak(text=f"sigs {seed}"))
        for i, before, worker, units, seed in specs
    ]  # fmt: skip
    return w.dishonest_tree(hops)


def test_totals_that_the_leaves_do_not_back_are_fraud(staffed: Staffed) -> None:
    w, a, b = staffed.w, staffed.a, staffed.b
    low, high = sorted((a, b), key=lambda k: int(k.address, 16))
    cases = {
        "leaf 0 with units before it": ([(0, 50, low, 100, 1), (1, 150, high, 100, 2)], 0, 250),
        "last leaf short of the total": ([(0, 0, low, 100, 1), (1, 100, high, 100, 2)], 1, 300),
    }
    for specs, index, units in cases.values():
        snapshot = w.tester.take_snapshot()
        tree = hand_made(w, staffed, specs)
        w.to_submission(staffed.run, 0)
        cert = w.cert_of(tree, staffed.run, 0, staffed.data.address, count=2, units=units)
        w.submit(cert)
        w.prove(fraud_proofs.bad_totals(cert, tree.leaf_proof(index)))
        assert_voided(w, cert)
        w.tester.revert_to_snapshot(snapshot)


def test_a_leaf_beyond_the_count_is_fraud(staffed: Staffed) -> None:
    w, a = staffed.w, staffed.a
    tree = hand_made(w, staffed, [(0, 0, a, 100, 1), (1, 100, a, 100, 2), (2, 200, a, 100, 3)])
    w.to_submission(staffed.run, 0)
    cert = w.cert_of(tree, staffed.run, 0, staffed.data.address, count=2, units=200)  # hides leaf 2
    w.submit(cert)
    w.prove(fraud_proofs.bad_totals(cert, tree.leaf_proof(2)))
    assert_voided(w, cert)


SEQUENCES = {
    "sums that do not chain": [(0, 0, "low", 100, 1), (1, 150, "high", 100, 2)],
    "workers out of order": [(0, 0, "high", 100, 1), (1, 100, "low", 100, 2)],
    "one hop twice": [(0, 0, "low", 100, 1), (1, 100, "low", 100, 1)],
    "two leaves with one index": [(0, 0, "low", 100, 1), (0, 0, "high", 100, 2)],
}


@pytest.mark.parametrize("specs", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_a_broken_sequence_is_fraud(staffed: Staffed, specs: list[Any]) -> None:
    w = staffed.w
    low, high = sorted((staffed.a, staffed.b), key=lambda k: int(k.address, 16))
    named = [
        (index, before, low if who == "low" else high, units, seed)
        for index, before, who, units, seed in specs
    ]
    tree = hand_made(w, staffed, named)
    w.to_submission(staffed.run, 0)
    cert = w.cert_of(tree, staffed.run, 0, staffed.data.address, count=2, units=200)
    w.submit(cert)
    receipt = w.prove(fraud_proofs.bad_sequence(cert, tree.leaf_proof(0), tree.leaf_proof(1)))
    assert_slashed(w, receipt, staffed.data, Fraud.BAD_SEQUENCE, 2 * ETH)
    assert_voided(w, cert)


def test_an_honest_tree_has_no_bad_totals_or_sequence(certified: Certified) -> None:
    w, tree, cert = certified.w, certified.tree, certified.cert
    for index in (0, tree.count - 1):
        proof_reverts(
            w, fraud_proofs.bad_totals(cert, tree.leaf_proof(index)), "TotalsBacked", index
        )
    for index in range(tree.count - 1):
        proof = fraud_proofs.bad_sequence(cert, tree.leaf_proof(index), tree.leaf_proof(index + 1))
        proof_reverts(w, proof, "SequenceConsistent", index, index + 1)
    same = fraud_proofs.bad_sequence(cert, tree.leaf_proof(3), tree.leaf_proof(3))
    proof_reverts(w, same, "SequenceConsistent", 3, 3)
    apart = fraud_proofs.bad_sequence(cert, tree.leaf_proof(1), tree.leaf_proof(5))
    proof_reverts(w, apart, "LeavesNotAdjacent", 1, 5)


# ----------------------------------------------------------------- equivocation


def test_a_counterparty_that_countersigns_two_receipts_of_one_hop_is_slashed(
    certified: Certified,
) -> None:
    w, tree = certified.w, certified.tree
    entry = next(e for e in tree.entries if e and e.receipt.counterparty == certified.b.address)
    other = replace(entry.receipt, outputDigest=keccak(text="another output"))
    proof = fraud_proofs.equivocation(
        certified.b.address, entry.receipt, entry.counterparty_signature, other,
        sign_receipt(other, w.ledger_domain, certified.b.private_key),
    )  # fmt: skip
    receipt = w.prove(proof)
    assert_slashed(w, receipt, certified.b, Fraud.EQUIVOCATION, 4 * ETH)
    # The worker of both receipts keeps its stake, and the certificate stands.
    assert w.stake_of(certified.a) == 2 * ETH
    stored = w.ledger.functions.certificateCommitment(certified.run, 0, certified.data.address)
    assert w.call(stored) == certified.cert.commitment()


def test_a_worker_that_signs_two_receipts_of_one_hop_is_slashed(certified: Certified) -> None:
    w, a = certified.w, certified.a
    entry = next(e for e in certified.tree.entries if e and e.receipt.worker == a.address)
    other = replace(entry.receipt, inputDigest=keccak(text="another input"))
    proof = fraud_proofs.equivocation(
        a.address, entry.receipt, entry.worker_signature, other,
        sign_receipt(other, w.ledger_domain, a.private_key),
    )  # fmt: skip
    assert_slashed(w, w.prove(proof), a, Fraud.EQUIVOCATION, 2 * ETH)
    again = fraud_proofs.equivocation(
        a.address, other, sign_receipt(other, w.ledger_domain, a.private_key), entry.receipt,
        entry.worker_signature,
    )  # fmt: skip
    proof_reverts(w, again, "AlreadySlashed", a.address)


def test_what_is_not_equivocation_reverts(certified: Certified) -> None:
    w, tree, b, c = certified.w, certified.tree, certified.b, certified.c
    first, second, *_ = (e for e in tree.entries if e and e.receipt.counterparty == b.address)
    other = replace(first.receipt, outputDigest=keccak(text="x"))
    by_b = first.counterparty_signature

    def signed_by(key: NodeKey, receipt: Any) -> bytes:
        return sign_receipt(receipt, w.ledger_domain, key.private_key)

    cases = [
        # Two hops of different microbatches: different keys.
        (first.receipt, by_b, second.receipt, second.counterparty_signature, "NotSameHop", ()),
        # The same receipt twice.
        (first.receipt, by_b, first.receipt, by_b, "SameReceipt", ()),
        # Two versions, signed by two different keys.
        (first.receipt, by_b, other, signed_by(c, other), "NotOneSigner", (b.address, c.address)),
        # c signs two versions of a hop in which it is neither worker nor counterparty.
        (first.receipt, signed_by(c, first.receipt), other, signed_by(c, other),
         "SignerNotParty", (c.address,)),
    ]  # fmt: skip
    # a's worker signature on a's hop, next to a's "countersignature" of a version naming a as
    # its own counterparty: a signed as worker once and as counterparty once, not twice in one
    # role (an honest node never countersigns a receipt naming itself as worker).
    a = certified.a
    own = next(e for e in tree.entries if e and e.receipt.worker == a.address)
    self_signed = replace(own.receipt, counterparty=a.address)
    cases.append(
        (own.receipt, own.worker_signature, self_signed, signed_by(a, self_signed),
         "SignerNotParty", (a.address,))
    )  # fmt: skip
    for one, one_signature, two, two_signature, name, args in cases:
        proof = fraud_proofs.equivocation(b.address, one, one_signature, two, two_signature)
        proof_reverts(w, proof, name, *args)
    assert w.stake_of(b) == 4 * ETH and w.stake_of(c) == 2 * ETH and w.stake_of(a) == 2 * ETH


# ----------------------------------------------------------------- commit, reveal, windows


def equivocation_of(c: Certified) -> fraud_proofs.FraudProof:
    entry = next(e for e in c.tree.entries if e and e.receipt.worker == c.a.address)
    other = replace(entry.receipt, inputDigest=keccak(text="another input"))
    return fraud_proofs.equivocation(
        c.a.address, entry.receipt, entry.worker_signature, other,
        sign_receipt(other, c.w.ledger_domain, c.a.private_key),
    )  # fmt: skip


def test_a_proof_needs_its_challengers_commitment_from_an_earlier_block(
    certified: Certified,
) -> None:
    w = certified.w
    proof = equivocation_of(certified)
    salt = b"\x07" * 32
    commitment = fraud_proofs.commitment_of(w.challenger, salt, proof.proof_hash)
    reverts(w, w.reveal_fn(proof, salt), w.challenger, "NoCommitment", commitment)
    w.tx(w.disputes.functions.commit(commitment), w.challenger)
    reverts(
        w, w.disputes.functions.commit(commitment), w.challenger, "CommitmentExists", commitment
    )
    block = w.w3.eth.block_number
    # A copier with the same calldata has no commitment of its own.
    theirs = fraud_proofs.commitment_of(w.stranger, salt, proof.proof_hash)
    reverts(w, w.reveal_fn(proof, salt), w.stranger, "NoCommitment", theirs)
    receipt = w.tx(w.reveal_fn(proof, salt), w.challenger)
    assert receipt["blockNumber"] > block
    w.award(proof.accused)
    assert w.call(w.disputes.functions.creditWei(w.challenger)) == 2 * ETH * BOUNTY_BPS // 10_000


def test_a_reveal_in_the_commitments_own_block_is_refused(certified: Certified) -> None:
    w = certified.w
    proof = equivocation_of(certified)
    salt = b"\x08" * 32
    commitment = fraud_proofs.commitment_of(w.challenger, salt, proof.proof_hash)
    w.tester.disable_auto_mine_transactions()
    try:
        w.w3.eth.send_transaction(
            {"from": w.challenger, "to": w.disputes.address, "gas": 200_000,
             "data": w.disputes.encode_abi("commit", [commitment])}
        )  # fmt: skip
        reveal = w.reveal_fn(proof, salt).build_transaction({"from": w.challenger, "gas": 900_000})
        tx_hash = w.w3.eth.send_transaction(reveal)
    finally:
        w.tester.enable_auto_mine_transactions()
    receipt = w.w3.eth.get_transaction_receipt(tx_hash)
    assert receipt["status"] == 0  # CommitmentTooRecent: committed in the reveal's own block
    assert w.stake_of(certified.a) == 2 * ETH


def test_proofs_close_when_the_epoch_settles(certified: Certified) -> None:
    w = certified.w
    proof = equivocation_of(certified)
    salt = w.commit(proof, w.challenger)
    _, _, _, settles_at = w.epoch_times(certified.run, 0)
    w.travel_to(settles_at)
    reverts(
        w, w.reveal_fn(proof, salt), w.challenger, "ChallengePeriodOver", certified.run, 0,
        settles_at,
    )  # fmt: skip


def test_a_data_node_slashed_before_still_has_its_other_fraudulent_tree_voided(
    staffed: Staffed,
) -> None:
    w, run = staffed.w, staffed.run
    tree0, cert0 = certified_with(staffed, [one_hop(staffed, units=UNITS_PER_HOP + 1)])
    hop1 = w.receipt(run, 1, staffed.data, staffed.a, staffed.b, 9, stage=0)
    tree1 = w.certificate_tree([w.signed(hop1, staffed.a, staffed.b)])
    cert1 = w.certify(tree1, run, 1, staffed.data)  # both trees are open now
    w.prove(fraud_proofs.invalid_hop(cert0, tree0.leaf_proof(0), tree0.entries[0]))
    receipt = w.prove(fraud_proofs.invalid_hop(cert1, tree1.leaf_proof(0), tree1.entries[0]))
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["slashedWei"] == 0 and event["args"]["bountyWei"] == 0
    assert_voided(w, cert0)
    assert_voided(w, cert1)
