"""Fraud proofs as `Disputes.sol` takes them: their arguments, their hash and the commitment.

A challenger commits to ``keccak256(abi.encode(challenger, salt, proofHash))`` and reveals the
proof a block later; ``proofHash`` is the hash of the proof's arguments with its kind, computed
here exactly as the contract computes it, so an auditor, the node and the tests build proofs one
way. Pure: no chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from eth_abi.abi import encode

from gwtf.contracts.certificate_tree import LeafProof, SignedReceipt, SpanProof
from gwtf.contracts.encoding import (
    CERTIFIED_HOP_ABI_TYPES,
    HOP_RECEIPT_ABI_TYPES,
    CertRef,
    HopReceipt,
)
from gwtf.contracts.keccak import keccak256

CERT_REF_ABI = "(uint256,uint64,address,bytes32,uint64,uint64,bytes32)"
SPAN_RANGE_ABI = "(address,uint64,uint64,uint64,uint64)"
CERTIFIED_HOP_ABI = "(" + ",".join(CERTIFIED_HOP_ABI_TYPES) + ")"
HOP_RECEIPT_ABI = "(" + ",".join(HOP_RECEIPT_ABI_TYPES) + ")"
BATCH_SEAL_ABI = "(bytes32[],bytes,bytes)"
BATCH_SIGNATURE_ABI = "(bytes32[],bytes)"


class Fraud(IntEnum):
    """Disputes.Fraud: what a proof shows."""

    INVALID_HOP = 0
    BAD_TOTALS = 1
    BAD_SEQUENCE = 2
    EQUIVOCATION = 3
    WRONG_TENSOR = 4
    BAD_SPAN = 5


FUNCTIONS = {
    Fraud.INVALID_HOP: "proveInvalidHop",
    Fraud.BAD_TOTALS: "proveBadTotals",
    Fraud.BAD_SEQUENCE: "proveBadSequence",
    Fraud.EQUIVOCATION: "proveEquivocation",
    Fraud.WRONG_TENSOR: "openTensorDispute",
    Fraud.BAD_SPAN: "proveBadSpan",
}

#: The one kind the chain does not judge alone: revealing it opens a tensor dispute, with the
#: contract's bond and the court's first jury fees, that a drawn jury rules on.
NEEDS_JURY = frozenset({Fraud.WRONG_TENSOR})


@dataclass(frozen=True)
class FraudProof:
    """One proof against ``accused`` for (``run_id``, ``epoch``): the contract function's
    arguments before the salt, and the hash the commitment binds."""

    fraud: Fraud
    accused: str
    run_id: int
    epoch: int
    args: tuple[object, ...]
    proof_hash: bytes

    @property
    def function(self) -> str:
        return FUNCTIONS[self.fraud]


def draw_salt_hash(draw_salt: bytes) -> bytes:
    """What a tensor dispute commits of the challenger's share of the jury's randomness
    (Court.revealSalt checks keccak256(abi.encode(salt)))."""
    return keccak256(encode(["bytes32"], [draw_salt]))


def commitment_of(challenger: str, salt: bytes, proof_hash: bytes) -> bytes:
    """Disputes.commitmentOf: what the challenger commits before revealing the proof."""
    return keccak256(encode(["address", "bytes32", "bytes32"], [challenger, salt, proof_hash]))


def invalid_hop(cert: CertRef, leaf: LeafProof, entry: SignedReceipt) -> FraudProof:
    """A certified hop that breaks a rule, with the receipt and batch seal behind the leaf."""
    hop, proof = leaf.as_args()
    args = (cert.as_tuple(), hop, proof, entry.receipt.as_tuple(), entry.seal())
    types = [CERT_REF_ABI, CERTIFIED_HOP_ABI, "bytes32[]", HOP_RECEIPT_ABI, BATCH_SEAL_ABI]
    return _proof(Fraud.INVALID_HOP, cert.dataNode, cert, args, types)


def bad_totals(cert: CertRef, leaf: LeafProof) -> FraudProof:
    """A leaf that contradicts the certificate's count or units."""
    hop, proof = leaf.as_args()
    return _proof(
        Fraud.BAD_TOTALS, cert.dataNode, cert, (cert.as_tuple(), hop, proof),
        [CERT_REF_ABI, CERTIFIED_HOP_ABI, "bytes32[]"],
    )  # fmt: skip


def bad_sequence(cert: CertRef, leaf: LeafProof, next_leaf: LeafProof) -> FraudProof:
    """Two leaves with one index, or adjacent leaves out of order or whose sums do not chain."""
    hop, proof = leaf.as_args()
    next_hop, next_proof = next_leaf.as_args()
    args = (cert.as_tuple(), hop, proof, next_hop, next_proof)
    types = [CERT_REF_ABI, CERTIFIED_HOP_ABI, "bytes32[]", CERTIFIED_HOP_ABI, "bytes32[]"]
    return _proof(Fraud.BAD_SEQUENCE, cert.dataNode, cert, args, types)


