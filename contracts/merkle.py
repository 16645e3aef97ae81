"""Merkle trees over 32-byte leaves, verified on chain by OpenZeppelin's MerkleProof.

Owns tree construction, proofs and verification with OpenZeppelin's rule for inner nodes: the
commutative keccak256 of the sorted pair, so a proof is a plain list of sibling hashes and needs
no left/right flags. Leaves keep the order given (a receipt's index is committed inside its leaf,
see ``contracts.encoding.receipt_leaf``); an odd node at the end of a level is promoted unchanged.
Pure: no chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eth_utils.crypto import keccak

from gwtf.errors import ProtocolError

HASH_BYTES = 32
# A proof longer than this would describe a tree of more than 2**64 leaves.
MAX_PROOF_LENGTH = 64


def hash_pair(a: bytes, b: bytes) -> bytes:
    """OpenZeppelin's Hashes.commutativeKeccak256: keccak256 of the sorted pair."""
    return keccak(a + b) if a < b else keccak(b + a)


@dataclass(frozen=True)
class MerkleTree:
    """All levels of a tree; ``levels[0]`` are the leaves, ``levels[-1]`` is ``[root]``."""

    levels: tuple[tuple[bytes, ...], ...]

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    @property
    def leaf_count(self) -> int:
        return len(self.levels[0])

    def proof(self, index: int) -> list[bytes]:
        """The sibling hashes from leaf ``index`` up to the root."""
        if not 0 <= index < self.leaf_count:
            raise ProtocolError(f"leaf index {index} is outside a tree of {self.leaf_count} leaves")
        path: list[bytes] = []
        position = index
        for level in self.levels[:-1]:
            sibling = position ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            position //= 2
        return path


def build_tree(leaves: Sequence[bytes]) -> MerkleTree:
    """Builds the tree over ``leaves`` in the order given (at least one leaf, 32 bytes each)."""
    if not leaves:
        raise ProtocolError("cannot build a Merkle tree without leaves")
    for leaf in leaves:
        if len(leaf) != HASH_BYTES:
            raise ProtocolError(f"a Merkle leaf must be {HASH_BYTES} bytes, got {len(leaf)}")
    levels = [tuple(leaves)]
    while len(levels[-1]) > 1:
        below = levels[-1]
        above = [hash_pair(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
        if len(below) % 2:
            above.append(below[-1])
        levels.append(tuple(above))
    return MerkleTree(tuple(levels))


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
