"""Wrong tensors, the fraud the chain cannot judge alone: a challenger opens a dispute about a
certified hop with a bond and the first jury's fees, and the Court's drawn jury rules. WRONG:
the worker is slashed (bond back to the challenger, the bounty once it is final), the
certificate stands and everyone else is paid. RIGHT: the worker's wallet gets the bond. No jury:
the bond returns. Until the ruling only the accused's claims of that epoch and its stake's
withdrawal are frozen. Several challengers may dispute one receipt side by side. Every way to
open out of turn reverts with its own error; nobody but the court rules. A worker convicted
in one epoch is still disputed about another, where it is convicted for no second stake."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.fraud_proofs import Fraud, FraudProof
from tests.contracts.conftest import Certified, Juried, Staffed
from tests.contracts.jury import (
    RIGHT,
    WRONG,
    draw,
    execute,
    honest,
    open_case,
    reveal_salt,
    vote,
    whole_case,
)
from tests.contracts.world import ETH, NodeKey, World, proof_reverts, reverts

BOND = 10**17  # SuiteParams' default tensor bond
FEES = 3 * 10**15  # the first jury's fees at the test fee
BOUNTY_BPS = 500
SLASHED = 4
OPEN, UPHELD, REJECTED, NO_JURY = 1, 2, 3, 4


def dispute_of(c: Certified, worker: NodeKey, entry_filter: Any = None) -> FraudProof:
    """The tensor dispute about ``worker``'s first forward in the certificate."""
    for index, entry in enumerate(c.tree.entries):
        receipt = entry.receipt
        wanted = entry_filter is None or entry_filter(receipt)
        if receipt.worker == worker.address and receipt.direction == 0 and wanted:
            return fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), entry)
    raise AssertionError(f"{worker.address} has no forward in the certificate")


def state_of(w: World, dispute_id: int) -> int:
    return int(w.call(w.disputes.functions.tensorDisputes(dispute_id))[1])


def credit(w: World, account: str) -> int:
    return int(w.call(w.disputes.functions.creditWei(account)))


def test_an_upheld_dispute_slashes_the_worker_and_only_the_worker(juried: Juried) -> None:
    c, w = juried, juried.w
    proof = dispute_of(c, c.a)
    dispute_id, case_id = open_case(w, proof)
    assert state_of(w, dispute_id) == OPEN
    assert w.balance(w.disputes.address) == BOND and w.balance(w.court.address) >= FEES
    reveal_salt(w, case_id, proof)
    draw(w, case_id)
    vote(w, case_id, c.jurors, honest(WRONG))
    receipt = execute(w, case_id)
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    bounty = ETH * BOUNTY_BPS // 10_000  # on the run's minimum stake, what a wrong tensor takes
    assert event["args"]["node"] == c.a.address and event["args"]["fraud"] == Fraud.WRONG_TENSOR
    assert event["args"]["challenger"] == w.challenger and event["args"]["bountyWei"] == bounty
    assert event["args"]["slashedWei"] == ETH and w.stake_of(c.a) == ETH  # the rest stays a's
    assert w.status_of(c.a) != SLASHED and state_of(w, dispute_id) == UPHELD
    # The challenger gets its bond back at once, the bounty once no earlier commitment can
    # be revealed; the sponsor gets nothing.
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


def test_a_rejected_dispute_pays_its_bond_to_the_workers_wallet(juried: Juried) -> None:
    c, w = juried, juried.w
    dispute_id, _, receipt = whole_case(w, dispute_of(c, c.a), c.jurors, honest(RIGHT))
    (event,) = w.disputes.events.TensorDisputeRuled().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["ruling"] == RIGHT
    assert w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD) == ()
    assert w.status_of(c.a) != SLASHED and state_of(w, dispute_id) == REJECTED
    assert credit(w, w.wallet(0)) == BOND and credit(w, w.challenger) == 0
    w.to_settled(c.run, 0)
    w.claim(c.cert, c.tree, c.a, w.wallet(0))


def test_nobody_but_the_court_rules(certified: Certified) -> None:
    c, w = certified, certified.w
    w.prove(dispute_of(c, c.a))
    for caller in (w.sponsor, w.challenger, w.stranger, w.wallet(1), w.deployer):
        reverts(w, w.disputes.functions.rule(1, WRONG), caller, "NotCourt", caller)


