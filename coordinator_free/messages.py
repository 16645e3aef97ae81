"""The wire messages of the flow protocol and their versioned, size-bounded binary encoding.

Each message is a frozen dataclass. On the wire a message is

    version (u8) | type id (u8) | fields in declaration order

with big-endian fixed-width numbers and explicit lengths: ``str`` is u16 length + UTF-8 (at most
``MAX_ID_BYTES``), ``int`` is i64, ``float`` is f64 (no NaN), ``bool`` is u8 0/1, ``bytes`` is
u16 length + bytes (at most ``MAX_BLOB_BYTES``), and a tuple is u16 count + items (at most
``MAX_ITEMS``). A whole message is at most ``MAX_MESSAGE_BYTES``. ``decode`` raises
``WireFormatError`` for any bytes that are not exactly one valid message, and nothing else.

Slots are hop-local: a node numbers its outgoing flow slots itself, and its downstream peer knows
the flow as (that node, slot). Data-plane messages (acknowledgements, probes) live here too so the
live node speaks one protocol: ``/gwtf/flow/1.0.0``.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from coordinator_free.flow_errors import WireFormatError

PROTOCOL_ID = "/gwtf/flow/1.0.0"
WIRE_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
MAX_ID_BYTES = 128
MAX_BLOB_BYTES = 256
MAX_ITEMS = 256

FORWARD = 0
BACKWARD = 1


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One matched flow slot of a node, as shown to same-stage peers for annealing moves."""

    slot: int
    flow_id: str
    upstream: str
    next_hop: str
    prefix_cost_ms: float  # source -> this node, including the edge into this node
    edge_in_ms: float  # the edge upstream -> this node
    edge_out_ms: float  # the edge this node -> next hop
    suffix_cost_ms: float  # next hop -> sink


@dataclass(frozen=True, slots=True)
class EdgeEntry:
    """A node's current cost estimate of the edge to one neighbour."""

    peer: str
    cost_ms: float


@dataclass(frozen=True, slots=True)
class Hello:
    """Introduction and refresh: who I am, my stage and what I can carry."""

    TYPE_ID: ClassVar[int] = 1
    role: str  # "data" or "relay"
    stage: int
    stages: int
    capacity: int
    spare: int
    flows: int
    compute_ms: float
    boot_id: int  # changes when the node restarts: what it carried before is gone
    wants_reply: bool  # an introduction (answer with yours), not an answer


@dataclass(frozen=True, slots=True)
class CostAdvert:
    """Upstream: my cheapest cost to a sink through next-stage peers with spare capacity."""

    TYPE_ID: ClassVar[int] = 2
    cost_to_sink_ms: float
    spare: int


@dataclass(frozen=True, slots=True)
class FlowRequest:
    """Downstream: please carry my flow slot ``slot``."""

    TYPE_ID: ClassVar[int] = 3
    slot: int
    flow_id: str
    path: tuple[str, ...]  # source ... sender
    prefix_cost_ms: float  # source -> receiver, including the sender's edge estimate


@dataclass(frozen=True, slots=True)
class FlowAccept:
    TYPE_ID: ClassVar[int] = 4
    slot: int
    suffix_cost_ms: float  # receiver's cost to a sink for this flow (inf until known)


@dataclass(frozen=True, slots=True)
class FlowReject:
    TYPE_ID: ClassVar[int] = 5
    slot: int
    spare: int


@dataclass(frozen=True, slots=True)
class FlowCancel:
    """Downstream: the flow in my slot is gone; release it and cancel onwards."""

    TYPE_ID: ClassVar[int] = 6
    slot: int


@dataclass(frozen=True, slots=True)
class PushBack:
    """Upstream: I cannot forward your slot; route it elsewhere."""

    TYPE_ID: ClassVar[int] = 7
    slot: int


@dataclass(frozen=True, slots=True)
class FlowCost:
    """Upstream: my cost to a sink for your slot changed."""

    TYPE_ID: ClassVar[int] = 8
    slot: int
    suffix_cost_ms: float


@dataclass(frozen=True, slots=True)
class PathUpdate:
    """Downstream: the part of the flow before you changed."""

    TYPE_ID: ClassVar[int] = 9
    slot: int
    flow_id: str
    path: tuple[str, ...]
    prefix_cost_ms: float


