"""Where a microbatch's hop goes: on along its flow, to a ranked peer off the flow, or to a
stand-in for a dead hop.

``next_hop`` is the one rule for a forward leaving a node, first send and re-send alike: the
flow's next hop (``FlowNode.route``) when the flow is carried and that hop is not ruled out;
else the best next-stage peer the node believes alive: one that knows a way on to a sink first
(a peer advertising an infinite cost knows none), then one that advertised room for a flow, then
the least edge + advertised cost, then id. Detours do not use up that room: a node sends every
detour to the same peer until the peers' adverts or its link estimates change. A
missed ack rules its peer out (the caller declares it dead, so it leaves the view, or passes it
in ``exclude`` when it declined the hop alive). None: no next-stage peer is known; the caller
holds, restarts or has the hop repaired.

``stand_in`` picks the replica that recomputes a dead hop of a backward: a live replica of the
dead hop's stage from the stalled node's own view, at random (the caller's seeded generator), so
repairs spread over the replicas instead of all landing on the lowest id.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from gwtf.coordinator_free.protocol.config import DATA
from gwtf.coordinator_free.protocol.node import FlowNode


@dataclass(frozen=True, slots=True)
class NextPeer:
    """A next-stage peer as the node sees it."""

    peer_id: str
    cost_ms: float  # edge cost to it + its advertised cost to a sink; inf: it knows no way on
    spare: int  # the room it last advertised


@dataclass(frozen=True, slots=True)
class HopView:
    """What a node knows when a forward leaves it: the flow's route (next hop, this node's
    slot), None off any carried flow; and the next-stage peers it believes alive, read only when
    the route cannot be taken (so it may be a generator)."""

    route: tuple[str, int] | None
    peers: Iterable[NextPeer]


@dataclass(frozen=True, slots=True)
class Onward:
    """Send the forward to ``to``; ``slot`` is this node's slot of the flow, None off a flow."""

    to: str
    slot: int | None


def next_hop(view: HopView, exclude: Collection[str] = ()) -> Onward | None:
    """The forward's next hop (module docstring); None when no next-stage peer is known."""
    if view.route is not None and view.route[0] not in exclude:
        return Onward(view.route[0], view.route[1])
    best: tuple[bool, bool, float, str] | None = None
    for peer in view.peers:
        if peer.peer_id in exclude:
            continue
        rank = (peer.cost_ms == math.inf, peer.spare <= 0, peer.cost_ms, peer.peer_id)
        if best is None or rank < best:
            best = rank
    return None if best is None else Onward(best[3], None)


def stand_in(candidates: Sequence[str], exclude: Collection[str], rng: random.Random) -> str | None:
    """A replica to recompute a dead hop: one of ``candidates`` (the stage's live replicas in
    the node's view, in id order) not in ``exclude``, drawn with ``rng``; None if none is left."""
    left = [peer for peer in candidates if peer not in exclude]
    return rng.choice(left) if left else None


def _everyone(_peer_id: str) -> bool:
    return True


def hop_view(
    node: FlowNode, route: tuple[str, int] | None, keep: Callable[[str], bool] = _everyone
) -> HopView:
    """``node``'s view for a forward on the flow whose route is ``route``: its live next-stage
    peers that ``keep`` accepts (data nodes only after the last stage), costs read lazily."""
    stage = node.next_stage

    def peers() -> Iterable[NextPeer]:
        for peer in node.alive_peers(stage):
            if (stage != 0 or peer.role == DATA) and keep(peer.peer_id):
                yield NextPeer(peer.peer_id, node.cost_through_ms(peer), peer.spare)

    return HopView(route, peers())


def replicas(node: FlowNode, stage: int, keep: Callable[[str], bool] = _everyone) -> list[str]:
    """The replicas of ``stage`` ``node`` believes alive that ``keep`` accepts, in id order:
    ``stand_in``'s candidates."""
    return [peer.peer_id for peer in node.alive_peers(stage) if keep(peer.peer_id)]
