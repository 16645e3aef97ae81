"""Each finding the chain judges alone, turned into its fraud proof on chain: committed, revealed
a block later, and judged. A wrong tensor, which the chain cannot judge, opens a tensor dispute
the same way (with the bond and the first jury's fees) for a drawn jury to rule on
(``gwtf.node.audit.jury``). What neither can judge is left to the report.

Safe to run again: a finding already judged (its certificate voided, its accused convicted in
the finding's run and epoch on a commitment earlier than any this challenger holds) is
skipped, while one that convicts a slashed node in a further epoch, where its pay is then
burned, is proven; a commitment already on chain and still within its reveal window is
revealed, not made again; the salt is derived from the challenger's key and the proof, so a
second run finds its first commitment. A bounty is the
earliest proven commitment's once the reveal window of its commitment closed and no tensor
dispute about the accused is open: each final bounty this challenger leads for is awarded, and
the credit withdrawn, at the end (pull payment); one not final yet is left for a later run.

A tensor dispute of this challenger's that no jury could be drawn for (ruled REFUSED) is
reopened, once, while its grace (``Disputes.reopenUntil``) lasts, with a draw salt of its own
(``draw_salt_of``); and the stake of each accused held by a dispute whose grace is over is
thawed (``gwtf.node.chain.holds``), since nobody is paid to. A reopening frees no cheater early
(the stake stays frozen under it until its own ruling, which ranks by the first commitment),
and it holds an honest worker at most one case longer: only the first dispute's challenger may
reopen, once, within the grace, paying a new bond that a RIGHT ruling gives the worker.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Final

from web3.logs import DISCARD

from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.encoding import CertRef, HopReceipt, ledger_domain, receipt_digest, sign_digest
from gwtf.contracts.fraud_proofs import (
    NEEDS_JURY,
    Conviction,
    Fraud,
    FraudProof,
    commitment_of,
    is_revealable,
)
from gwtf.contracts.keccak import keccak256
from gwtf.errors import ChainError
from gwtf.node.audit.checks import Finding
from gwtf.node.chain.actions import (
    Contracts,
    award_bounty,
    commit_proof,
    reveal_proof,
    withdraw_credit,
)
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.holds import NO_JURY, chain_now, release_expired, stake_holds

SLASHED: Final = "slashed"
DISPUTED: Final = "disputed"  # a tensor dispute is open: a drawn jury rules
REOPENED: Final = "reopened"  # a dispute no jury sat on, opened again for a new draw
JUDGED_BEFORE: Final = "already judged"
REFUSED: Final = "refused"
#: Gas a reveal is sent with: the proofs take 100-200 thousand (``gwtf/contracts/README.md``).
REVEAL_GAS: Final = 1_000_000
NEXT_BLOCK_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True)
class Judgement:
    """What became of one provable finding."""

    finding: Finding
    outcome: str  # SLASHED, DISPUTED, REOPENED, JUDGED_BEFORE or REFUSED
    detail: str = ""
    slashed_wei: int = 0
    bounty_wei: int = 0
    tx_hash: str = ""


@dataclass
class Challenges:
    judgements: list[Judgement] = field(default_factory=list)
    withdrawn_wei: int = 0
    #: Disputes whose grace was over, their stake thawed by this run.
    released: list[int] = field(default_factory=list)

    @property
    def bounty_wei(self) -> int:
        return sum(j.bounty_wei for j in self.judgements)


def challenge(contracts: Contracts, challenger: Sender, findings: list[Finding]) -> Challenges:
    """Prove every finding that carries a fraud proof, in order; withdraw the bounties."""
    done = Challenges()
    disputed: set[tuple[str, int, int]] = set()
    for finding in findings:
        proof = finding.proof
        if proof is None:
            continue
        key = (proof.accused.lower(), proof.run_id, proof.epoch)
        if proof.fraud in NEEDS_JURY and key in disputed:
            # One dispute per worker and (run, epoch): a ruling of wrong convicts it there, for
            # one slice of its stake (the run's minimum) however many of its hops are wrong.
            done.judgements.append(Judgement(finding, JUDGED_BEFORE, "a dispute about it is open"))
            continue
        judgement = _judge(contracts, challenger, finding, proof)
        if proof.fraud in NEEDS_JURY and judgement.outcome != REFUSED:
            disputed.add(key)
        done.judgements.append(judgement)
    done.withdrawn_wei = collect_bounties(contracts, challenger, findings)
    done.released = release_graces(contracts, challenger, findings)
    return done


def release_graces(contracts: Contracts, sender: Sender, findings: list[Finding]) -> list[int]:
    """Thaw each wrong-tensor accused's stake held by a dispute whose grace is over."""
    accused = sorted({f.accused for f in findings if f.proof and f.proof.fraud in NEEDS_JURY})
    released: list[int] = []
    for node in accused:
        try:
            released += release_expired(contracts, sender, stake_holds(contracts, node))
        except ChainError:  # a release not mined is left for a later run, or the worker
            continue
    return released


