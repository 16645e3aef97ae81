"""The data-plane envelope of one hop: which microbatch, which attempt, where it has been.

A hop request is a header followed by one tensor frame (``gwtf.node.training.codec``):

    run_id u64 | epoch u64 | iteration u64 | microbatch_id u64 | attempt u16 | direction u8 |
    stage u16 | slot u32 | flags u8 | origin (u8 len + utf-8) | path count u8 |
    path ids (u8 len + utf-8)* | lender (u8 len + utf-8, only with FLAG_LENT) |
    try start u16 | try signature (65 bytes), only with FLAG_TRIED |
    input digest (32 bytes) | worker signature (65 bytes), only with FLAG_RECEIPTED

``stage`` is the stage the *receiver* computes: forward 1..S at relays and S+1 at the sink data
node (loss); backward S..1 at relays and 0 at the origin (embedding backward). ``path`` lists the
nodes that computed the forward so far, origin first, so a backward retraces it: the receiver of a
backward at stage k sends its gradient to ``path[k-1]``. ``slot`` is the sender's flow slot, which
the receiver's flow table maps to its own next hop. ``attempt`` grows with every re-send, so a
re-sent hop is a new attempt and never a second claim of the same work. A first hop a data node
sends on a flow another data node lent it (``lending.py``) names that ``lender``: the slot is
the lender's, and the stage-1 relay looks its flow up under the lender. Two kinds of node number
attempts without asking each other, so the space is split: the data node gives each restart or
repair of a microbatch a new block of ``ATTEMPT_BLOCK`` numbers (its n-th is ``n * 256``), and a
node re-sending a hop on its own takes the next number inside the block it received
(``resend_attempt``). A relay's re-send then never takes a number the data node hands out later
(a receipt's hop key must not be claimed by two workers).

Every forward carries its try's token (``try_token.py``): the origin's signature, under the run's
chain and WorkLedger, of the run, iteration, microbatch and the first attempt of the try
(``try_start``), which each node copies
onto the forwards it sends on; a receiver takes no forward without a valid one.

``epoch`` is the run's epoch the origin started the microbatch's iteration in; every receipt of
the microbatch's hops names it. A relay that computed the hop it sends names the digest of the
input it computed from (``ReceiptInput``), no signature: the receiver rebuilds the whole
receipt from the header, the two peers' ids, that digest and the frame, and both record it for
a batch signed later (``gwtf.node.receipts``).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace
from typing import Protocol

from libp2p.peer.id import ID

from gwtf.errors import ProtocolError

FORWARD = 0
BACKWARD = 1
#: The receiver recomputes a lost hop: it keeps the forward's state and sends nothing onward
#: (a backward repair: the gradient that stalled at the dead hop comes to it next).
FLAG_REPAIR = 1
#: The receiver recomputes a lost forward hop and sends its output on like any forward
#: (a forward repair: the node that held the output re-sent it past the dead hop).
FLAG_RESUME = 2
#: The header names a lender after its path: the data node whose flow slot ``slot`` is.
FLAG_LENT = 4
#: The hop has a receipt: its worker's input digest follows the header (``ReceiptInput``).
FLAG_RECEIPTED = 8
#: The receiver accumulates a backward that a dead replica of its stage had accumulated, keeps
#: the gradient for its input and sends nothing on (``gradient_redo.py``): no step of the
#: microbatch beyond it. Like a repair's, its receipt's worker is the receiver, which keeps the
#: output and names its digest in the ack (``exchange.py``).
FLAG_REDO = 16
#: The header carries its try's token (``try_start``, ``try_signature``) after the lender.
FLAG_TRIED = 32

ATTEMPT_BLOCK = 256

_FIXED = struct.Struct(">QQQQHBHIB")
_MAX_ID_BYTES = 96
_TRY_START = struct.Struct(">H")
TRY_SIGNATURE_BYTES = 65
MAX_PATH = 64


class HopFormatError(ProtocolError):
    """A hop request's header is malformed."""


@dataclass(frozen=True)
class HopHeader:
    run_id: int
    iteration: int
    microbatch_id: int
    attempt: int
    direction: int
    stage: int
    slot: int
    flags: int
    origin: str
    path: tuple[str, ...]
    lender: str = ""  # a first hop on a lent flow: whose slot ``slot`` is
    epoch: int = 0  # the run's epoch of the microbatch's iteration, set by its origin
    #: The try's token (``try_token.py``): its first attempt and its origin's signature of it;
    #: b"" for none.
    try_start: int = 0
    try_signature: bytes = b""

    @property
    def is_repair(self) -> bool:
        return bool(self.flags & FLAG_REPAIR)

    def onward(self, **changes: object) -> HopHeader:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ReceiptInput:
    """What a hop request carries of its receipt beyond the header: the digest of the input
    its worker computed from."""

    input_digest: bytes


def _pack_id(value: str) -> bytes:
    raw = value.encode()
    if not 0 < len(raw) <= _MAX_ID_BYTES:
        raise HopFormatError(f"peer id {value[:20]!r} is empty or over {_MAX_ID_BYTES} bytes")
    return bytes([len(raw)]) + raw


