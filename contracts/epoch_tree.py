"""A node's epoch tree: its countersigned receipts in order, with prefix sums, as one Merkle root.

Owns the rule an honest tree follows and the ledger's fraud proofs check: leaf ``i`` commits to
receipt ``i``, its countersignature, ``index = i`` and ``unitsBefore`` = the sum of the units of
receipts ``0..i-1``; the claim is ``(root, count, units)`` with ``units`` the total. Pure: no chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.encoding import ClaimRef, Eip712Domain, HopReceipt, LeafProof, receipt_leaf
from contracts.merkle import MerkleTree, build_tree
from gwtf.errors import ProtocolError


@dataclass(frozen=True)
class SignedReceipt:
    """A receipt with the counterparty's EIP-712 signature of it."""

    receipt: HopReceipt
    counterparty_signature: bytes


@dataclass(frozen=True)
class EpochTree:
    """The receipts of one node for one epoch and the Merkle tree over their leaves."""

    entries: tuple[SignedReceipt, ...]
    units_before: tuple[int, ...]
    tree: MerkleTree

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def count(self) -> int:
        return len(self.entries)

    @property
    def units(self) -> int:
        return self.units_before[-1] + self.entries[-1].receipt.units

    def claim(self, run_id: int, epoch: int, node: str) -> ClaimRef:
        """The claim this tree backs."""
        return ClaimRef(run_id, epoch, node, self.root, self.count, self.units)

    def leaf_proof(self, index: int) -> LeafProof:
        """Leaf ``index`` with its proof, ready for a reveal or a fraud proof."""
        entry = self.entries[index]
        return LeafProof(
            receipt=entry.receipt,
            index=index,
            unitsBefore=self.units_before[index],
            counterpartySignature=entry.counterparty_signature,
            proof=tuple(self.tree.proof(index)),
        )


def build_epoch_tree(
    entries: Sequence[SignedReceipt],
    domain: Eip712Domain,
    units_before: Sequence[int] | None = None,
) -> EpochTree:
    """Builds the tree of ``entries`` in the order given (leaf i = entry i). ``units_before``
    overrides the prefix sums (an auditor rebuilding a dishonest tree); by default they are the
    honest running sums."""
    if not entries:
        raise ProtocolError("an epoch tree needs at least one receipt")
    if units_before is None:
        sums: list[int] = []
        running = 0
        for entry in entries:
            sums.append(running)
            running += entry.receipt.units
        units_before = sums
    if len(units_before) != len(entries):
        raise ProtocolError("units_before must hold one prefix sum per receipt")
    leaves = [
        receipt_leaf(entry.receipt, domain, index, before, entry.counterparty_signature)
        for index, (entry, before) in enumerate(zip(entries, units_before, strict=True))
    ]
    return EpochTree(tuple(entries), tuple(units_before), build_tree(leaves))