def collect_bounties(contracts: Contracts, challenger: Sender, findings: list[Finding]) -> int:
    """Award each final bounty ``challenger`` leads for among ``findings``' accused, and
    withdraw its credit (bounties, and bonds of disputes ruled for it); returns the wei."""
    _award_final_bounties(contracts, challenger, findings)
    credit = int(contracts.disputes.functions.creditWei(challenger.address).call())
    if credit > 0:
        withdraw_credit(contracts, challenger)  # a failure here leaves the credit to withdraw
    return credit


def _judge(c: Contracts, challenger: Sender, finding: Finding, proof: FraudProof) -> Judgement:
    judged = _judged_before(c, proof, challenger)
    if judged:
        return Judgement(finding, JUDGED_BEFORE, judged)
    salt = salt_of(challenger, proof)
    commitment = commitment_of(challenger.address, salt, proof.proof_hash)
    try:
        committed_at = int(c.disputes.functions.commitments(commitment).call()[0])
        window = int(c.disputes.functions.revealWindowBlocks().call())
        if not is_revealable(committed_at, c.w3.eth.block_number + 1, window):
            commit_proof(c, challenger, proof, salt)
        receipt = _reveal(c, challenger, proof, salt)
    except ContractRevert as exc:
        return Judgement(finding, REFUSED, str(exc))
    except ChainError as exc:  # mined and failed, no receipt in time: the next proofs go on
        return Judgement(finding, REFUSED, " ".join(str(exc).split())[:300])
    tx_hash = receipt["transactionHash"].hex()
    if proof.fraud in NEEDS_JURY:
        (opened,) = c.disputes.events.TensorDisputeOpened().process_receipt(receipt, errors=DISCARD)
        dispute_id = opened["args"]["id"]
        serve = "a drawn jury rules (`gwtf-node jury serve`)"
        if c.disputes.functions.isReopening(dispute_id).call():
            detail = f"tensor dispute {dispute_id} reopens one no jury sat on: {serve}"
            return Judgement(finding, REOPENED, detail, tx_hash=tx_hash)
        detail = f"tensor dispute {dispute_id} opened: {serve}"
        return Judgement(finding, DISPUTED, detail, tx_hash=tx_hash)
    (event,) = c.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    args = event["args"]
    return Judgement(
        finding, SLASHED, f"{Fraud(args['fraud']).name.lower()} proven",
        int(args["slashedWei"]), int(args["bountyWei"]), tx_hash,
    )  # fmt: skip


def _reveal(c: Contracts, challenger: Sender, proof: FraudProof, salt: bytes) -> Any:
    """The proof, sent once the commitment's block is behind. It is checked against the
    pending block and sent with a fixed gas limit: a node estimating gas at the latest block
    (geth) would find the commitment too recent in the very block that holds it. On a chain
    that is slow to make the next block, it is asked again once the next block is in."""
    try:
        return reveal_proof(c, challenger, proof, salt, gas_limit=REVEAL_GAS)
    except ContractRevert as exc:
        if exc.name != "CommitmentTooRecent":
            raise
        _wait_for_block(c, int(exc.args[1]) + 1)
        return reveal_proof(c, challenger, proof, salt, gas_limit=REVEAL_GAS)


