"""What one node remembers: its neighbours, the flows it carries in, and the slots it sends out.

Slots are hop-local. A node numbers its outgoing slots itself; the next hop knows that flow as
(sender, slot). A relay holds one out-slot per in-slot; a data node originates out-slots (as a
source) and terminates in-slots (as a sink). ``flow_id`` names the flow end to end, for people and
for the data plane; it is never used as a key, so swaps and take-overs never collide.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from gwtf.coordinator_free.wire import TableExchange

InKey = tuple[str, int]  # (upstream node, upstream's slot number)
INF = math.inf
#: Timers compare with this slack: a period of 2 s added to a time and subtracted again may come
#: back a rounding error short, and the round it times must not slip by a whole period.
TIME_SLACK_S = 1e-6


class SlotState(enum.Enum):
    UNMATCHED = "unmatched"  # needs a next hop
    PENDING = "pending"  # a request is out
    MATCHED = "matched"  # the next hop accepted
    LOCKED = "locked"  # matched, and an annealing move on it awaits an answer


@dataclass(slots=True)
class Peer:
    """A neighbour as this node believes it to be."""

    peer_id: str
    role: str
    stage: int
    capacity: int
    compute_ms: float
    spare: int
    last_heard_s: float
    cost_to_sink_ms: float = INF
    latency_ms: float | None = None
    bandwidth_gbps: float | None = None
    relayed: bool = False  # the link runs through a circuit relay
    relay_leg_ms: float | None = None  # this node's latency estimate to that relay, if known
    alive: bool = True
    table: TableExchange | None = None
    table_at_s: float = -INF
    ping_nonce: int | None = None
    ping_sent_s: float = 0.0
    last_ping_s: float = -INF
    misses: int = 0
    last_slot_list_s: float = -INF
    edge_cost_ms: float | None = None  # cached d_ij; cleared when an input changes
    boot_id: int = 0


@dataclass(slots=True)
class InSlot:
    """A flow this node carries, as its upstream knows it."""

    upstream: str
    upstream_slot: int
    flow_id: str
    path: tuple[str, ...]  # source ... upstream
    prefix_cost_ms: float  # source -> this node, including the edge into it
    since_s: float  # accepted or re-keyed at
    out_slot: int | None = None  # relays only
    reported_suffix_ms: float = INF  # the last cost to a sink told upstream

    @property
    def key(self) -> InKey:
        return (self.upstream, self.upstream_slot)


@dataclass(slots=True)
class OutSlot:
    """A flow this node sends onwards (or originates, when ``in_key`` is None)."""

    slot: int
    flow_id: str
    in_key: InKey | None
    state: SlotState = SlotState.UNMATCHED
    next_hop: str | None = None
    suffix_cost_ms: float = INF  # next hop -> sink for this flow
    edge_ms: float = INF  # this node -> next hop, when matched
    since_s: float = 0.0  # when the state last changed
    excluded_until_s: dict[str, float] = field(default_factory=dict)
    pending_move: tuple[str, str] | None = None  # (peer asked, the next hop we would take)

    @property
    def is_carried(self) -> bool:
        """Whether the flow currently has a next hop (matched, or matched and locked)."""
        return self.state in (SlotState.MATCHED, SlotState.LOCKED)
