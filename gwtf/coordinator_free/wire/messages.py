"""The wire messages of the flow protocol: one frozen dataclass per message, and the limits.

Import them from ``gwtf.coordinator_free.wire``, which also exports the binary encoding (``codec``).
Each class carries its ``TYPE_ID`` on the wire.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, ClassVar

PROTOCOL_ID = "/gwtf/flow/3.0.0"
WIRE_VERSION = 3
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
    """To an upstream peer: the slots of yours I carry (anti-entropy, and a flow heartbeat).

    It is also my keep-alive ping to that peer: a ``nonce`` other than 0 asks for ``Pong(nonce)``.
    """

    TYPE_ID: ClassVar[int] = 26
    slots: tuple[int, ...]
    nonce: int = 0


@dataclass(frozen=True, slots=True)
class FlowWanted:
    """Data node to data peers: microbatches of mine wait for a flow (0: none wait any more)."""

    TYPE_ID: ClassVar[int] = 28
    waiting: int


@dataclass(frozen=True, slots=True)
class FlowLoan:
    """Data node to a waiting data peer: carry one microbatch on my idle source ``slot``, whose
    first hop is ``first_hop`` (send it there as my slot), then give the slot back."""

    TYPE_ID: ClassVar[int] = 29
    slot: int
    first_hop: str


@dataclass(frozen=True, slots=True)
class FlowLoanReturn:
    """Borrower to lender: source ``slot`` is yours again."""

    TYPE_ID: ClassVar[int] = 30
    slot: int


@dataclass(frozen=True, slots=True)
class HopAck:
    """Data plane: a hop's output arrived; digest of the tensor, and which attempt it was. A
    receiver that computed the hop and keeps its output (a repair, a redo: nothing goes on to
    a next node) names that output's digest, the receipt it recorded of it, for the sender to
    record too (empty otherwise)."""

    TYPE_ID: ClassVar[int] = 23
    microbatch_id: str
    stage: int
    direction: int  # FORWARD or BACKWARD
    attempt: int
    digest: bytes
    kept_digest: bytes = b""


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
    | FlowWanted
    | FlowLoan
    | FlowLoanReturn
    | HopAck
    | Probe
    | ProbeReply
)

MESSAGE_TYPES: tuple[type[Any], ...] = typing.get_args(Message)
