"""Wire messages: every type round-trips; any bad bytes raise WireFormatError and nothing else."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.coordinator_free.flow_errors import WireFormatError
from gwtf.coordinator_free.wire import (
    FIXED_SIZES,
    MAX_ID_BYTES,
    MAX_ITEMS,
    MESSAGE_TYPES,
    WIRE_VERSION,
    CostAdvert,
    FlowCost,
    FlowRequest,
    Hello,
    HopAck,
    Pong,
    SlotList,
    TableEntry,
    TableExchange,
    TableRequest,
    decode,
    encode,
    encoded_size,
)
from gwtf.errors import ProtocolError

_IDS = st.text(max_size=12)
_FLOATS = st.floats(allow_nan=False)
_INTS = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _strategy(hint: Any) -> st.SearchStrategy[Any]:
    if hint is str:
        return _IDS
    if hint is int:
        return _INTS
    if hint is float:
        return _FLOATS
    if hint is bool:
        return st.booleans()
    if hint is bytes:
        return st.binary(max_size=40)
    if typing.get_origin(hint) is tuple:
        return st.lists(_strategy(typing.get_args(hint)[0]), max_size=4).map(tuple)
    return _record(hint)


def _record(cls: type[Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: _strategy(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


ANY_MESSAGE = st.one_of([_record(cls) for cls in MESSAGE_TYPES])


@settings(max_examples=300, deadline=None)
@given(ANY_MESSAGE)
def test_every_message_round_trips(message: Any) -> None:
    assert decode(encode(message)) == message


def test_type_ids_are_unique_and_cover_every_message() -> None:
    ids = [cls.TYPE_ID for cls in MESSAGE_TYPES]
    assert len(ids) == len(set(ids)) == len(MESSAGE_TYPES)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_wire_format_error(data: bytes) -> None:
    with contextlib.suppress(WireFormatError):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(ANY_MESSAGE, st.data())
def test_truncated_messages_raise_wire_format_error(message: Any, data: st.DataObject) -> None:
    raw = encode(message)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    with pytest.raises(WireFormatError):
        decode(raw[:cut])


@settings(max_examples=300, deadline=None)
@given(ANY_MESSAGE, st.data())
def test_corrupted_messages_raise_only_wire_format_error(message: Any, data: st.DataObject) -> None:
    raw = bytearray(encode(message))
    index = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[index] ^= data.draw(st.integers(min_value=1, max_value=255))
    with contextlib.suppress(WireFormatError):
        decode(bytes(raw))


def test_wrong_version_unknown_type_and_trailing_bytes_are_refused() -> None:
    raw = encode(HopAck("mb-1", 2, 0, 1, b"\x01" * 32))
    with pytest.raises(WireFormatError, match="version"):
        decode(bytes([WIRE_VERSION + 1]) + raw[1:])
    with pytest.raises(WireFormatError, match="unknown message type"):
        decode(bytes([WIRE_VERSION, 250]) + raw[2:])
    with pytest.raises(WireFormatError, match="trailing"):
        decode(raw + b"\x00")
    with pytest.raises(WireFormatError):
        decode(b"")


def test_oversized_fields_are_refused_on_both_sides() -> None:
    with pytest.raises(WireFormatError):
        encode(FlowRequest(1, "x" * (MAX_ID_BYTES + 1), (), 0.0))
    with pytest.raises(WireFormatError):
        encode(FlowRequest(1, "f", tuple("n" for _ in range(MAX_ITEMS + 1)), 0.0))
    with pytest.raises(WireFormatError):
        encode(FlowRequest(1, "f", (), math.nan))
    # A length prefix claiming more than the bound is refused before reading further.
    raw = bytearray(encode(FlowRequest(1, "f", (), 0.0)))
    raw[2 + 8 : 2 + 8 + 2] = (MAX_ID_BYTES + 1).to_bytes(2, "big")
    with pytest.raises(WireFormatError, match="over"):
        decode(bytes(raw))


def test_nested_records_and_infinite_costs_survive() -> None:
    entry = TableEntry(3, "d0/1", "r1", "r3", 10.0, 2.0, 3.0, math.inf)
    table = TableExchange(2, (entry, entry), ())
    assert decode(encode(table)) == table


def test_wire_format_error_is_a_protocol_error_with_one_line() -> None:
    with pytest.raises(ProtocolError) as err:
        decode(b"\x01")
    assert "\n" not in str(err.value)


@settings(max_examples=200, deadline=None)
@given(ANY_MESSAGE)
def test_encoded_size_is_the_length_of_the_encoding(message: Any) -> None:
    assert encoded_size(message) == len(encode(message))


@settings(max_examples=200, deadline=None)
@given(ANY_MESSAGE)
def test_a_fixed_size_is_the_length_of_every_encoding_of_its_type(message: Any) -> None:
    fixed = FIXED_SIZES.get(type(message))
    assert fixed is None or fixed == len(encode(message))


def test_fixed_sizes_cover_the_small_control_messages_only() -> None:
    assert {CostAdvert, Pong, FlowCost, TableRequest} <= set(FIXED_SIZES)
    assert not {Hello, TableExchange, SlotList, FlowRequest} & set(FIXED_SIZES)
