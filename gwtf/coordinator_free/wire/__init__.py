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
live node speaks one protocol: ``/gwtf/flow/3.0.0``.

Import from this package only: ``messages`` holds the dataclasses and limits, ``codec`` the
encoding.
"""

from __future__ import annotations

from gwtf.coordinator_free.wire.codec import FIXED_SIZES, decode, encode, encoded_size
from gwtf.coordinator_free.wire.messages import (
    BACKWARD,
    FORWARD,
    MAX_BLOB_BYTES,
    MAX_ID_BYTES,
    MAX_ITEMS,
    MAX_MESSAGE_BYTES,
    MESSAGE_TYPES,
    PROTOCOL_ID,
    WIRE_VERSION,
    CostAdvert,
    EdgeEntry,
    FlowAccept,
    FlowCancel,
    FlowCost,
    FlowLoan,
    FlowLoanReturn,
    FlowReject,
    FlowRequest,
    FlowWanted,
    Goodbye,
    Hello,
    HopAck,
    Message,
    PathReport,
    PathUpdate,
    Ping,
    Pong,
    Probe,
    ProbeReply,
    PushBack,
    Rebind,
    Redirect,
    SlotList,
    SwapAccept,
    SwapProposal,
    SwapReject,
    TableEntry,
    TableExchange,
    TableRequest,
    TakeOverDeny,
    TakeOverGrant,
    TakeOverRequest,
)

__all__ = [
    "BACKWARD",
    "FIXED_SIZES",
    "FORWARD",
    "MAX_BLOB_BYTES",
    "MAX_ID_BYTES",
    "MAX_ITEMS",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_TYPES",
    "PROTOCOL_ID",
    "WIRE_VERSION",
    "CostAdvert",
    "EdgeEntry",
    "FlowAccept",
    "FlowCancel",
    "FlowCost",
    "FlowLoan",
    "FlowLoanReturn",
    "FlowReject",
    "FlowRequest",
    "FlowWanted",
    "Goodbye",
    "Hello",
    "HopAck",
    "Message",
    "PathReport",
    "PathUpdate",
    "Ping",
    "Pong",
    "Probe",
    "ProbeReply",
    "PushBack",
    "Rebind",
    "Redirect",
    "SlotList",
    "SwapAccept",
    "SwapProposal",
    "SwapReject",
    "TableEntry",
    "TableExchange",
    "TableRequest",
    "TakeOverDeny",
    "TakeOverGrant",
    "TakeOverRequest",
    "decode",
    "encode",
    "encoded_size",
]