@dataclass(frozen=True, slots=True)
class Rebind:
    """Downstream, from the current upstream: slot ``old_slot`` now comes from another node."""

    TYPE_ID: ClassVar[int] = 10
    old_slot: int
    new_upstream: str
    new_slot: int
    flow_id: str
    path: tuple[str, ...]
    prefix_cost_ms: float


@dataclass(frozen=True, slots=True)
class Redirect:
    """Upstream, from the current next hop: your slot now goes to ``new_next``."""

    TYPE_ID: ClassVar[int] = 11
    slot: int
    new_next: str


@dataclass(frozen=True, slots=True)
class TableExchange:
    """Same stage: my matched flows and my edge estimates, for annealing moves."""

    TYPE_ID: ClassVar[int] = 12
    spare: int
    entries: tuple[TableEntry, ...]
    next_edges: tuple[EdgeEntry, ...]


@dataclass(frozen=True, slots=True)
class TableRequest:
    """Same stage: send me your table (I am about to try an annealing move)."""

    TYPE_ID: ClassVar[int] = 27


@dataclass(frozen=True, slots=True)
class SwapProposal:
    """Same stage: exchange the next hops (and the rest of the paths) of two flows."""

    TYPE_ID: ClassVar[int] = 13
    proposer_slot: int
    proposer_next: str
    target_slot: int
    target_next: str
    flow_id: str
    path: tuple[str, ...]
    prefix_cost_ms: float
    suffix_cost_ms: float


@dataclass(frozen=True, slots=True)
class SwapAccept:
    TYPE_ID: ClassVar[int] = 14
    proposer_slot: int
    target_slot: int
    flow_id: str
    path: tuple[str, ...]
    prefix_cost_ms: float
    suffix_cost_ms: float


@dataclass(frozen=True, slots=True)
class SwapReject:
    TYPE_ID: ClassVar[int] = 15
    proposer_slot: int


@dataclass(frozen=True, slots=True)
class TakeOverRequest:
    """Same stage: hand me your flow ``target_slot``; I will carry it as my ``new_slot``."""

    TYPE_ID: ClassVar[int] = 16
    target_slot: int
    new_slot: int


@dataclass(frozen=True, slots=True)
class TakeOverGrant:
    TYPE_ID: ClassVar[int] = 17
    target_slot: int
    new_slot: int
    upstream: str
    upstream_slot: int
    next_hop: str
    flow_id: str
    path: tuple[str, ...]  # source ... upstream
    upstream_prefix_cost_ms: float  # source -> upstream
    suffix_cost_ms: float


@dataclass(frozen=True, slots=True)
class TakeOverDeny:
    TYPE_ID: ClassVar[int] = 18
    target_slot: int
    new_slot: int


@dataclass(frozen=True, slots=True)
class PathReport:
    """Sink to source: the whole path of your flow and its cost."""

    TYPE_ID: ClassVar[int] = 19
    flow_id: str
    path: tuple[str, ...]
    cost_ms: float


@dataclass(frozen=True, slots=True)
class Ping:
    TYPE_ID: ClassVar[int] = 20
    nonce: int


@dataclass(frozen=True, slots=True)
class Pong:
    TYPE_ID: ClassVar[int] = 21
    nonce: int


@dataclass(frozen=True, slots=True)
class Goodbye:
    """I am leaving; forget me."""

    TYPE_ID: ClassVar[int] = 22


@dataclass(frozen=True, slots=True)
class SlotList:
    """To an upstream peer: the slots of yours I carry (anti-entropy, and a flow heartbeat)."""

    TYPE_ID: ClassVar[int] = 26
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HopAck:
    """Data plane: a hop's output arrived; digest of the tensor, and which attempt it was."""

    TYPE_ID: ClassVar[int] = 23
    microbatch_id: str
    stage: int
    direction: int  # FORWARD or BACKWARD
    attempt: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class Probe:
    """Data plane: are you alive, and do you still hold the buffers of this microbatch?"""

    TYPE_ID: ClassVar[int] = 24
    nonce: int
    microbatch_id: str


@dataclass(frozen=True, slots=True)
class ProbeReply:
    TYPE_ID: ClassVar[int] = 25
    nonce: int
    microbatch_id: str
    has_buffers: bool


