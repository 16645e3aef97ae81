"""Merkle trees laid out exactly as OpenZeppelin's StandardMerkleTree lays them out.

Owns tree construction, proofs and verification. The tree is a complete binary tree in one
array of ``2n - 1`` nodes: leaf ``i`` (in the order given, as ``sortLeaves: false`` keeps them)
sits at position ``2n - 2 - i`` and node ``k`` hashes its children ``2k + 1`` and ``2k + 2``
with OpenZeppelin's rule, the commutative keccak256 of the sorted pair, so a proof is a plain
list of sibling hashes and OpenZeppelin's MerkleProof verifies it on chain. Roots and proofs
equal those of the ``@openzeppelin/merkle-tree`` package (``tests/contracts/test_merkle.py``
checks them against it), so an auditor can use OpenZeppelin's own tools. Pure: no chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gwtf.contracts.keccak import keccak256 as keccak
from gwtf.errors import ProtocolError

HASH_BYTES = 32
# A proof longer than this would describe a tree of more than 2**64 leaves.
MAX_PROOF_LENGTH = 64


def hash_pair(a: bytes, b: bytes) -> bytes:
    """OpenZeppelin's Hashes.commutativeKeccak256: keccak256 of the sorted pair."""
    return keccak(a + b) if a < b else keccak(b + a)


@dataclass(frozen=True)
class MerkleTree:
    """The tree's nodes in OpenZeppelin's array layout; ``nodes[0]`` is the root."""

    nodes: tuple[bytes, ...]

    @property
    def root(self) -> bytes:
        return self.nodes[0]

    @property
    def leaf_count(self) -> int:
        return (len(self.nodes) + 1) // 2

    def leaf(self, index: int) -> bytes:
        """Leaf ``index`` (in the order the tree was built from)."""
        return self.nodes[self._position(index)]

    def proof(self, index: int) -> list[bytes]:
        """The sibling hashes from leaf ``index`` up to the root (OpenZeppelin's getProof)."""
        position = self._position(index)
        path: list[bytes] = []
        while position > 0:
            sibling = position + 1 if position % 2 else position - 1
            path.append(self.nodes[sibling])
            position = (position - 1) // 2
        return path

    def _position(self, index: int) -> int:
        if not 0 <= index < self.leaf_count:
            raise ProtocolError(f"leaf index {index} is outside a tree of {self.leaf_count} leaves")
        return len(self.nodes) - 1 - index


def build_tree(leaves: Sequence[bytes]) -> MerkleTree:
    """Builds the tree over ``leaves`` in the order given (at least one leaf, 32 bytes each)."""
    if not leaves:
        raise ProtocolError("cannot build a Merkle tree without leaves")
    for leaf in leaves:
        if len(leaf) != HASH_BYTES:
            raise ProtocolError(f"a Merkle leaf must be {HASH_BYTES} bytes, got {len(leaf)}")
    size = 2 * len(leaves) - 1
    nodes: list[bytes] = [b""] * size
    for index, leaf in enumerate(leaves):
        nodes[size - 1 - index] = leaf
    for position in range(size - 1 - len(leaves), -1, -1):
        nodes[position] = hash_pair(nodes[2 * position + 1], nodes[2 * position + 2])
    return MerkleTree(tuple(nodes))


def process_proof(proof: Sequence[bytes], leaf: bytes) -> bytes:
    """The root that ``proof`` leads to from ``leaf`` (OpenZeppelin's MerkleProof.processProof)."""
    if len(proof) > MAX_PROOF_LENGTH:
        raise ProtocolError(f"a Merkle proof of {len(proof)} hashes is longer than any tree here")
    computed = leaf
    for sibling in proof:
        if len(sibling) != HASH_BYTES:
            raise ProtocolError(f"a Merkle proof element must be {HASH_BYTES} bytes")
        computed = hash_pair(computed, sibling)
    return computed


def verify_proof(proof: Sequence[bytes], root: bytes, leaf: bytes) -> bool:
    """Whether ``leaf`` is in the tree with ``root`` according to ``proof``."""
    return process_proof(proof, leaf) == root
