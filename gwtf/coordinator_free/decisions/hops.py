"""Where a microbatch's hop goes: on along its flow, to a ranked peer off the flow, or to a
stand-in for a dead hop.

``next_hop`` is the one rule for a forward leaving a node, first send and re-send alike, at a
relay and at a data node (whose re-send keeps the microbatch's flow): after the last stage, the
microbatch's origin (``HopView.origin``: only it holds the embedding its gradient ends in, so no
other data node can take the loss); else the
flow's next hop (``FlowNode.route``) when the flow is carried and that hop is not ruled out;
else the best next-stage peer the node believes alive (``rank``): one that knows a way on to a
sink first (a peer advertising an infinite cost knows none), then one with room left, then the
one with the fewest of this node's detours in flight to it, then the least edge + advertised
cost, then the node's own order of tied peers, then id.

A detour takes up the room it goes into: a peer's room left is the room it last advertised
less this node's detours in flight to it (``Detours``), so detours spread over the peers
instead of all going to the one that ranks best until adverts change. Among peers with no room
left, the least outstanding goes first (the least-outstanding-requests rule): a peer that is
slow or queues keeps its detours in flight longer (acks come after its compute), so it gets
fewer new ones, and after a death the upstreams' re-sends spread over the live replicas instead
of piling onto one. Equal costs (the start-up defaults) are ordered by a hash of the sending
node's id and the peer's (``HopView.sender``): each node orders tied peers its own way, so the
upstreams do not all start on the lowest id.

A missed ack rules its peer out (the caller declares it dead, so it leaves the view, or passes
it in ``exclude`` when it declined the hop alive). None: no next-stage peer is known; the
caller holds, restarts or has the hop repaired.

``Detours`` is each node's count of the detours (forwards sent off a flow, first sends and
re-sends) it has in flight, per peer: a detour counts from its send until it is acknowledged,
fails or is given up. Both the live sender and the simulator keep it this way.

``stand_in`` picks the replica that recomputes a dead hop of a backward: a live replica of the
dead hop's stage from the stalled node's own view, at random (the caller's seeded generator), so
repairs spread over the replicas instead of all landing on the lowest id.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gwtf.coordinator_free.protocol.config import DATA
from gwtf.coordinator_free.protocol.node import FlowNode


@dataclass(frozen=True, slots=True)
class NextPeer:
    """A next-stage peer as the node sees it."""

    peer_id: str
    cost_ms: float  # edge cost to it + its advertised cost to a sink; inf: it knows no way on
    spare: int  # the room it last advertised
    in_flight: int = 0  # this node's detours in flight to it (``Detours``)


class Detours:
    """A node's detours in flight, by peer: each under a key of the caller's (a microbatch, or
    one send of it), so that ending one twice, or one that was never counted, changes nothing."""

    __slots__ = ("_count", "_to")

    def __init__(self) -> None:
        self._to: dict[Hashable, str] = {}  # key -> the peer it went to
        self._count: Counter[str] = Counter()

    def sent(self, key: Hashable, peer: str) -> None:
        """A detour under ``key`` went to ``peer`` (a previous one under ``key`` ends)."""
        self.ended(key)
        self._to[key] = peer
        self._count[peer] += 1

    def ended(self, key: Hashable, peer: str | None = None) -> None:
        """The detour under ``key`` was acknowledged, failed or was given up; with ``peer``,
        only if it went to ``peer`` (a late ack of an earlier send ends no later one)."""
        to = self._to.get(key)
        if to is None or (peer is not None and peer != to):
            return
        del self._to[key]
        self._count[to] -= 1
        if not self._count[to]:
            del self._count[to]

    def in_flight(self, peer: str) -> int:
        """The detours in flight to ``peer``."""
        return self._count.get(peer, 0)

    def __len__(self) -> int:
        return len(self._to)


@dataclass(frozen=True, slots=True)
class HopView:
    """What a node knows when a forward leaves it: the flow's route (next hop, this node's
    slot), None off any carried flow; and the next-stage peers it believes alive, read only when
    the route cannot be taken (so it may be a generator)."""

    route: tuple[str, int] | None
    peers: Iterable[NextPeer]
    sender: str = ""  # the node's own id: its order of peers of equal cost
    origin: str | None = None  # after the last stage: the microbatch's origin, the only sink


@dataclass(frozen=True, slots=True)
class Onward:
    """Send the forward to ``to``; ``slot`` is this node's slot of the flow, None off a flow."""

    to: str
    slot: int | None


def next_hop(view: HopView, exclude: Collection[str] = ()) -> Onward | None:
    """The forward's next hop (module docstring); None when no next-stage peer is known."""
    if view.origin is not None:
        return None if view.origin in exclude else Onward(view.origin, None)
    if view.route is not None and view.route[0] not in exclude:
        return Onward(view.route[0], view.route[1])
    best: tuple[bool, bool, int, float, int, str] | None = None
    for peer in view.peers:
        if peer.peer_id in exclude:
            continue
        ranked = rank(peer, view.sender)
        if best is None or ranked < best:
            best = ranked
    return None if best is None else Onward(best[-1], None)


def rank(peer: NextPeer, sender: str = "") -> tuple[bool, bool, int, float, int, str]:
    """``peer``'s rank as ``sender``'s detour's next hop, lowest first (module docstring)."""
    no_room = peer.spare - peer.in_flight <= 0
    way_on = peer.cost_ms == math.inf
    tie = _tie_order(sender, peer.peer_id)
    return (way_on, no_room, peer.in_flight, peer.cost_ms, tie, peer.peer_id)


@lru_cache(maxsize=1 << 16)
def _tie_order(sender: str, peer_id: str) -> int:
    """Where ``sender`` puts ``peer_id`` among peers of equal cost: a stable hash of both."""
    digest = hashlib.blake2b(f"{sender}|{peer_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def stand_in(candidates: Sequence[str], exclude: Collection[str], rng: random.Random) -> str | None:
    """A replica to recompute a dead hop: one of ``candidates`` (the stage's live replicas in
    the node's view, in id order) not in ``exclude``, drawn with ``rng``; None if none is left."""
    left = [peer for peer in candidates if peer not in exclude]
    return rng.choice(left) if left else None


def _everyone(_peer_id: str) -> bool:
    return True


def hop_view(
    node: FlowNode,
    route: tuple[str, int] | None,
    keep: Callable[[str], bool] = _everyone,
    detours: Detours | None = None,
    origin: str | None = None,
) -> HopView:
    """``node``'s view for a forward on the flow whose route is ``route``: its live next-stage
    peers that ``keep`` accepts, with its ``detours`` in flight to each, costs read lazily; after
    the last stage, the microbatch's ``origin`` (None: not known to the caller, then any data
    node)."""
    stage = node.next_stage
    counted = Detours() if detours is None else detours

    def peers() -> Iterable[NextPeer]:
        for peer in node.alive_peers(stage):
            if (stage != 0 or peer.role == DATA) and keep(peer.peer_id):
                cost = node.cost_through_ms(peer)
                yield NextPeer(peer.peer_id, cost, peer.spare, counted.in_flight(peer.peer_id))

    sink = origin if stage == 0 else None
    return HopView(route, peers(), node.node_id, sink)


def replicas(node: FlowNode, stage: int, keep: Callable[[str], bool] = _everyone) -> list[str]:
    """The replicas of ``stage`` ``node`` believes alive that ``keep`` accepts, in id order:
    ``stand_in``'s candidates."""
    return [peer.peer_id for peer in node.alive_peers(stage) if keep(peer.peer_id)]
