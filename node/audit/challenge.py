"""Each finding the chain judges alone, turned into its fraud proof on chain: committed, revealed
a block later, and judged. What the chain cannot judge is left to the report.

Safe to run again: a finding already judged (its certificate voided, its equivocating signer
slashed) is skipped, and a commitment already on chain is revealed, not made again; the salt is
derived from the challenger's key and the proof, so a second run finds its first commitment.
The bounties credited to the challenger are withdrawn at the end (pull payment).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Final

from web3.logs import DISCARD

from contracts.bindings import ContractRevert
from contracts.encoding import CertRef
from contracts.fraud_proofs import Fraud, FraudProof, commitment_of
from contracts.keccak import keccak256
from node.audit.checks import Finding
from node.chain.actions import Contracts, commit_proof, reveal_proof, withdraw_credit
from node.chain.adapter import Sender

SLASHED: Final = "slashed"
JUDGED_BEFORE: Final = "already judged"
REFUSED: Final = "refused"
#: NodeRegistry.NodeStatus.Slashed
_STATUS_SLASHED: Final = 4


@dataclass(frozen=True)
class Judgement:
    """What became of one provable finding."""

    finding: Finding
    outcome: str  # SLASHED, JUDGED_BEFORE or REFUSED
    detail: str = ""
    slashed_wei: int = 0
    bounty_wei: int = 0
    tx_hash: str = ""


@dataclass
class Challenges:
    judgements: list[Judgement] = field(default_factory=list)
    withdrawn_wei: int = 0

    @property
    def bounty_wei(self) -> int:
        return sum(j.bounty_wei for j in self.judgements)


def challenge(contracts: Contracts, challenger: Sender, findings: list[Finding]) -> Challenges:
    """Prove every finding that carries a fraud proof, in order; withdraw the bounties."""
    done = Challenges()
    for finding in findings:
        if finding.proof is not None:
            done.judgements.append(_judge(contracts, challenger, finding, finding.proof))
    credit = int(contracts.disputes.functions.creditWei(challenger.address).call())
    if credit > 0:
        withdraw_credit(contracts, challenger)
        done.withdrawn_wei = credit
    return done


def _judge(c: Contracts, challenger: Sender, finding: Finding, proof: FraudProof) -> Judgement:
    judged = _judged_before(c, proof)
    if judged:
        return Judgement(finding, JUDGED_BEFORE, judged)
    salt = salt_of(challenger, proof)
    commitment = commitment_of(challenger.address, salt, proof.proof_hash)
    try:
        if int(c.disputes.functions.commitments(commitment).call()) == 0:
            commit_proof(c, challenger, proof, salt)
        # The reveal is mined in a later block than the commitment, which the contract asks.
        receipt = reveal_proof(c, challenger, proof, salt)
    except ContractRevert as exc:
        return Judgement(finding, REFUSED, str(exc))
    (event,) = c.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    args = event["args"]
    return Judgement(
        finding, SLASHED, f"{Fraud(args['fraud']).name.lower()} proven",
        int(args["slashedWei"]), int(args["bountyWei"]), receipt["transactionHash"].hex(),
    )  # fmt: skip


def _judged_before(c: Contracts, proof: FraudProof) -> str:
    """Why the chain has judged this fraud already, or ""."""
    if proof.fraud == Fraud.EQUIVOCATION:
        status = c.registry.functions.bondOf(proof.accused).call()[2]
        return "its signer is slashed" if status == _STATUS_SLASHED else ""
    cert = CertRef(*proof.args[0])  # type: ignore[misc]
    stored = c.ledger.functions.certificateCommitment(cert.runId, cert.epoch, cert.dataNode).call()
    return "" if bytes(stored) == cert.commitment() else "its certificate is voided"


def salt_of(challenger: Sender, proof: FraudProof) -> bytes:
    """The commitment's salt: from the challenger's key and the proof, so a run again finds its
    own commitment; random for an account the chain unlocks (its key is not here)."""
    if challenger.account is None:
        return secrets.token_bytes(32)
    return keccak256(b"gwtf challenge salt" + bytes(challenger.account.key) + proof.proof_hash)
