"""Properties of the flow core on random small swarms with churn (hypothesis).

Checked at every step: each node's capacity is never exceeded and its flows are conserved (every
in-flow has exactly one out-flow, every source keeps its slots); a node declared dead is never
asked to carry a flow. Checked once quiet: both ends of every hop agree, no flow uses a crashed
node, the routing reaches the maximum flow, and one seed gives one routing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf.coordinator_free.placement import (
    choose_bottleneck,
    choose_stage,
    slots_per_s,
    stage_loads,
)
from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.protocol.loopback import LoopbackNetwork
from gwtf.coordinator_free.wire import FlowRequest, Hello
from tests.coordinator_free.flow_graphs import (
    build_network,
    check_consistent,
    optimum,
    random_swarm,
    settle,
    trace_flows,
)

PROPERTY_SETTINGS = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class CheckedNetwork(LoopbackNetwork):
    """Checks local invariants after every step and that no one asks a peer it declared dead."""

    def send(self, sender: str, sends: list[Outbound]) -> None:
        node = self.nodes[sender]
        node.check_invariants()
        for outbound in sends:
            if isinstance(outbound.message, FlowRequest):
                peer = node.peers.get(outbound.to)
                assert peer is not None and peer.alive, f"{sender} asked dead {outbound.to}"
        super().send(sender, sends)


def checked(network: LoopbackNetwork) -> CheckedNetwork:
    network.__class__ = CheckedNetwork
    return network  # type: ignore[return-value]


def relay_ids(network: LoopbackNetwork) -> list[str]:
    return sorted(i for i, n in network.nodes.items() if not n.is_data)


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000), crashes=st.integers(0, 2), crash_at=st.floats(20.0, 120.0))
def test_churn_never_breaks_capacity_conservation_or_dead_peer_avoidance(
    seed: int, crashes: int, crash_at: float
) -> None:
    swarm = random_swarm(seed)
    network = checked(build_network(swarm, seed))
    network.run_until(crash_at)
    victims = relay_ids(network)[:: max(1, len(relay_ids(network)) // max(crashes, 1))][:crashes]
    for victim in victims:
        network.crash(victim)
    network.run_until(crash_at + 150.0)  # keep-alives find the crash within ~45 s
    settle(network)
    check_consistent(network)
    paths = trace_flows(network)
    for path in paths:
        assert not set(path) & set(victims)
        assert len(path) == swarm.stages + 2
    survivors = replace(swarm, specs=tuple(s for s in swarm.specs if s.node_id not in victims))
    assert len(paths) == optimum(survivors)[0]  # the swarm recovers the whole max flow


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000))
def test_annealing_never_breaks_flows_and_the_routing_reaches_max_flow(seed: int) -> None:
    swarm = random_swarm(seed)
    network = checked(build_network(swarm, seed))
    network.run_until(250.0)
    settle(network)
    check_consistent(network)
    value, _ = optimum(swarm)
    assert len(trace_flows(network)) == value


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_same_seed_gives_the_same_routing(seed: int) -> None:
    swarm = random_swarm(seed)
    runs = []
    for _ in range(2):
        network = build_network(swarm, seed)
        network.run_until(150.0)
        runs.append((trace_flows(network), network.delivered))
    assert runs[0] == runs[1]


def loads_from_hellos(stages: int, hellos: Iterable[Hello], demand: int):  # type: ignore[no-untyped-def]
    announced = ((h.stage, h.flows, h.capacity, h.compute_ms) for h in hellos if h.stage)
    return stage_loads(stages, announced, demand)


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000))
def test_flow_per_capacity_ranks_the_stages_of_the_running_swarm(seed: int) -> None:
    swarm = random_swarm(seed)
    network = build_network(swarm, seed)
    network.run_until(120.0)
    relays = [n for n in network.nodes.values() if not n.is_data]
    demand = sum(n.spec.capacity for n in network.nodes.values() if n.is_data)
    decision = choose_stage(loads_from_hellos(swarm.stages, (n.hello() for n in relays), demand))
    pressure = {}
    for stage in range(1, swarm.stages + 1):
        members = [n for n in relays if n.spec.stage == stage]
        carried = sum(len(n.in_slots) for n in members)
        weighted = sum(slots_per_s(n.spec.capacity, n.spec.compute_ms) for n in members)
        pressure[stage] = carried / weighted
    assert pressure[decision.stage] == max(pressure.values())


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000), crashed=st.integers(0, 100))
def test_a_joiner_reads_what_the_live_relays_hold_not_what_they_carry(
    seed: int, crashed: int
) -> None:
    """After routing and a crash, the relays' introductions say what each holds (physical
    capacity, compute time), whatever flows and offered slots it has: a joiner placing itself
    by them decides as it would from the live relays' specs."""
    swarm = random_swarm(seed)
    network = build_network(swarm, seed)
    network.run_until(60.0)
    relays = sorted((n for n in network.nodes.values() if not n.is_data), key=lambda n: n.node_id)
    network.crash(relays.pop(crashed % len(relays)).node_id)
    network.run_until(120.0)
    demand = sum(n.spec.capacity for n in network.nodes.values() if n.is_data)
    hellos = [n.hello() for n in relays]
    heard = choose_bottleneck(
        swarm.stages, [(h.stage, h.capacity, h.compute_ms) for h in hellos], demand
    )
    held = [(n.spec.stage, n.spec.capacity, n.spec.compute_ms) for n in relays]
    assert heard == choose_bottleneck(swarm.stages, held, demand)
