"""The versioned, size-bounded binary encoding of the flow protocol's messages.

On the wire a message is ``version (u8) | type id (u8) | fields in declaration order`` (the
layout is stated in ``gwtf.coordinator_free.wire``). The field schema is derived once from the
message dataclasses' type hints. ``decode`` raises ``WireFormatError`` for any bytes that are not
exactly one valid message, and nothing else.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
import typing
from typing import Any

from gwtf.coordinator_free.flow_errors import WireFormatError
from gwtf.coordinator_free.wire.messages import (
    MAX_BLOB_BYTES,
    MAX_ID_BYTES,
    MAX_ITEMS,
    MAX_MESSAGE_BYTES,
    MESSAGE_TYPES,
    WIRE_VERSION,
    EdgeEntry,
    Message,
    TableEntry,
)

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
    return 2 + _SIZERS[type(message)](message)


# A simulator sizes every control message it sends, so the schema is turned once into one
# sizing function per type (fixed-width fields summed ahead) instead of being interpreted per call.
_Sizer = typing.Callable[[Any], int]
_FIXED_WIDTH = {"int": 8, "float": 8, "bool": 1}


def _str_size(value: str) -> int:
    return 2 + (len(value) if value.isascii() else len(value.encode("utf-8")))


def _bytes_size(value: bytes) -> int:
    return 2 + len(value)


def _value_sizer(kind: _Kind) -> _Sizer:
    if kind == "str":
        return _str_size
    if kind == "bytes":
        return _bytes_size
    if isinstance(kind, str):
        width = _FIXED_WIDTH[kind]
        return lambda _value: width
    if kind[0] == "tuple":
        item = kind[1]
        if isinstance(item, str) and item in _FIXED_WIDTH:
            item_width = _FIXED_WIDTH[item]
            return lambda value: 2 + item_width * len(value)
        item_sizer = _value_sizer(item)
        return lambda value: 2 + sum(map(item_sizer, value))
    return _record_sizer(kind[1])


def _record_sizer(cls: type[Any]) -> _Sizer:
    schema = _SCHEMAS[cls]
    fixed = sum(_FIXED_WIDTH.get(k, 0) for _, k in schema if isinstance(k, str))
    variable = tuple(
        (operator.attrgetter(name), _value_sizer(kind))
        for name, kind in schema
        if not (isinstance(kind, str) and kind in _FIXED_WIDTH)
    )
    if not variable:
        return lambda _record: fixed
    if len(variable) == 1:
        ((get, size),) = variable
        return lambda record: fixed + size(get(record))
    # Two to four variable fields (most records): unrolled, no generator per record.
    if len(variable) == 2:
        (get1, size1), (get2, size2) = variable
        return lambda record: fixed + size1(get1(record)) + size2(get2(record))
    if len(variable) == 3:
        (get1, size1), (get2, size2), (get3, size3) = variable
        return lambda record: (
            fixed + size1(get1(record)) + size2(get2(record)) + size3(get3(record))
        )
    if len(variable) == 4:
        (get1, size1), (get2, size2), (get3, size3), (get4, size4) = variable
        return lambda record: (
            fixed
            + size1(get1(record))
            + size2(get2(record))
            + size3(get3(record))
            + size4(get4(record))
        )
    return lambda record: fixed + sum(size(get(record)) for get, size in variable)


_SIZERS: dict[type[Any], _Sizer] = {cls: _record_sizer(cls) for cls in _SCHEMAS}
#: ``encoded_size`` of every message type whose fields are all fixed-width (the same for all).
FIXED_SIZES: dict[type[Any], int] = {
    cls: 2 + sum(_FIXED_WIDTH.get(str(kind), 0) for _, kind in schema)
    for cls, schema in _SCHEMAS.items()
    if all(isinstance(kind, str) and kind in _FIXED_WIDTH for _, kind in schema)
}


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