Message = (
    Hello
    | CostAdvert
    | FlowRequest
    | FlowAccept
    | FlowReject
    | FlowCancel
    | PushBack
    | FlowCost
    | PathUpdate
    | Rebind
    | Redirect
    | TableExchange
    | TableRequest
    | SwapProposal
    | SwapAccept
    | SwapReject
    | TakeOverRequest
    | TakeOverGrant
    | TakeOverDeny
    | PathReport
    | Ping
    | Pong
    | Goodbye
    | SlotList
    | HopAck
    | Probe
    | ProbeReply
)

MESSAGE_TYPES: tuple[type[Any], ...] = typing.get_args(Message)


# ---- the field schema, derived once from the dataclasses' type hints --------------------------

_Kind = str | tuple[str, Any]  # "str" | "int" | ... | ("tuple", item kind) | ("record", cls)


def _kind_of(hint: Any) -> _Kind:
    if hint in (str, int, float, bool, bytes):
        return str(hint.__name__)
    if typing.get_origin(hint) is tuple:
        return ("tuple", _kind_of(typing.get_args(hint)[0]))
    if dataclasses.is_dataclass(hint):
        return ("record", hint)
    raise TypeError(f"unsupported wire field type {hint!r}")


def _schema(cls: type[Any]) -> tuple[tuple[str, _Kind], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _kind_of(hints[f.name])) for f in dataclasses.fields(cls))


_SCHEMAS: dict[type[Any], tuple[tuple[str, _Kind], ...]] = {}
_BY_TYPE_ID: dict[int, type[Any]] = {}
for _cls in MESSAGE_TYPES:
    _BY_TYPE_ID[_cls.TYPE_ID] = _cls
    _SCHEMAS[_cls] = _schema(_cls)
for _rec in (TableEntry, EdgeEntry):
    _SCHEMAS[_rec] = _schema(_rec)

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


# ---- encode ------------------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """The wire bytes of ``message``; raises WireFormatError if a field is out of bounds."""
    out = bytearray(_U8.pack(WIRE_VERSION) + _U8.pack(message.TYPE_ID))
    _encode_record(out, message)
    if len(out) > MAX_MESSAGE_BYTES:
        raise WireFormatError(
            f"{type(message).__name__} encodes to {len(out)} bytes, over {MAX_MESSAGE_BYTES}; "
            "send fewer table entries"
        )
    return bytes(out)


def _encode_record(out: bytearray, record: Any) -> None:
    for name, kind in _SCHEMAS[type(record)]:
        _encode_value(out, kind, getattr(record, name), name)


def _encode_value(out: bytearray, kind: _Kind, value: Any, name: str) -> None:
    if kind == "str":
        raw = value.encode("utf-8")
        _check_len(name, len(raw), MAX_ID_BYTES)
        out += _U16.pack(len(raw)) + raw
    elif kind == "bytes":
        _check_len(name, len(value), MAX_BLOB_BYTES)
        out += _U16.pack(len(value)) + bytes(value)
    elif kind == "bool":
        out += _U8.pack(1 if value else 0)
    elif kind == "int":
        if not -(2**63) <= value < 2**63:
            raise WireFormatError(f"field {name} = {value} does not fit in 64 bits; send less")
        out += _I64.pack(value)
    elif kind == "float":
        if math.isnan(value):
            raise WireFormatError(f"field {name} is NaN; send a number or inf")
        out += _F64.pack(value)
    elif isinstance(kind, tuple) and kind[0] == "tuple":
        _check_len(name, len(value), MAX_ITEMS)
        out += _U16.pack(len(value))
        for item in value:
            _encode_value(out, kind[1], item, name)
    elif isinstance(kind, tuple) and kind[0] == "record":
        _encode_record(out, value)
    else:  # pragma: no cover - the schema is built from a closed set of kinds
        raise AssertionError(kind)


def _check_len(name: str, length: int, limit: int) -> None:
    if length > limit:
        raise WireFormatError(f"field {name} has {length} items/bytes, over {limit}; send less")