def test_opening_a_dispute_out_of_turn_reverts(certified: Certified) -> None:
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    # The exact bond and fees only.
    salt = w.commit(proof, w.challenger)
    for sent in (0, BOND, BOND + FEES - 1, BOND + FEES + 1):
        reverts(
            w, w.reveal_fn(proof, salt), w.challenger, "WrongBond", sent, BOND + FEES, value=sent
        )
    # A copy of someone else's reveal from the mempool has no commitment of its own.
    reverts(
        w, w.reveal_fn(proof, salt), w.stranger, "NoCommitment",
        fraud_proofs.commitment_of(w.stranger, salt, proof.proof_hash), value=BOND + FEES,
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
    # A batch proof longer than any juror processes (65 hashes, a 2^64-leaf tree needs 64).
    deep = replace(entry, proof=tuple(bytes([i]) * 32 for i in range(65)))
    bad = fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), deep)
    proof_reverts(w, bad, "ProofTooLong", 65, 64)
    # One dispute per receipt and challenger; another challenger's runs beside it.
    dispute_id, _ = open_case(w, proof)
    proof_reverts(w, proof, "DisputeExists", dispute_id)
    assert open_case(w, proof, challenger=w.stranger)[0] == dispute_id + 1
    # Until the epoch settles, like every proof.
    settles_at = w.epoch_times(c.run, 0)[3]
    w.travel_to(settles_at)
    proof_reverts(w, dispute_of(c, c.b), "ChallengePeriodOver", c.run, 0, settles_at)


def test_a_slashed_worker_cannot_be_disputed_and_a_second_upheld_ruling_takes_nothing(
    juried: Juried,
) -> None:
    c, w = juried, juried.w
    first_proof = dispute_of(c, c.b)
    second_proof = dispute_of(c, c.b, lambda r: r.microbatchId == 1)
    _, first = open_case(w, first_proof)
    _, second = open_case(w, second_proof)
    for case_id, proof in ((first, first_proof), (second, second_proof)):
        reveal_salt(w, case_id, proof)
    draw(w, first)
    vote(w, first, c.jurors, honest(WRONG))
    execute(w, first)
    # A commitment made after the one that leads can no longer earn anything: refused.
    proof_reverts(
        w, dispute_of(c, c.b, lambda r: r.microbatchId == 2), "AlreadySlashed", c.b.address
    )
    # The second case's jury rules WRONG too, and it takes nothing.
    draw(w, second)
    vote(w, second, c.jurors, honest(WRONG))
    receipt = execute(w, second)
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert (event["args"]["slashedWei"], event["args"]["bountyWei"]) == (0, 0)
    bounty = ETH * BOUNTY_BPS // 10_000
    w.award(c.b.address)
    assert credit(w, w.challenger) == 2 * BOND + bounty
    assert w.call(w.disputes.functions.burnedWei()) == ETH - bounty
    assert w.stake_of(c.b) == 3 * ETH  # one (run, epoch) proven: one bounded slash


def test_a_worker_disputing_itself_loses_its_stake(juried: Juried) -> None:
    """Self-reporting never pays: the bounty is 5 % of what the worker loses (the run's
    1 ETH minimum stake; the rest of its 2 ETH stays)."""
    c, w = juried, juried.w
    whole_case(w, dispute_of(c, c.a), c.jurors, honest(WRONG), challenger=w.wallet(0))
    w.award(c.a.address)
    assert credit(w, w.wallet(0)) == BOND + ETH * BOUNTY_BPS // 10_000
    assert w.stake_of(c.a) == ETH


def test_a_receipt_of_another_epoch_is_the_data_nodes_fraud_not_a_tensor_dispute(
    staffed: Staffed,
) -> None:
    s, w = staffed, staffed.w
    receipt = w.receipt(s.run, 1, s.data, s.a, s.b, 0)  # epoch 1, in the tree of epoch 0
    tree = w.certificate_tree([w.signed(receipt, s.a, s.b)])
    cert = w.certify(tree, s.run, 0, s.data)
    proof = fraud_proofs.wrong_tensor(cert, tree.leaf_proof(0), tree.entries[0])
    proof_reverts(w, proof, "ReceiptNotOfCertificate", 0)