def bad_span(cert: CertRef, span: SpanProof, leaf: LeafProof) -> FraudProof:
    """A span committed with ``cert`` and a leaf of the tree at one of its indices that
    contradicts it (``certificate_tree.span_disagreement``)."""
    span_args, range_proof = span.as_args()
    hop, proof = leaf.as_args()
    args = (cert.as_tuple(), span_args, range_proof, hop, proof)
    types = [CERT_REF_ABI, SPAN_RANGE_ABI, "bytes32[]", CERTIFIED_HOP_ABI, "bytes32[]"]
    return _proof(Fraud.BAD_SPAN, cert.dataNode, cert, args, types)


def equivocation(
    signer: str,
    first: HopReceipt,
    first_signature: bytes,
    second: HopReceipt,
    second_signature: bytes,
    first_proof: Sequence[bytes] = (),
    second_proof: Sequence[bytes] = (),
) -> FraudProof:
    """Two different receipts with one hop key, both signed by ``signer`` in batches that hold
    them by ``first_proof`` and ``second_proof`` (batches of one by default)."""
    args = (
        first.as_tuple(), (list(first_proof), first_signature),
        second.as_tuple(), (list(second_proof), second_signature),
    )  # fmt: skip
    types = [HOP_RECEIPT_ABI, BATCH_SIGNATURE_ABI, HOP_RECEIPT_ABI, BATCH_SIGNATURE_ABI]
    proof_hash = keccak256(encode(["uint8", *types], [int(Fraud.EQUIVOCATION), *args]))
    return FraudProof(Fraud.EQUIVOCATION, signer, first.runId, first.epoch, args, proof_hash)


def wrong_tensor(cert: CertRef, leaf: LeafProof, entry: SignedReceipt) -> FraudProof:
    """A certified hop whose output is not what its worker's stage computes: opens a tensor
    dispute against the worker, with the receipt and the worker's signature of its batch behind
    the leaf."""
    hop, proof = leaf.as_args()
    worker_signed = (list(entry.proof), entry.worker_signature)
    args = (cert.as_tuple(), hop, proof, entry.receipt.as_tuple(), worker_signed)
    types = [CERT_REF_ABI, CERTIFIED_HOP_ABI, "bytes32[]", HOP_RECEIPT_ABI, BATCH_SIGNATURE_ABI]
    return _proof(Fraud.WRONG_TENSOR, entry.receipt.worker, cert, args, types)


def disputed_receipt_digest(proof: FraudProof) -> bytes:
    """The receipt digest a tensor dispute names (its leaf's)."""
    if proof.fraud != Fraud.WRONG_TENSOR:
        raise ValueError(f"a {proof.fraud.name} proof disputes no tensor")
    hop = proof.args[1]
    assert isinstance(hop, tuple)
    return bytes(hop[5])  # CertifiedHop.receiptDigest


def _proof(
    fraud: Fraud, accused: str, cert: CertRef, args: tuple[object, ...], types: list[str]
) -> FraudProof:
    proof_hash = keccak256(encode(["uint8", *types], [int(fraud), *args]))
    return FraudProof(fraud, accused, cert.runId, cert.epoch, args, proof_hash)


@dataclass(frozen=True)
class Conviction:
    """Disputes.convictions(node): who leads for a convicted node's bounty and when it is
    final. ``final_after`` is 0 for a node never convicted."""

    challenger: str
    order: int
    open_disputes: int
    final_after: int
    awarded: bool
    bounty_wei: int

    @classmethod
    def from_call(cls, values: tuple[object, ...]) -> Conviction:
        challenger, order, open_disputes, final_after, awarded, bounty_wei = values
        return cls(
            str(challenger), int(order), int(open_disputes),  # type: ignore[call-overload]
            int(final_after), bool(awarded), int(bounty_wei),  # type: ignore[call-overload]
        )  # fmt: skip

    @property
    def convicted(self) -> bool:
        return self.final_after != 0

    def is_final(self, block_number: int) -> bool:
        """Whether awardBounty succeeds in block ``block_number``."""
        return (
            self.convicted and not self.awarded and block_number > self.final_after
            and self.open_disputes == 0
        )  # fmt: skip

    def can_lead(self, order: int) -> bool:
        """Whether a proof committed with ``order`` would take the bounty's lead."""
        return not self.convicted or (not self.awarded and order < self.order)


def is_revealable(committed_at: int, block_number: int, window_blocks: int) -> bool:
    """Disputes' reveal rule: after the commitment's block, within ``window_blocks`` of it."""
    return committed_at != 0 and committed_at < block_number <= committed_at + window_blocks
