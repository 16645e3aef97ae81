"""Receipts signed in batches: a worker signs, and its counterparty countersigns, one Merkle root
over many receipt digests; each certified receipt carries both batch signatures and its proof.
An honest batch is valid hop by hop and never convicts, whatever batches hold a receipt; a
receipt outside the batch, a forged or foreign batch signature, a batch padded with others'
receipts or read in another epoch convicts the data node that certifies it; two receipts of one
hop key in two batches convict their signer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from eth_utils.crypto import keccak

from gwtf.contracts import fraud_proofs
from gwtf.contracts.batches import batch_of, sign_batch
from gwtf.contracts.certificate_tree import SignedReceipt, check_signatures
from gwtf.contracts.encoding import (
    HopReceipt,
    receipt_digest,
    recover_digest_signer,
    sign_digest,
    signing_digest,
)
from gwtf.contracts.fraud_proofs import Fraud
from gwtf.contracts.merkle import build_tree
from gwtf.errors import ProtocolError
from gwtf.node.audit.checks import RunRules, audit_certificate, equivocations
from tests.contracts.conftest import Staffed
from tests.contracts.world import ETH, proof_reverts

SLASHED = 4


def forwards(s: Staffed, microbatches: range, epoch: int = 0) -> list[HopReceipt]:
    """Forwards of ``microbatches`` by a (stage 1) for b."""
    return [s.w.receipt(s.run, epoch, s.data, s.a, s.b, m) for m in microbatches]


def batch(s: Staffed, receipts: list[HopReceipt]) -> list[SignedReceipt]:
    return sign_batch(receipts, s.w.ledger_domain, s.a.private_key, s.b.private_key)


def test_an_honest_batch_is_valid_leaf_by_leaf_and_pays(staffed: Staffed) -> None:
    w = staffed.w
    entries = batch(staffed, forwards(staffed, range(5)))
    assert {e.worker_signature for e in entries} == {entries[0].worker_signature}
    assert sorted(len(e.proof) for e in entries) == [2, 2, 2, 3, 3]  # five leaves
    for entry in entries:
        check_signatures(entry, w.ledger_domain)
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, staffed.run, 0, staffed.data)
    rules = RunRules(2, 100, w.ledger_domain)
    served = [(e, tree.leaf_proof(i)) for i, e in enumerate(tree.entries)]
    assert audit_certificate(cert, served, rules, lambda node, or_data_node: True) == []
    for index, entry in enumerate(tree.entries):
        proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(index), entry)
        proof_reverts(w, proof, "HopValid", index)
    w.to_settled(staffed.run, 0)
    w.claim(cert, tree, staffed.a, w.wallet(0))


def test_one_receipt_in_two_honest_batches_is_no_equivocation(staffed: Staffed) -> None:
    """A node that signs a receipt again (a batch of one, then a batch of three after a
    restart) states the same thing twice."""
    w, a = staffed.w, staffed.a
    receipts = forwards(staffed, range(3))
    alone = batch(staffed, receipts[:1])[0]
    among = batch(staffed, receipts)[0]
    assert alone.proof == () and among.proof and alone.worker_signature != among.worker_signature
    proof = fraud_proofs.equivocation(
        a.address, alone.receipt, alone.worker_signature, among.receipt,
        among.worker_signature, alone.proof, among.proof,
    )  # fmt: skip
    proof_reverts(w, proof, "SameReceipt")
    assert equivocations([alone, among], w.ledger_domain) == []
    assert w.stake_of(a) == 2 * ETH


def test_a_receipt_not_in_its_batch_convicts_the_data_node_that_certifies_it(
    staffed: Staffed,
) -> None:
    w = staffed.w
    entries = batch(staffed, forwards(staffed, range(4)))
    stranger = w.receipt(staffed.run, 0, staffed.data, staffed.a, staffed.b, 9)
    # The stranger receipt with a batch member's signatures and proof: not in that batch.
    smuggled = replace(entries[1], receipt=stranger)
    with pytest.raises(ProtocolError, match="worker signature"):
        check_signatures(smuggled, w.ledger_domain)
    tree = w.certificate_tree([*entries[:1], smuggled])
    cert = w.certify(tree, staffed.run, 0, staffed.data)
    index = next(i for i, e in enumerate(tree.entries) if e.receipt == stranger)
    proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(index), tree.entries[index])
    w.prove(proof)
    assert w.status_of(staffed.data) == SLASHED


@pytest.mark.parametrize("which", ["worker", "counterparty"])
def test_a_forged_batch_signature_convicts_the_data_node(staffed: Staffed, which: str) -> None:
    w = staffed.w
    entries = batch(staffed, forwards(staffed, range(3)))
    batch_digest = batch_of([e.receipt for e in entries], w.ledger_domain)[0].digest(
        w.ledger_domain
    )
    by_c = sign_digest(batch_digest, staffed.c.private_key)
    forged = replace(entries[2], **{f"{which}_signature": by_c})
    tree = w.certificate_tree([*entries[:2], forged])
    cert = w.certify(tree, staffed.run, 0, staffed.data)
    index = next(i for i, e in enumerate(tree.entries) if e == forged)
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(index), forged))
    assert w.status_of(staffed.data) == SLASHED


def test_a_batch_padded_with_another_workers_receipt_pays_nobody_for_it(staffed: Staffed) -> None:
    """a signs, and b countersigns, a batch holding a receipt of c's: the batch names a as
    worker, so it is no signature of c's hop, and a data node certifying it is convicted."""
    w, s = staffed.w, staffed
    own = forwards(s, range(2))
    of_c = w.receipt(s.run, 0, s.data, s.c, s.b, 7)
    with pytest.raises(ProtocolError, match="cannot hold"):
        batch_of([*own, of_c], w.ledger_domain)
    # Built by hand past that check: the tree over all three digests, signed as a's batch.
    signed = batch(s, own)
    root_of_a = batch_of(own, w.ledger_domain)[0]
    tree3 = build_tree([receipt_digest(r, w.ledger_domain) for r in [*own, of_c]])
    padded = replace(root_of_a, root=tree3.root).digest(w.ledger_domain)
    padding = SignedReceipt(
        of_c,
        sign_digest(padded, s.a.private_key),
        sign_digest(padded, s.b.private_key),
        tuple(tree3.proof(2)),
    )
    tree = w.certificate_tree([*signed, padding])
    cert = w.certify(tree, s.run, 0, s.data)
    index = next(i for i, e in enumerate(tree.entries) if e.receipt == of_c)
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(index), padding))
    assert w.status_of(s.data) == SLASHED


