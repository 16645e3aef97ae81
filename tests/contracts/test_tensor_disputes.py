"""Wrong tensors, the fraud the chain cannot judge alone: a challenger opens a dispute about a
certified hop with a bond, the run's sponsor rules before the epoch settles, and a dispute left
unruled lapses: the worker keeps its stake and the bond is burned. Upheld: the worker is
slashed (bond back to the challenger, the bounty once it is final), the certificate stands and
everyone else is paid. Rejected: the worker's wallet gets the bond. Several challengers may
dispute one receipt side by side. Every way to open or rule out of turn reverts with its own
error."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from web3.logs import DISCARD

from contracts import fraud_proofs
from contracts.certificate_tree import SignedReceipt
from contracts.fraud_proofs import Fraud, FraudProof
from tests.contracts.conftest import Certified, Staffed
from tests.contracts.world import ETH, NodeKey, World, proof_reverts, reverts

BOND = 10**17  # SuiteParams' default tensor bond
BOUNTY_BPS = 500
SLASHED = 4
OPEN, UPHELD, REJECTED, LAPSED = 1, 2, 3, 4
EVIDENCE = b"\x11" * 32


def dispute_of(c: Certified, worker: NodeKey, entry_filter: Any = None) -> FraudProof:
    """The tensor dispute about ``worker``'s first forward in the certificate."""
    for index, entry in enumerate(c.tree.entries):
        receipt = entry.receipt
        wanted = entry_filter is None or entry_filter(receipt)
        if receipt.worker == worker.address and receipt.direction == 0 and wanted:
            return fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), entry)
    raise AssertionError(f"{worker.address} has no forward in the certificate")


def opened(c: Certified, proof: FraudProof, challenger: str | None = None) -> int:
    receipt = c.w.prove(proof, challenger)
    (event,) = c.w.disputes.events.TensorDisputeOpened().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["worker"] == proof.accused and event["args"]["bondWei"] == BOND
    return int(event["args"]["id"])


def state_of(w: World, dispute_id: int) -> int:
    return int(w.call(w.disputes.functions.tensorDisputes(dispute_id))[1])


def credit(w: World, account: str) -> int:
    return int(w.call(w.disputes.functions.creditWei(account)))


def rule(w: World, dispute_id: int, wrong: bool) -> Any:
    return w.tx(w.disputes.functions.ruleTensorDispute(dispute_id, wrong, EVIDENCE), w.sponsor)


def test_an_upheld_dispute_slashes_the_worker_and_only_the_worker(certified: Certified) -> None:
    c, w = certified, certified.w
    dispute_id = opened(c, dispute_of(c, c.a))
    assert state_of(w, dispute_id) == OPEN
    assert w.balance(w.disputes.address) == BOND
    receipt = rule(w, dispute_id, True)
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    bounty = 2 * ETH * BOUNTY_BPS // 10_000
    assert event["args"]["node"] == c.a.address and event["args"]["fraud"] == Fraud.WRONG_TENSOR
    assert event["args"]["challenger"] == w.challenger and event["args"]["bountyWei"] == bounty
    assert w.status_of(c.a) == SLASHED and state_of(w, dispute_id) == UPHELD
    # The challenger gets its bond back at once, the bounty once no earlier commitment can
    # be revealed; the sponsor who ruled gets nothing.
    assert credit(w, w.challenger) == BOND
    w.award(c.a.address)
    assert credit(w, w.challenger) == BOND + bounty and credit(w, w.sponsor) == 0
    # The certificate stands: b is paid, a is not.
    w.to_settled(c.run, 0)
    w.claim(c.cert, c.tree, c.b, w.wallet(1))
    reverts(
        w, w.claim_fn(c.cert, c.tree, c.a), w.wallet(0), "ClaimantConvicted", c.run, 0, c.a.address
    )
    before = w.balance(w.challenger)
    w.tx(w.disputes.functions.withdrawCredit(), w.challenger)
    assert w.balance(w.challenger) > before + BOND + bounty - ETH // 100  # less gas


def test_a_rejected_dispute_pays_its_bond_to_the_workers_wallet(certified: Certified) -> None:
    c, w = certified, certified.w
    dispute_id = opened(c, dispute_of(c, c.a))
    receipt = rule(w, dispute_id, False)
    (event,) = w.disputes.events.TensorDisputeRuled().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["wrongTensor"] is False and event["args"]["evidenceHash"] == EVIDENCE
    assert w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD) == ()
    assert w.status_of(c.a) != SLASHED and state_of(w, dispute_id) == REJECTED
    assert credit(w, w.wallet(0)) == BOND and credit(w, w.challenger) == 0
    # Ruled once: neither ruling again nor lapsing changes it.
    reverts(
        w, w.disputes.functions.ruleTensorDispute(dispute_id, True, EVIDENCE), w.sponsor,
        "DisputeNotOpen", dispute_id,
    )  # fmt: skip
    w.to_settled(c.run, 0)
    reverts(
        w, w.disputes.functions.lapseTensorDispute(dispute_id), w.stranger, "DisputeNotOpen",
        dispute_id,
    )  # fmt: skip
    w.claim(c.cert, c.tree, c.a, w.wallet(0))


