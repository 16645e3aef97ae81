"""Small layered swarms for the flow-core tests, their ground truth, and the networkx optimum."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import networkx as nx

from gwtf.coordinator_free.cost import symmetric_edge_cost_ms
from gwtf.coordinator_free.placement import offered_slots
from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.protocol.loopback import LoopbackNetwork
from gwtf.coordinator_free.protocol.state import SlotState

ACTIVATION_BYTES = 2e6


@dataclass(frozen=True)
class Swarm:
    """A layered instance: nodes, and a symmetric latency (ms) / bandwidth (Gbit/s) per pair."""

    stages: int
    specs: tuple[NodeSpec, ...]
    latency_ms: dict[tuple[str, str], float]
    bandwidth_gbps: dict[tuple[str, str], float]

    def link(self, a: str, b: str) -> tuple[float, float]:
        key = (a, b) if a < b else (b, a)
        return self.latency_ms[key], self.bandwidth_gbps[key]

    def spec(self, node_id: str) -> NodeSpec:
        return next(s for s in self.specs if s.node_id == node_id)

    def edge_cost_ms(self, a: str, b: str) -> float:
        latency, bandwidth = self.link(a, b)
        return symmetric_edge_cost_ms(
            self.spec(a).compute_ms, self.spec(b).compute_ms, latency, bandwidth, ACTIVATION_BYTES
        )

    def path_cost_ms(self, path: tuple[str, ...]) -> float:
        return sum(self.edge_cost_ms(a, b) for a, b in itertools.pairwise(path))


def random_swarm(
    seed: int,
    stages: int = 3,
    relays_per_stage: tuple[int, int] = (2, 4),
    data_nodes: int = 2,
    capacity: tuple[int, int] = (1, 3),
) -> Swarm:
    rng = random.Random(seed)
    specs = [
        NodeSpec(f"d{i}", "data", 0, rng.randint(*capacity) + 1, rng.uniform(5.0, 15.0))
        for i in range(data_nodes)
    ]
    for stage in range(1, stages + 1):
        for index in range(rng.randint(*relays_per_stage)):
            specs.append(
                NodeSpec(
                    f"s{stage}r{index}",
                    "relay",
                    stage,
                    rng.randint(*capacity),
                    rng.choice([20.0, 33.0, 57.0]),
                )
            )
    ids = sorted(s.node_id for s in specs)
    latency, bandwidth = {}, {}
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            latency[(a, b)] = rng.choice([5.0, 20.0, 60.0, 120.0])
            bandwidth[(a, b)] = rng.choice([0.5, 1.0, 5.0])
    return Swarm(stages, tuple(specs), latency, bandwidth)


def build_network(
    swarm: Swarm, seed: int, through_wire: bool = False, config: FlowConfig | None = None
) -> LoopbackNetwork:
    """Every node introduced to every other and told the true link of each (one measurement)."""
    config = config or FlowConfig(stages=swarm.stages, activation_bytes=ACTIVATION_BYTES)
    nodes = [
        FlowNode(spec, config, random.Random(seed * 7919 + i)) for i, spec in enumerate(swarm.specs)
    ]
    network = LoopbackNetwork(
        nodes, lambda a, b: swarm.link(a, b)[0] / 1000.0, through_wire=through_wire
    )
    ids = [n.node_id for n in nodes]
    network.introduce_all(lambda node: [i for i in ids if i != node.node_id])
    network.run_until(1.0, tick_every_s=10.0)  # introductions land before measurements
    for node in nodes:
        for peer_id in node.peers:
            node.observe_link(peer_id, *swarm.link(node.node_id, peer_id))
    return network


def drain(network: LoopbackNetwork) -> None:
    """Deliver every message in flight without ticking, so in-flight moves complete."""
    network.deliver_in_flight()


def trace_flows(network: LoopbackNetwork) -> list[tuple[str, ...]]:
    """Every end-to-end flow, followed slot by slot from each live source."""
    paths = []
    for node in network.nodes.values():
        if not node.is_data or node.node_id in network.crashed:
            continue
        for slot, (_, first_hop) in sorted(node.source_routes().items()):
            path, here, slot_here = [node.node_id], first_hop, slot
            previous = node.node_id
            while True:
                path.append(here)
                hop = network.nodes[here]
                if hop.is_data:
                    break
                route = hop.route(previous, slot_here)
                if route is None:
                    break
                previous, (here, slot_here) = here, route
            paths.append(tuple(path))
    return paths


def check_consistent(network: LoopbackNetwork) -> None:
    """Both ends of every hop agree (holds once no message is in flight)."""
    live = {i: n for i, n in network.nodes.items() if i not in network.crashed and not n.left}
    for node_id, node in live.items():
        node.check_invariants()
        for out in node.out_slots.values():
            if out.state in (SlotState.MATCHED, SlotState.LOCKED):
                assert out.next_hop in live, f"{node_id} routes to gone {out.next_hop}"
                assert (node_id, out.slot) in live[out.next_hop].in_slots, (
                    f"{node_id} slot {out.slot} -> {out.next_hop} unknown there"
                )
        for upstream, slot in node.in_slots:
            assert upstream in live, f"{node_id} holds a flow from gone {upstream}"
            out = live[upstream].out_slots.get(slot)
            assert out is not None and out.next_hop == node_id, (
                f"{node_id} holds ({upstream},{slot}) that {upstream} does not send it"
            )


def slots_offered(swarm: Swarm, spec: NodeSpec, slot_speed_scale: float) -> int:
    """The slots ``spec`` offers when it knows every same-stage relay (as here)."""
    if spec.role == "data":
        return spec.capacity
    same = [s.compute_ms for s in swarm.specs if s.stage == spec.stage and s.role == "relay"]
    return offered_slots(spec.capacity, spec.compute_ms, min(same), slot_speed_scale)


def optimum(swarm: Swarm, slot_speed_scale: float | None = None) -> tuple[int, float]:
    """networkx min-cost max-flow on the same graph: (max flow, cost of its slowest path).

    Relays hold the slots they offer (``FlowConfig.slot_speed_scale``, the default unless
    given), so this is the max flow the protocol can reach."""
    if slot_speed_scale is None:
        slot_speed_scale = FlowConfig(stages=swarm.stages, activation_bytes=1.0).slot_speed_scale
    graph = nx.DiGraph()
    scale = 1000  # integer weights keep network simplex exact
    data = [s for s in swarm.specs if s.role == "data"]
    for spec in swarm.specs:
        capacity = slots_offered(swarm, spec, slot_speed_scale)
        graph.add_edge(("in", spec.node_id), ("out", spec.node_id), capacity=capacity, weight=0)
    for spec in data:
        graph.add_edge("S", ("src", spec.node_id), capacity=spec.capacity, weight=0)
        graph.add_edge(("out", spec.node_id), "T", capacity=spec.capacity, weight=0)
    by_stage = {
        k: [s.node_id for s in swarm.specs if s.stage == k and s.role == "relay"]
        for k in range(1, swarm.stages + 1)
    }
    for spec in data:
        for relay in by_stage[1]:
            cost = round(swarm.edge_cost_ms(spec.node_id, relay) * scale)
            graph.add_edge(("src", spec.node_id), ("in", relay), capacity=10**6, weight=cost)
    for stage in range(1, swarm.stages):
        for a in by_stage[stage]:
            for b in by_stage[stage + 1]:
                cost = round(swarm.edge_cost_ms(a, b) * scale)
                graph.add_edge(("out", a), ("in", b), capacity=10**6, weight=cost)
    for relay in by_stage[swarm.stages]:
        for spec in data:
            cost = round(swarm.edge_cost_ms(relay, spec.node_id) * scale)
            graph.add_edge(("out", relay), ("in", spec.node_id), capacity=10**6, weight=cost)
    flow = nx.max_flow_min_cost(graph, "S", "T")
    value = sum(flow["S"].values())
    worst = 0.0
    for _ in range(value):  # peel one unit path at a time
        node, cost = "S", 0.0
        while node != "T":
            nxt = next(v for v, f in flow[node].items() if f > 0)
            flow[node][nxt] -= 1
            cost += graph[node][nxt]["weight"] / scale
            node = nxt
        worst = max(worst, cost)
    return value, worst


def settle(network: LoopbackNetwork, seconds: float = 120.0) -> None:
    """Stop annealing, let reconciliation repair any race, then deliver what is in flight."""
    for node in network.nodes.values():
        node.moves_enabled = False
    network.run_until(network.now + seconds, tick_every_s=1.0)
    drain(network)
