"""The bytes of receipts and certificate ranges between nodes.

A signed receipt is 323 fixed bytes (the receipt's fields in struct order, each at its
Solidity type's width, then the worker's and the counterparty's 65-byte signatures), then its
proof in the batch both signed (u8 length, at most ``MAX_PROOF`` 32-byte hashes as on chain;
none for a batch of one); a report is a u16 count and that many receipts. A worker's range of a
certificate is its first and last leaf (the seven ``CertifiedHop`` values, 180 bytes) each
with its Merkle proof (u8 length, 32-byte hashes). A page of a node's receipts
(``/gwtf/receipts/3.0.0``) is its total, offset and count, then that many receipts, each
followed by its leaf and proof in a page of a certificate. Every decoder checks sizes and field
ranges and raises ``ProtocolError``: a peer's bytes are never trusted.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from gwtf.contracts.certificate_tree import LeafProof, SignedReceipt, WorkerRange
from gwtf.contracts.encoding import (
    HOP_RECEIPT_FIELDS,
    SIGNATURE_BYTES,
    CertifiedHop,
    HopReceipt,
)
from gwtf.errors import ProtocolError


def _address(raw: bytes) -> str:
    return "0x" + raw.hex()


# Each Solidity type of a receipt's fields, packed big-endian: its struct code, and for the two
# that are not packed as they are, how a value goes to and comes from the wire (a uint256 is 32
# bytes, an address its 20).
_PACKED: Final = {"uint256": "32s", "uint64": "Q", "uint16": "H", "uint8": "B", "address": "20s",
                  "bytes32": "32s"}  # fmt: skip
_CONVERTED: Final[dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]]] = {
    "uint256": (lambda value: value.to_bytes(32, "big"), lambda raw: int.from_bytes(raw, "big")),
    "address": (lambda value: bytes.fromhex(value[2:]), _address),
}
_RECEIPT = struct.Struct(
    ">" + "".join(_PACKED[abi] for _, abi in HOP_RECEIPT_FIELDS) + f"{SIGNATURE_BYTES}s" * 2
)
_RECEIPT_VALUES: Final = operator.attrgetter(*(name for name, _ in HOP_RECEIPT_FIELDS))
# (position, to wire, from wire) of each converted field.
_CONVERSIONS: Final = tuple(
    (i, *_CONVERTED[abi]) for i, (_, abi) in enumerate(HOP_RECEIPT_FIELDS) if abi in _CONVERTED
)
RECEIPT_BYTES: Final = _RECEIPT.size
MAX_PROOF: Final = 64  # a tree of 2**64 leaves needs no more (the contracts' bound)
#: Hashes in the proof of a receipt in a batch this node builds: batches of up to 2**12. A
#: receipt's proof on the wire may be as long as the contracts take (``MAX_PROOF``).
MAX_BATCH_PROOF: Final = 12
#: The most bytes one receipt takes on the wire.
MAX_RECEIPT_BYTES: Final = RECEIPT_BYTES + 1 + 32 * MAX_PROOF
#: Receipts per report: a report of 512 is ~165 kB, within one request's bound.
MAX_REPORT: Final = 512
_COUNT = struct.Struct(">H")
_LEAF = struct.Struct(">QQ20sQ32s32s32s")


#: Receipts per page: a page of certified receipts with proofs of a 2**20-leaf tree is ~290 kB.
MAX_PAGE: Final = 256
_PAGE_HEAD = struct.Struct(">IIH?")  # total, offset, count, with leaves
#: The most bytes a page takes: every receipt with the longest proofs and a leaf.
MAX_PAGE_BYTES: Final = _PAGE_HEAD.size + MAX_PAGE * (
    MAX_RECEIPT_BYTES + _LEAF.size + 1 + 32 * MAX_PROOF
)


@dataclass(frozen=True)
class ReceiptPage:
    """A page of one kind of a node's receipts of an epoch, in its order: ``entries`` from
    ``offset`` of ``total``, and with a certificate's page each entry's leaf and proof."""

    total: int
    offset: int
    entries: tuple[SignedReceipt, ...]
    leaves: tuple[LeafProof, ...] = ()


def encode_receipts(entries: list[SignedReceipt]) -> bytes:
    if len(entries) > MAX_REPORT:
        raise ProtocolError(f"a report holds at most {MAX_REPORT} receipts, got {len(entries)}")
    return _COUNT.pack(len(entries)) + b"".join(_encode_receipt(e) for e in entries)


def _encode_receipt(e: SignedReceipt) -> bytes:
    r = e.receipt
    if len(e.proof) > MAX_PROOF:
        raise ProtocolError(f"a receipt's batch proof of {len(e.proof)} hashes is over {MAX_PROOF}")
    if len(e.worker_signature) != SIGNATURE_BYTES:
        raise ProtocolError("a receipt's worker signature must be 65 bytes")
    if len(e.counterparty_signature) != SIGNATURE_BYTES:
        raise ProtocolError("a receipt's countersignature must be 65 bytes")
    values = list(_RECEIPT_VALUES(r))
    for i, to_wire, _ in _CONVERSIONS:
        values[i] = to_wire(values[i])
    packed = _RECEIPT.pack(*values, e.worker_signature, e.counterparty_signature)
    return packed + bytes([len(e.proof)]) + b"".join(e.proof)


def decode_receipts(data: bytes) -> list[SignedReceipt]:
    if len(data) < _COUNT.size:
        raise ProtocolError("a receipt report shorter than its count")
    (count,) = _COUNT.unpack_from(data)
    if count > MAX_REPORT or len(data) > _COUNT.size + count * MAX_RECEIPT_BYTES:
        raise ProtocolError(f"a receipt report of {len(data)} bytes does not hold {count}")
    pos, entries = _COUNT.size, []
    for _ in range(count):
        entry, pos = _decode_receipt(data, pos)
        entries.append(entry)
    if pos != len(data):
        raise ProtocolError(f"a receipt report of {len(data)} bytes does not hold {count}")
    return entries


def _decode_receipt(data: bytes, pos: int) -> tuple[SignedReceipt, int]:
    """The receipt at ``pos`` and where the next begins."""
    if len(data) < pos + RECEIPT_BYTES + 1:
        raise ProtocolError("receipts end inside a receipt")
    *values, signature, counter = _RECEIPT.unpack_from(data, pos)
    for i, _, from_wire in _CONVERSIONS:
        values[i] = from_wire(values[i])
    pos += RECEIPT_BYTES
    length = data[pos]
    end = pos + 1 + 32 * length
    if length > MAX_PROOF or len(data) < end:
        raise ProtocolError("a receipt's batch proof is malformed")
    proof = tuple(data[pos + 1 + 32 * i : pos + 1 + 32 * (i + 1)] for i in range(length))
    # HopReceipt checks every field's range.
    return SignedReceipt(HopReceipt(*values), signature, counter, proof), end


def encode_page(page: ReceiptPage) -> bytes:
    count = len(page.entries)
    if count > MAX_PAGE or (page.leaves and len(page.leaves) != count):
        raise ProtocolError(f"a page holds at most {MAX_PAGE} receipts, all with leaves or none")
    out = [_PAGE_HEAD.pack(page.total, page.offset, count, bool(page.leaves))]
    for i, entry in enumerate(page.entries):
        out.append(_encode_receipt(entry))
        if page.leaves:
            out.append(_encode_leaf(page.leaves[i]))
    return b"".join(out)


def decode_page(data: bytes) -> ReceiptPage:
    if len(data) < _PAGE_HEAD.size:
        raise ProtocolError("a receipt page shorter than its head")
    total, offset, count, with_leaves = _PAGE_HEAD.unpack_from(data)
    if count > MAX_PAGE or offset + count > total:
        raise ProtocolError(f"a receipt page of {count} from {offset} of {total} is malformed")
    pos, entries, leaves = _PAGE_HEAD.size, [], []
    for _ in range(count):
        entry, pos = _decode_receipt(data, pos)
        entries.append(entry)
        if with_leaves:
            leaf, pos = _decode_leaf(data, pos)
            leaves.append(leaf)
    if pos != len(data):
        raise ProtocolError("a receipt page has trailing bytes")
    return ReceiptPage(total, offset, tuple(entries), tuple(leaves))


def _encode_leaf(proof: LeafProof) -> bytes:
    hop = proof.hop
    if len(proof.proof) > MAX_PROOF:
        raise ProtocolError(f"a Merkle proof of {len(proof.proof)} hashes is over {MAX_PROOF}")
    leaf = _LEAF.pack(
        hop.index, hop.unitsBefore, bytes.fromhex(hop.worker[2:]), hop.units, hop.hopKey,
        hop.receiptDigest, hop.signaturesHash,
    )  # fmt: skip
    return leaf + bytes([len(proof.proof)]) + b"".join(proof.proof)


def _decode_leaf(data: bytes, pos: int) -> tuple[LeafProof, int]:
    if len(data) < pos + _LEAF.size + 1:
        raise ProtocolError("a certificate range ends inside a leaf")
    index, before, worker, units, key, digest, signatures = _LEAF.unpack_from(data, pos)
    pos += _LEAF.size
    length = data[pos]
    pos += 1
    if length > MAX_PROOF or len(data) < pos + 32 * length:
        raise ProtocolError("a certificate range has a malformed Merkle proof")
    proof = tuple(data[pos + 32 * i : pos + 32 * (i + 1)] for i in range(length))
    hop = CertifiedHop(index, before, _address(worker), units, key, digest, signatures)
    return LeafProof(hop, proof), pos + 32 * length


def encode_range(found: WorkerRange | None) -> bytes:
    """A worker's range (or b"\\x00": the tree holds none of its hops)."""
    if found is None:
        return b"\x00"
    if len(found.range_proof) > MAX_PROOF:
        raise ProtocolError(f"a range proof of {len(found.range_proof)} hashes is over {MAX_PROOF}")
    return (
        b"\x01" + _encode_leaf(found.first) + _encode_leaf(found.last)
        + bytes([len(found.range_proof)]) + b"".join(found.range_proof)
    )  # fmt: skip


def decode_range(data: bytes) -> WorkerRange | None:
    if data == b"\x00":
        return None
    if not data or data[0] != 1:
        raise ProtocolError("a certificate range answer is malformed")
    first, pos = _decode_leaf(data, 1)
    last, pos = _decode_leaf(data, pos)
    if pos >= len(data) or data[pos] > MAX_PROOF:
        raise ProtocolError("a certificate range answer has a malformed range proof")
    length, pos = data[pos], pos + 1
    if len(data) != pos + 32 * length:
        raise ProtocolError("a certificate range answer's range proof has the wrong length")
    range_proof = tuple(data[pos + 32 * i : pos + 32 * (i + 1)] for i in range(length))
    return WorkerRange(first.hop.worker, first, last, range_proof)