def test_an_unruled_dispute_lapses_and_its_bond_is_burned(certified: Certified) -> None:
    c, w = certified, certified.w
    dispute_id = opened(c, dispute_of(c, c.a))
    settles_at = w.epoch_times(c.run, 0)[3]
    lapse = w.disputes.functions.lapseTensorDispute(dispute_id)
    reverts(w, lapse, w.stranger, "RulingPeriodOpen", dispute_id, settles_at)
    w.to_settled(c.run, 0)
    reverts(
        w, w.disputes.functions.ruleTensorDispute(dispute_id, True, EVIDENCE), w.sponsor,
        "RulingPeriodOver", dispute_id, settles_at,
    )  # fmt: skip
    burned = w.call(w.disputes.functions.burnedWei())
    receipt = w.tx(lapse, w.stranger)  # anyone may close it
    (event,) = w.disputes.events.TensorDisputeLapsed().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["burnedWei"] == BOND
    assert state_of(w, dispute_id) == LAPSED and w.status_of(c.a) != SLASHED
    # The bond goes to nobody: not back to the challenger, not to the sponsor or the run.
    assert w.call(w.disputes.functions.burnedWei()) == burned + BOND
    assert credit(w, w.challenger) == credit(w, w.sponsor) == credit(w, w.wallet(0)) == 0
    w.claim(c.cert, c.tree, c.a, w.wallet(0))


def test_only_the_runs_sponsor_rules(certified: Certified) -> None:
    c, w = certified, certified.w
    dispute_id = opened(c, dispute_of(c, c.a))
    for caller in (w.challenger, w.stranger, w.wallet(1)):
        reverts(
            w, w.disputes.functions.ruleTensorDispute(dispute_id, True, EVIDENCE), caller,
            "NotArbiter", caller, w.sponsor,
        )  # fmt: skip
    reverts(
        w, w.disputes.functions.ruleTensorDispute(99, True, EVIDENCE), w.sponsor,
        "DisputeNotOpen", 99,
    )  # fmt: skip


def test_opening_a_dispute_out_of_turn_reverts(certified: Certified) -> None:
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    # The exact bond only.
    salt = w.commit(proof, w.challenger)
    for sent in (0, BOND - 1, BOND + 1):
        reverts(w, w.reveal_fn(proof, salt), w.challenger, "WrongBond", sent, BOND, value=sent)
    # A copy of someone else's reveal from the mempool has no commitment of its own.
    reverts(
        w, w.reveal_fn(proof, salt), w.stranger, "NoCommitment",
        fraud_proofs.commitment_of(w.stranger, salt, proof.proof_hash), value=BOND,
    )  # fmt: skip
    # A signature that is not the worker's.
    index = next(i for i, e in enumerate(c.tree.entries) if e.receipt.worker == c.a.address)
    entry = c.tree.entries[index]
    forged = SignedReceipt(
        entry.receipt, entry.counterparty_signature, entry.counterparty_signature
    )
    bad = fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), forged)
    proof_reverts(w, bad, "NotWorkersSignature", c.a.address)
    # A receipt that is not the leaf's.
    other = replace(entry.receipt, outputDigest=b"\x22" * 32)
    foreign = SignedReceipt(other, entry.worker_signature, entry.counterparty_signature)
    bad = fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), foreign)
    proof_reverts(w, bad, "NotTheLeafsReceipt", index)
    # One dispute per receipt and challenger; another challenger's runs beside it.
    dispute_id = opened(c, proof)
    proof_reverts(w, proof, "DisputeExists", dispute_id)
    assert opened(c, proof, challenger=w.stranger) == dispute_id + 1
    # No later than MIN_RULING_S before the epoch settles, so the arbiter has time to rule.
    settles_at = w.epoch_times(c.run, 0)[3]
    w.travel_to(settles_at - 300 + 1)
    proof_reverts(w, dispute_of(c, c.b), "TooLateToDispute", c.run, 0, settles_at - 300)


def test_a_slashed_worker_cannot_be_disputed_and_a_second_upheld_ruling_takes_nothing(
    certified: Certified,
) -> None:
    c, w = certified, certified.w
    first = opened(c, dispute_of(c, c.b))
    second = opened(c, dispute_of(c, c.b, lambda r: r.microbatchId == 1))
    rule(w, first, True)
    # A commitment made after the one that leads can no longer earn anything: refused.
    proof_reverts(
        w, dispute_of(c, c.b, lambda r: r.microbatchId == 2), "AlreadySlashed", c.b.address
    )
    receipt = rule(w, second, True)  # committed later than the first: it takes nothing
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert (event["args"]["slashedWei"], event["args"]["bountyWei"]) == (0, 0)
    bounty = 4 * ETH * BOUNTY_BPS // 10_000
    w.award(c.b.address)
    assert credit(w, w.challenger) == 2 * BOND + bounty
    assert w.call(w.disputes.functions.burnedWei()) == 4 * ETH - bounty


def test_a_worker_disputing_itself_loses_its_stake(certified: Certified) -> None:
    """Self-reporting never pays: the bounty is 5 % of what the worker loses."""
    c, w = certified, certified.w
    dispute_id = opened(c, dispute_of(c, c.a), challenger=w.wallet(0))
    rule(w, dispute_id, True)
    w.award(c.a.address)
    assert credit(w, w.wallet(0)) == BOND + 2 * ETH * BOUNTY_BPS // 10_000
    assert w.stake_of(c.a) == 0


def test_a_receipt_of_another_epoch_is_the_data_nodes_fraud_not_a_tensor_dispute(
    staffed: Staffed,
) -> None:
    s, w = staffed, staffed.w
    receipt = w.receipt(s.run, 1, s.data, s.a, s.b, 0)  # epoch 1, in the tree of epoch 0
    tree = w.certificate_tree([w.signed(receipt, s.a, s.b)])
    cert = w.certify(tree, s.run, 0, s.data)
    proof = fraud_proofs.wrong_tensor(cert, tree.leaf_proof(0), tree.entries[0])
    proof_reverts(w, proof, "ReceiptNotOfCertificate", 0)
