"""The central heuristic: min-cost max-flow over the layered graph, with full knowledge.

It is a strong centralised scheduler, not an optimum and no bound (``sim/bound.py`` is the bound):
min-cost flow minimises the total path cost, not the slowest path; unit paths are dispatched
greedily; placement is fixed by speed. Problem solved (networkx ``max_flow_min_cost``): on the graph
``source -> data nodes (capacity = batch) -> stage-1 relays -> ... -> stage-S relays -> data nodes
as sinks (capacity = batch) -> sink``, each relay split into in/out with capacity = microbatches it
holds at once, and each edge between consecutive layers costing the paper's d_ij, find a maximum
flow and, among maximum flows, one of least *total* cost (the usual tractable stand-in for the
paper's min-max objective; it is what successive shortest augmenting paths, and GWTF's distributed
analogue, converge to). The flow is decomposed into unit paths; each unit carries one microbatch at
a time, so no relay ever holds more than its capacity.

Full knowledge: the flow is recomputed at every membership change (crash or join), and the policy
knows who is dead. It still acts on in-flight microbatches only when the engine asks (a hop's
deadline, 10 s here): a microbatch whose path broke is re-routed greedily on the cheapest live
node with spare capacity and never restarted.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import ClassVar

import networkx as nx

from gwtf.coordinator_free.baselines.common import (
    balanced_placement,
    unplaced_relays,
    weakest_stage,
)
from gwtf.coordinator_free.placement import offered_slots
from gwtf.coordinator_free.sim.policy import (
    Action,
    Forward,
    Hold,
    HopDecision,
    MicrobatchView,
    PolicyDefaults,
    PolicyTiming,
    RepairDecision,
    Replace,
    Restart,
    Retry,
    WorldView,
)
from gwtf.errors import ConfigError

#: Edge costs are scaled to integers (microseconds) because network simplex needs exact arithmetic.
_COST_SCALE = 1000.0
_SOURCE, _SINK = "__source__", "__sink__"

#: origin data node, relays of stages 1..S, sink data node
Route = tuple[str, ...]


class CentralPolicy(PolicyDefaults):
    """Routes every microbatch on a unit path of the current min-cost max-flow."""

    name: ClassVar[str] = "central"
    full_knowledge: ClassVar[bool] = True

    def __init__(self, hop_timeout_s: float = 10.0, slot_speed_scale: float | None = None) -> None:
        if slot_speed_scale is not None and not slot_speed_scale > 0:
            raise ConfigError(
                f"slot_speed_scale must be > 0 (or None: every slot), got {slot_speed_scale!r}"
            )
        self._timing = PolicyTiming(hop_timeout_s, hop_timeout_s)
        self.slot_speed_scale = slot_speed_scale
        self._dirty = True
        self._routes: dict[str, list[Route]] = {}
        self._in_use: dict[Route, int] = {}
        self._mb_route: dict[int, Route] = {}
        self.flow_value = 0
        self.recomputations = 0

    def timing(self) -> PolicyTiming:
        return self._timing

    # ---- membership ----

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        return balanced_placement(world, unplaced_relays(world))

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        members = {s: self._alive(world, s) for s in range(1, world.stages + 1)}
        return weakest_stage(world, members)

    def on_node_up(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        self._dirty = True
        return [Retry(d) for d in world.data_nodes()] if now > 0 else ()

    def on_node_down(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        self._dirty = True
        return [Retry(d) for d in world.data_nodes() if world.is_alive(d)]

    # ---- routing ----

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        if mb.stage == 0:
            return self._assign(world, mb)
        route = self._mb_route.get(mb.mb_id)
        target = route[mb.stage + 1] if route is not None else None
        if target is None or not self._serves(world, target, mb.stage + 1):
            target = self._greedy(world, node_id, mb.stage + 1)
        return Forward(target)

    def on_microbatch_done(
        self, world: WorldView, mb: MicrobatchView, now: float
    ) -> Sequence[Action]:
        self._release(mb.mb_id)
        return [Retry(d) for d in world.data_nodes()]

    def on_stall(self, world: WorldView, mb: MicrobatchView, now: float) -> RepairDecision:
        self._release(mb.mb_id)
        return Restart()

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        if self._serves(world, suspect, mb.stage + 1):
            return Forward(suspect)
        return self.choose_next_hop(world, node_id, mb, now)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        if world.is_alive(suspect):
            return Hold()
        stage = mb.stage - 1
        return Replace(stage, self._greedy(world, node_id, stage))

    # ---- the flow ----

    def unit_routes(self, world: WorldView) -> dict[str, tuple[Route, ...]]:
        """The unit routes of the min-cost max-flow over the live nodes, per origin data node,
        cheapest first; computed again first if membership changed since the last time."""
        if self._dirty:
            self._recompute(world)
        return {origin: tuple(routes) for origin, routes in self._routes.items()}

    def _assign(self, world: WorldView, mb: MicrobatchView) -> HopDecision:
        self._release(mb.mb_id)
        if self._dirty:
            self._recompute(world)
        own = self._routes.get(mb.origin, [])
        others = [r for o, routes in sorted(self._routes.items()) if o != mb.origin for r in routes]
        # A data node the flow left without units borrows another origin's free unit: capacity
        # is time-shared, and every batch still gets through.
        for route in own + others:
            units = self._routes[route[0]].count(route)
            if self._in_use.get(route, 0) < units:
                self._in_use[route] = self._in_use.get(route, 0) + 1
                self._mb_route[mb.mb_id] = route
                return Forward(route[1])
        return Hold()

    def _release(self, mb_id: int) -> None:
        route = self._mb_route.pop(mb_id, None)
        if route is not None and self._in_use.get(route, 0) > 0:
            self._in_use[route] -= 1

    def _recompute(self, world: WorldView) -> None:
        self._dirty = False
        self.recomputations += 1
        graph = build_flow_graph(world, world.is_alive, self.slot_speed_scale)
        flow = nx.max_flow_min_cost(graph, _SOURCE, _SINK)
        self._routes = decompose_routes(flow, world)
        self.flow_value = sum(len(r) for r in self._routes.values())
        self._in_use = {r: 0 for routes in self._routes.values() for r in routes}
        for route in self._mb_route.values():
            if route in self._in_use:
                self._in_use[route] += 1

    def _greedy(self, world: WorldView, node_id: str, stage: int) -> str:
        """Cheapest live node of ``stage`` (a data node past S), spare capacity first."""
        if stage > world.stages:
            candidates = [d for d in world.data_nodes() if world.is_alive(d)]
        else:
            candidates = self._alive(world, stage) or list(world.nodes_in_stage(stage))

        def rank(n: str) -> tuple[bool, float, str]:
            full = stage <= world.stages and world.occupancy(n) >= world.spec(n).capacity
            return (full, world.edge_cost_ms(node_id, n), n)

        return min(candidates, key=rank)

    @staticmethod
    def _serves(world: WorldView, node_id: str, stage: int) -> bool:
        """Whether ``node_id`` is alive and serves ``stage`` (a data node past S): a relay that
        crashed and came back may have been placed at another stage since its route was made."""
        if not world.is_alive(node_id):
            return False
        if stage > world.stages:
            return world.spec(node_id).role == "data"
        return world.stage_of(node_id) == stage

    @staticmethod
    def _alive(world: WorldView, stage: int) -> list[str]:
        return [n for n in world.nodes_in_stage(stage) if world.is_alive(n)]


def build_flow_graph(
    world: WorldView, is_usable: Callable[[str], bool], slot_speed_scale: float | None = None
) -> nx.DiGraph:
    """The layered graph with capacities and integer edge costs (µs) over usable nodes.

    A relay's capacity is its ``capacity``, or with ``slot_speed_scale`` the slots
    ``placement.offered_slots`` gives it against the fastest usable relay of its stage (the
    rule GWTF's relays apply with what their peers' Hellos tell them).
    """
    graph = nx.DiGraph()
    data = [d for d in world.data_nodes() if is_usable(d)]
    layers: list[list[tuple[str, str]]] = [[(d, f"out:{d}") for d in data]]
    for d in data:
        graph.add_edge(_SOURCE, f"out:{d}", capacity=world.spec(d).capacity, weight=0)
        graph.add_edge(f"sink:{d}", _SINK, capacity=world.spec(d).capacity, weight=0)
    for stage in range(1, world.stages + 1):
        layer = []
        members = [r for r in world.nodes_in_stage(stage) if is_usable(r)]
        fastest = max((world.spec(r).speed for r in members), default=1.0)
        for relay in world.nodes_in_stage(stage):
            if is_usable(relay):
                spec = world.spec(relay)
                capacity = spec.capacity
                if slot_speed_scale is not None:
                    # compute time is inversely proportional to speed
                    capacity = offered_slots(
                        capacity, 1 / spec.speed, 1 / fastest, slot_speed_scale
                    )
                graph.add_edge(f"in:{relay}", f"out:{relay}", capacity=capacity, weight=0)
                layer.append((relay, f"out:{relay}"))
        for prev, prev_out in layers[-1]:
            for relay, _ in layer:
                cost = round(world.edge_cost_ms(prev, relay) * _COST_SCALE)
                graph.add_edge(prev_out, f"in:{relay}", weight=cost)
        layers.append(layer)
    for prev, prev_out in layers[-1]:
        for d in data:
            cost = round(world.edge_cost_ms(prev, d) * _COST_SCALE)
            graph.add_edge(prev_out, f"sink:{d}", weight=cost)
    return graph


def decompose_routes(flow: dict[str, dict[str, int]], world: WorldView) -> dict[str, list[Route]]:
    """Split an integral flow into unit routes, per origin data node, cheapest first."""
    remaining = {u: dict(edges) for u, edges in flow.items()}
    routes: dict[str, list[Route]] = {}
    for out_node, units in sorted(remaining.get(_SOURCE, {}).items()):
        origin = out_node.removeprefix("out:")
        for _ in range(units):
            hops: list[str] = [origin]
            node = out_node
            while node != _SINK:
                nxt = next(v for v, f in sorted(remaining[node].items()) if f > 0)
                remaining[node][nxt] -= 1
                if nxt.startswith("in:"):
                    hops.append(nxt.removeprefix("in:"))
                elif nxt.startswith("sink:"):
                    hops.append(nxt.removeprefix("sink:"))
                node = nxt
            routes.setdefault(origin, []).append(tuple(hops))
    for unit_routes in routes.values():
        unit_routes.sort(key=lambda r: (route_cost_ms(world, r), r))
    return routes


def route_cost_ms(world: WorldView, route: Route) -> float:
    """Sum of the edge costs along origin -> relays -> sink."""
    return sum(world.edge_cost_ms(a, b) for a, b in itertools.pairwise(route))