def encode_hop(header: HopHeader, frame: bytes, receipted: ReceiptInput | None = None) -> bytes:
    if header.direction not in (FORWARD, BACKWARD) or len(header.path) > MAX_PATH:
        raise HopFormatError("hop header with a bad direction or an over-long path")
    flags = header.flags | FLAG_LENT if header.lender else header.flags & ~FLAG_LENT
    flags = flags | FLAG_RECEIPTED if receipted is not None else flags & ~FLAG_RECEIPTED
    flags = flags | FLAG_TRIED if header.try_signature else flags & ~FLAG_TRIED
    fixed = _FIXED.pack(
        header.run_id,
        header.epoch,
        header.iteration,
        header.microbatch_id,
        header.attempt,
        header.direction,
        header.stage,
        header.slot,
        flags,
    )
    ids = _pack_id(header.origin) + bytes([len(header.path)])
    ids += b"".join(_pack_id(peer) for peer in header.path)
    if header.lender:
        ids += _pack_id(header.lender)
    if header.try_signature:
        if len(header.try_signature) != TRY_SIGNATURE_BYTES or not 0 <= header.try_start < 1 << 16:
            raise HopFormatError("a hop's try token is a u16 start and a 65-byte signature")
        ids += _TRY_START.pack(header.try_start) + header.try_signature
    if receipted is not None:
        if len(receipted.input_digest) != 32:
            raise HopFormatError("a hop's receipt input is a 32-byte digest")
        ids += receipted.input_digest
    return fixed + ids + frame


def decode_hop(data: bytes) -> tuple[HopHeader, bytes]:
    """Split a hop request into its header and the tensor frame behind it."""
    header, _, frame = decode_hop_request(data)
    return header, frame


def decode_hop_request(data: bytes) -> tuple[HopHeader, ReceiptInput | None, bytes]:
    """Split a hop request into its header, its receipt's input (if receipted) and the frame."""
    if len(data) < _FIXED.size + 2:
        raise HopFormatError("hop request shorter than its header")
    run_id, epoch, iteration, mb, attempt, direction, stage, slot, flags = _FIXED.unpack_from(data)
    if direction not in (FORWARD, BACKWARD):
        raise HopFormatError(f"hop direction {direction} is neither forward nor backward")
    pos = _FIXED.size

    def read_id() -> str:
        nonlocal pos
        length = data[pos] if pos < len(data) else 0
        raw = data[pos + 1 : pos + 1 + length]
        if not 0 < length <= _MAX_ID_BYTES or len(raw) != length:
            raise HopFormatError("hop header has a malformed peer id")
        pos += 1 + length
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise HopFormatError("hop header has a peer id that is not UTF-8") from exc

    origin = read_id()
    try:
        ID.from_base58(origin)  # every receipt of the hop names its origin's address
    except Exception as exc:  # the decoder's own errors: base58, multihash, lengths
        raise HopFormatError("hop header's origin is not a peer id") from exc
    if pos >= len(data):
        raise HopFormatError("hop header ends before its path")
    count = data[pos]
    pos += 1
    if count > MAX_PATH:
        raise HopFormatError(f"hop path of {count} nodes, limit {MAX_PATH}")
    path = tuple(read_id() for _ in range(count))
    lender = read_id() if flags & FLAG_LENT else ""
    try_start, try_signature = 0, b""
    if flags & FLAG_TRIED:
        if len(data) < pos + _TRY_START.size + TRY_SIGNATURE_BYTES:
            raise HopFormatError("hop request ends inside its try token")
        (try_start,) = _TRY_START.unpack_from(data, pos)
        pos += _TRY_START.size
        try_signature = data[pos : pos + TRY_SIGNATURE_BYTES]
        pos += TRY_SIGNATURE_BYTES
    receipted = None
    if flags & FLAG_RECEIPTED:
        if len(data) < pos + 32:
            raise HopFormatError("hop request ends inside its receipt")
        receipted = ReceiptInput(data[pos : pos + 32])
        pos += 32
    flags &= ~(FLAG_LENT | FLAG_RECEIPTED | FLAG_TRIED)  # said by the fields they announce
    header = HopHeader(
        run_id, iteration, mb, attempt, direction, stage, slot, flags, origin, path, lender, epoch,
        try_start, try_signature,
    )  # fmt: skip
    return header, receipted, data[pos:]


def frame_digest(frame: bytes) -> bytes:
    """SHA-256 of a tensor frame: what an acknowledgement (and later a receipt) names."""
    return hashlib.sha256(frame).digest()


class TakeAttempt(Protocol):
    """The data node's next attempt number for a microbatch of the iteration under way, by
    (iteration, microbatch id): each call hands out a new block (``origin_attempt``), never one
    handed out before. May write the attempt journal first (``AttemptBlock``); raises
    ``ProtocolError`` once the microbatch's numbers run out."""

    def __call__(self, key: tuple[int, int], /) -> int: ...


class AttemptBlock(Protocol):
    """The attempt block of a microbatch's ``tries``-th try in ``iteration``: ``tries``,
    unless earlier processes of this node may have used those blocks
    (``resume_points.AttemptJournal``, which writes its journal durably first, so it may block
    on the disk and raises ``OSError`` when it cannot write)."""

    def __call__(self, iteration: int, tries: int, /) -> int: ...


def origin_attempt(tries: int) -> int:
    """The data node's attempt number for its ``tries``-th try of a microbatch (0, 256, ...)."""
    if not 0 <= tries < (1 << 16) // ATTEMPT_BLOCK:
        raise ProtocolError(f"microbatch tried {tries} times; no attempt numbers left")
    return tries * ATTEMPT_BLOCK


def resend_attempt(attempt: int) -> int:
    """The attempt number of a hop a node re-sends on its own: the next one in its block."""
    if attempt % ATTEMPT_BLOCK == ATTEMPT_BLOCK - 1:
        raise ProtocolError(f"hop re-sent {ATTEMPT_BLOCK - 1} times within one attempt; giving up")
    return attempt + 1