def test_a_batch_is_not_read_in_another_epoch(staffed: Staffed) -> None:
    """The same hop moved to epoch 1 keeps epoch 0's batch signatures: they do not sign it."""
    w = staffed.w
    entries = batch(staffed, forwards(staffed, range(2)))
    moved = replace(entries[0], receipt=replace(entries[0].receipt, epoch=1))
    with pytest.raises(ProtocolError):
        check_signatures(moved, w.ledger_domain)
    tree = w.certificate_tree([moved])
    cert = w.certify(tree, staffed.run, 1, staffed.data)
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), moved))
    assert w.status_of(staffed.data) == SLASHED


@pytest.mark.parametrize("role", ["worker", "counterparty"])
def test_two_versions_of_a_hop_in_two_batches_convict_their_signer(
    staffed: Staffed, role: str
) -> None:
    w = staffed.w
    receipts = forwards(staffed, range(3))
    other = replace(receipts[1], outputDigest=keccak(text="another output"))
    first = batch(staffed, receipts)[1]
    second = batch(staffed, [receipts[0], other, receipts[2]])[1]
    signer = staffed.a if role == "worker" else staffed.b
    found = equivocations([first, second], w.ledger_domain)
    assert {f.accused for f in found} == {staffed.a.address, staffed.b.address}
    attr = f"{role}_signature"
    proof = fraud_proofs.equivocation(
        signer.address, first.receipt, getattr(first, attr), second.receipt,
        getattr(second, attr), first.proof, second.proof,
    )  # fmt: skip
    w.prove(proof)
    assert w.status_of(signer) == SLASHED
    assert found[0].proof is not None and found[0].proof.fraud == Fraud.EQUIVOCATION