def _wait_for_block(c: Contracts, number: int, timeout_s: float = NEXT_BLOCK_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while c.w3.eth.block_number < number:
        if time.monotonic() > deadline:
            raise ChainError(f"the chain made no block {number} in {timeout_s:.0f} s")
        time.sleep(1.0)


def _judged_before(c: Contracts, proof: FraudProof, challenger: Sender) -> str:
    """Why the chain has judged this fraud already, or "". A signer convicted already is
    proven again where the proof would convict it in a further (run, epoch), whose pay is
    burned, or lead for its bounty: the chain takes both (``Disputes._convict``,
    ``openTensorDispute``). Only a signer convicted in this very (run, epoch), on a commitment
    earlier than any this challenger can still reveal (or whose bounty is awarded), is
    skipped."""
    if proof.fraud in (Fraud.EQUIVOCATION, Fraud.WRONG_TENSOR):
        here = c.ledger.functions.isConvictedIn(proof.run_id, proof.epoch, proof.accused).call()
        if here:
            conviction = Conviction.from_call(
                c.disputes.functions.convictions(proof.accused).call()
            )
            order = _held_order(c, challenger, proof)
            if order is None or not conviction.can_lead(order):
                return f"its signer is convicted in epoch {proof.epoch} already"
    if proof.fraud == Fraud.EQUIVOCATION:
        return ""
    if proof.fraud == Fraud.WRONG_TENSOR:
        receipt = HopReceipt(*proof.args[3])  # type: ignore[misc]
        digest = receipt_digest(receipt, ledger_domain(c.w3.eth.chain_id, c.ledger.address))
        dispute = int(c.disputes.functions.tensorDisputeOf(digest, challenger.address).call())
        if dispute == 0 or _reopenable(c, dispute):
            return ""  # opened, or reopened for a jury that may sit this time
        return f"our tensor dispute {dispute} is open or ruled"
    cert = CertRef(*proof.args[0])  # type: ignore[misc]
    stored = c.ledger.functions.certificateCommitment(cert.runId, cert.epoch, cert.dataNode).call()
    return "" if bytes(stored) == cert.commitment() else "its certificate is voided"


def _reopenable(c: Contracts, dispute_id: int) -> bool:
    """Whether our dispute was ruled without a jury and may still be reopened: its grace
    (``reopenUntil``, 0 once reopened) not over at the latest block's time. A reopening is
    never reopened again (the contract sets no grace for it)."""
    state = int(c.disputes.functions.tensorDisputes(dispute_id).call()[1])
    until = int(c.disputes.functions.reopenUntil(dispute_id).call())
    return state == NO_JURY and chain_now(c) < until


def _held_order(c: Contracts, challenger: Sender, proof: FraudProof) -> int | None:
    """The order of ``challenger``'s commitment to ``proof`` that it can still reveal, or None
    (a commitment made now would come after every conviction's)."""
    commitment = commitment_of(challenger.address, salt_of(challenger, proof), proof.proof_hash)
    committed_at, order = c.disputes.functions.commitments(commitment).call()
    window = int(c.disputes.functions.revealWindowBlocks().call())
    revealable = is_revealable(int(committed_at), c.w3.eth.block_number + 1, window)
    return int(order) if revealable else None


def _award_final_bounties(c: Contracts, challenger: Sender, findings: list[Finding]) -> None:
    """Award each final bounty this challenger leads for, among the findings' accused."""
    accused = sorted({f.accused for f in findings if f.accused})
    next_block = c.w3.eth.block_number + 1
    for node in accused:
        conviction = Conviction.from_call(c.disputes.functions.convictions(node).call())
        mine = conviction.challenger.lower() == challenger.address.lower()
        if mine and conviction.is_final(next_block):
            try:
                award_bounty(c, challenger, node)
            except (ContractRevert, ChainError):  # another caller awarded it first
                continue


def salt_of(challenger: Sender, proof: FraudProof) -> bytes:
    """The commitment's salt: from the challenger's key and the proof, so a run again finds its
    own commitment; random for an account the chain unlocks (its key is not here)."""
    if challenger.account is None:
        return secrets.token_bytes(32)
    # A deterministic (RFC 6979) signature of a message no contract asks to be signed.
    message = keccak256(b"gwtf challenge salt" + proof.proof_hash)
    return keccak256(sign_digest(message, bytes(challenger.account.key)))