def test_the_accused_claims_and_stake_are_frozen_until_the_ruling_and_no_one_elses(
    juried: Juried,
) -> None:
    """The ruling comes after the epoch settled and after a's unbonding delay: meanwhile a
    cannot claim that epoch or withdraw, b claims as usual; the ruling (RIGHT) thaws both."""
    c, w = juried, juried.w
    proof = dispute_of(c, c.a)
    dispute_id, case_id = open_case(w, proof)
    w.tx(w.registry.functions.requestUnstake(c.a.address), w.wallet(0))
    unlock = int(w.call(w.registry.functions.unlockAt(c.a.address)))
    w.to_settled(c.run, 0)
    w.travel_to(max(unlock, w.now() + 1))
    reverts(w, w.claim_fn(c.cert, c.tree, c.a), w.wallet(0), "ClaimFrozen", c.a.address)
    reverts(
        w, w.registry.functions.withdrawStake(c.a.address), w.wallet(0), "StakeFrozen",
        c.a.address, 1,
    )  # fmt: skip
    w.claim(c.cert, c.tree, c.b, w.wallet(1))  # the epoch settles for everyone else
    reveal_salt(w, case_id, proof)
    draw(w, case_id)
    vote(w, case_id, c.jurors, honest(RIGHT))
    execute(w, case_id)
    assert state_of(w, dispute_id) == REJECTED
    w.claim(c.cert, c.tree, c.a, w.wallet(0))
    w.tx(w.registry.functions.withdrawStake(c.a.address), w.wallet(0))
    assert w.stake_of(c.a) == 0 and w.status_of(c.a) != SLASHED


def test_a_slashed_worker_is_still_disputed_about_an_epoch_it_was_not_convicted_in(
    juried: Juried,
) -> None:
    """a (2 ETH of stake) is certified in epochs 0 and 1, convicted of a wrong tensor about
    epoch 0 (the run's 1 ETH minimum taken, the bounty on it awarded). Its epoch-1 pay would
    stand unchallengeable if a slashed worker could not be disputed: a dispute about epoch 1
    opens, and the WRONG ruling records the conviction there (ClaimantConvicted) and takes
    the epoch's own slice, the 1 ETH left, all of it burned (no second bounty). About epoch 0,
    where it is convicted already, a dispute is refused."""
    c, w = juried, juried.w
    hops = w.pipeline_hops(c.run, 1, c.data, [c.a, c.b], range(2))
    tree_1 = w.certificate_tree(hops)
    cert_1 = w.certify(tree_1, c.run, 1, c.data)  # before epoch 0 settles
    assert w.now() < w.epoch_times(c.run, 0)[3]
    whole_case(w, dispute_of(c, c.a), c.jurors, honest(WRONG))
    w.award(c.a.address)
    bounty = ETH * BOUNTY_BPS // 10_000
    burned = int(w.call(w.disputes.functions.burnedWei()))
    assert w.stake_of(c.a) == ETH and credit(w, w.challenger) == BOND + bounty
    assert burned == ETH - bounty and w.status_of(c.a) != SLASHED
    assert not w.call(w.ledger.functions.isConvictedIn(c.run, 1, c.a.address))
    # About epoch 0, where a is convicted already: refused.
    proof_reverts(
        w, dispute_of(c, c.a, lambda r: r.microbatchId == 1), "AlreadySlashed", c.a.address
    )
    # About epoch 1: opened, and upheld for the conviction there and its own slice.
    epoch_1 = Certified(w, c.run, c.data, c.a, c.b, c.c, tree_1, cert_1)
    dispute_id, _, receipt = whole_case(w, dispute_of(epoch_1, c.a), c.jurors, honest(WRONG))
    assert state_of(w, dispute_id) == UPHELD
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert (event["args"]["node"], event["args"]["epoch"]) == (c.a.address, 1)
    assert (event["args"]["slashedWei"], event["args"]["bountyWei"]) == (ETH, 0)
    assert w.call(w.ledger.functions.isConvictedIn(c.run, 1, c.a.address))
    assert int(w.call(w.disputes.functions.burnedWei())) == burned + ETH
    assert w.stake_of(c.a) == 0 and w.status_of(c.a) == SLASHED
    assert credit(w, w.challenger) == 2 * BOND + bounty  # both bonds back, one bounty
    reverts(w, w.disputes.functions.awardBounty(c.a.address), w.stranger, "BountyAwardedAlready",
            c.a.address)  # fmt: skip
    # a is paid in neither epoch; b in both.
    w.to_settled(c.run, 1)
    for cert, tree, epoch in ((c.cert, c.tree, 0), (cert_1, tree_1, 1)):
        w.claim(cert, tree, c.b, w.wallet(1))
        reverts(
            w, w.claim_fn(cert, tree, c.a), w.wallet(0), "ClaimantConvicted", c.run, epoch,
            c.a.address,
        )  # fmt: skip