def test_an_equivocation_proof_with_another_batchs_signature_reverts(staffed: Staffed) -> None:
    """The second version shown with the first's batch signature and proof: that batch does
    not hold it, so the signature recovers to some other key and a keeps its stake."""
    w, a = staffed.w, staffed.a
    receipts = forwards(staffed, range(4))
    other = replace(receipts[0], outputDigest=keccak(text="another output"))
    first = batch(staffed, receipts)[0]
    proof = fraud_proofs.equivocation(
        a.address, first.receipt, first.worker_signature, other, first.worker_signature,
        first.proof, first.proof,
    )  # fmt: skip
    nobody = recover_digest_signer(
        signing_digest(other, w.ledger_domain, first.proof), first.worker_signature
    )
    proof_reverts(w, proof, "NotOneSigner", a.address, nobody)
    assert w.stake_of(a) == 2 * ETH


def test_a_tensor_dispute_takes_the_workers_batch_signature(staffed: Staffed) -> None:
    w = staffed.w
    entries = batch(staffed, forwards(staffed, range(3)))
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, staffed.run, 0, staffed.data)
    index = next(i for i, e in enumerate(tree.entries) if e.receipt.microbatchId == 1)
    entry = tree.entries[index]
    # Another leaf's proof: the worker's signature does not recover over that batch.
    wrong = replace(entry, proof=tree.entries[(index + 1) % 3].proof)
    bad = fraud_proofs.wrong_tensor(cert, tree.leaf_proof(index), wrong)
    proof_reverts(w, bad, "NotWorkersSignature", staffed.a.address)
    w.prove(fraud_proofs.wrong_tensor(cert, tree.leaf_proof(index), entry))
    (event,) = w.disputes.events.TensorDisputeOpened().get_logs(from_block=0)
    signed = event["args"]["workerSigned"]
    assert tuple(bytes(p) for p in signed["proof"]) == entry.proof
    assert bytes(signed["signature"]) == entry.worker_signature


def test_no_batch_holds_two_receipts_of_one_hop_key(staffed: Staffed) -> None:
    """Two versions of one hop in one batch convict both its signers (one signature, two
    proofs), so an honest node's batch builder refuses them, as it refuses a receipt twice."""
    w, s = staffed.w, staffed
    receipts = forwards(s, range(3))
    other = replace(receipts[1], outputDigest=keccak(text="another output"))
    with pytest.raises(ProtocolError, match="one receipt per hop key"):
        batch_of([*receipts, other], w.ledger_domain)
    with pytest.raises(ProtocolError, match="one receipt per hop key"):
        batch_of([receipts[0], receipts[0]], w.ledger_domain)
    # Why: the same batch signed over both versions is an equivocation the contract convicts.
    tree = build_tree([receipt_digest(r, w.ledger_domain) for r in [*receipts, other]])
    root = replace(batch_of(receipts, w.ledger_domain)[0], root=tree.root)
    by_b = sign_digest(root.digest(w.ledger_domain), s.b.private_key)
    proof = fraud_proofs.equivocation(
        s.b.address, receipts[1], by_b, other, by_b, tuple(tree.proof(1)), tuple(tree.proof(3)),
    )  # fmt: skip
    w.prove(proof)
    assert w.status_of(s.b) == SLASHED


def test_an_inner_node_of_an_honest_batch_signs_no_receipt(staffed: Staffed) -> None:
    """OpenZeppelin's tree hashes inner nodes as bare 64-byte pairs and its leaves here are
    receipt digests the contract computes itself (66-byte EIP-712 preimages), never taken from
    the caller: a proof cut short at an inner node leads to no signed root, and no receipt's
    digest can be an inner node without a keccak preimage."""
    w, a = staffed.w, staffed.a
    receipts = forwards(staffed, range(4))
    entries = batch(staffed, receipts)
    other = replace(receipts[0], outputDigest=keccak(text="another output"))
    # The other version shown with the honest leaf's proof cut one level short.
    cut = entries[0].proof[1:]
    proof = fraud_proofs.equivocation(
        a.address, entries[0].receipt, entries[0].worker_signature, other,
        entries[0].worker_signature, entries[0].proof, cut,
    )  # fmt: skip
    nobody = recover_digest_signer(
        signing_digest(other, w.ledger_domain, cut), entries[0].worker_signature
    )
    proof_reverts(w, proof, "NotOneSigner", a.address, nobody)
    assert w.stake_of(a) == 2 * ETH
