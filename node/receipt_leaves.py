"""Leaf hashes of a whole epoch's receipts at once, for nodes with very many hops per epoch.

``contracts.encoding.receipt_leaf`` is the reference rule, one receipt at a time through eth-abi.
A node that did 100,000 hops in an epoch hashes them all before submitting its root, so this
module computes the same bytes with the encoding's constant parts (type hash, domain separator)
hoisted out of the loop and every field packed directly as its 32-byte ABI word. All fields of
``HopReceipt`` are static ABI types, so ``abi.encode`` is exactly the concatenation of 32-byte
words; tests/node/test_receipt_leaves.py checks equality with the reference on random receipts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eth_hash.auto import keccak

from contracts.encoding import HOP_RECEIPT_TYPE, Eip712Domain
from contracts.epoch_tree import SignedReceipt

WORD = 32
_TYPE_HASH = keccak(HOP_RECEIPT_TYPE.encode())


def _uint(value: int) -> bytes:
    return value.to_bytes(WORD, "big")


def _address(value: str) -> bytes:
    return bytes(12) + bytes.fromhex(value[2:])


def receipt_leaves(
    entries: Sequence[SignedReceipt], domain: Eip712Domain, units_before: Iterable[int]
) -> list[bytes]:
    """Leaf ``i`` for ``entries[i]`` at index ``i`` with prefix sum ``units_before[i]``;
    byte-identical to ``receipt_leaf`` (receipts were validated when they were constructed)."""
    prefix = b"\x19\x01" + domain.separator()
    leaves: list[bytes] = []
    for index, (entry, before) in enumerate(zip(entries, units_before, strict=True)):
        r = entry.receipt
        struct_hash = keccak(
            b"".join(
                (
                    _TYPE_HASH,
                    _uint(r.runId),
                    _uint(r.epoch),
                    _uint(r.iteration),
                    _uint(r.microbatchId),
                    _uint(r.stage),
                    _uint(r.direction),
                    _uint(r.attempt),
                    _address(r.worker),
                    _address(r.counterparty),
                    r.inputDigest,
                    r.outputDigest,
                    _uint(r.units),
                )
            )
        )
        digest = keccak(prefix + struct_hash)
        inner = keccak(digest + _uint(index) + _uint(before) + keccak(entry.counterparty_signature))
        leaves.append(keccak(inner))
    return leaves


def honest_prefix_sums(entries: Sequence[SignedReceipt]) -> list[int]:
    """``unitsBefore`` of each leaf in an honest tree: the running sum of earlier units."""
    sums: list[int] = []
    running = 0
    for entry in entries:
        sums.append(running)
        running += entry.receipt.units
    return sums