def encoded_size(message: Message) -> int:
    """``len(encode(message))`` without building the bytes (what a simulator charges a link)."""
    fixed, variable = _SIZE_PLANS[type(message)]
    if not variable:
        return 2 + fixed
    return 2 + _record_size(message)


def _record_size(record: Any) -> int:
    fixed, variable = _SIZE_PLANS[type(record)]
    return fixed + sum(_value_size(kind, getattr(record, name)) for name, kind in variable)


def _value_size(kind: _Kind, value: Any) -> int:
    if kind == "str":
        return 2 + (len(value) if value.isascii() else len(value.encode("utf-8")))
    if kind == "bytes":
        return 2 + len(value)
    if kind in ("int", "float"):
        return 8
    if kind == "bool":
        return 1
    if isinstance(kind, tuple) and kind[0] == "tuple":
        return 2 + sum(_value_size(kind[1], item) for item in value)
    return _record_size(value)


def _size_plan(cls: type[Any]) -> tuple[int, tuple[tuple[str, _Kind], ...]]:
    fixed_width = {"int": 8, "float": 8, "bool": 1}
    fixed = sum(fixed_width.get(kind, 0) for _, kind in _SCHEMAS[cls] if isinstance(kind, str))
    variable = tuple(
        (n, k) for n, k in _SCHEMAS[cls] if not (isinstance(k, str) and k in fixed_width)
    )
    return fixed, variable


_SIZE_PLANS = {cls: _size_plan(cls) for cls in _SCHEMAS}


# ---- decode ------------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise WireFormatError("message is truncated; the peer sent an incomplete message")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> Any:
        return fmt.unpack(self.take(fmt.size))[0]


def decode(data: bytes) -> Message:
    """The message in ``data``; raises WireFormatError (and nothing else) for any invalid bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError(f"expected bytes, got {type(data).__name__}")
    raw = bytes(data)
    if len(raw) > MAX_MESSAGE_BYTES:
        raise WireFormatError(f"message of {len(raw)} bytes is over {MAX_MESSAGE_BYTES}; dropped")
    reader = _Reader(raw)
    version = reader.unpack(_U8)
    if version != WIRE_VERSION:
        raise WireFormatError(f"wire version {version} is not {WIRE_VERSION}; upgrade the peer")
    type_id = reader.unpack(_U8)
    cls = _BY_TYPE_ID.get(type_id)
    if cls is None:
        raise WireFormatError(f"unknown message type {type_id}; the peer speaks another protocol")
    message: Message = _decode_record(reader, cls)
    if reader.pos != len(raw):
        raise WireFormatError(f"{len(raw) - reader.pos} trailing bytes after {cls.__name__}")
    return message


def _decode_record(reader: _Reader, cls: type[Any]) -> Any:
    values = {name: _decode_value(reader, kind) for name, kind in _SCHEMAS[cls]}
    return cls(**values)


def _decode_value(reader: _Reader, kind: _Kind) -> Any:
    if kind == "str":
        length = reader.unpack(_U16)
        if length > MAX_ID_BYTES:
            raise WireFormatError(f"string of {length} bytes is over {MAX_ID_BYTES}")
        try:
            return reader.take(length).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireFormatError("string field is not UTF-8") from exc
    if kind == "bytes":
        length = reader.unpack(_U16)
        if length > MAX_BLOB_BYTES:
            raise WireFormatError(f"byte field of {length} bytes is over {MAX_BLOB_BYTES}")
        return reader.take(length)
    if kind == "bool":
        flag = reader.unpack(_U8)
        if flag > 1:
            raise WireFormatError(f"boolean field holds {flag}, not 0 or 1")
        return flag == 1
    if kind == "int":
        return reader.unpack(_I64)
    if kind == "float":
        number = reader.unpack(_F64)
        if math.isnan(number):
            raise WireFormatError("number field is NaN")
        return number
    if isinstance(kind, tuple) and kind[0] == "tuple":
        count = reader.unpack(_U16)
        if count > MAX_ITEMS:
            raise WireFormatError(f"list of {count} items is over {MAX_ITEMS}")
        return tuple(_decode_value(reader, kind[1]) for _ in range(count))
    if isinstance(kind, tuple) and kind[0] == "record":
        return _decode_record(reader, kind[1])
    raise AssertionError(kind)  # pragma: no cover - closed set of kinds
