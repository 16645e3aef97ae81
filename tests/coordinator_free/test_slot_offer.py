"""A relay offers slots in proportion to its speed against its same-stage peers, and the
optimum's speed-aware capacities follow the same rule with full knowledge."""

from __future__ import annotations

import random

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtf.coordinator_free.baselines.central import CentralPolicy, build_flow_graph
from gwtf.coordinator_free.flow_errors import FlowConfigError
from gwtf.coordinator_free.placement import offered_slots
from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.protocol.liveness import REFERENCE_WATCH_INTERVALS
from gwtf.coordinator_free.sim.engine import run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.world import World
from gwtf.coordinator_free.wire import FlowAccept, FlowReject, FlowRequest, Hello, Ping
from gwtf.errors import ConfigError
from tests.coordinator_free.flow_graphs import build_network, random_swarm, settle, trace_flows

# The scale these tests count slots with (a slow relay at 0.35 offers 2 of 4).
CONFIG = FlowConfig(stages=2, activation_bytes=1e6, slot_speed_scale=1.5)


def relay(compute_ms: float, capacity: int = 4, config: FlowConfig = CONFIG) -> FlowNode:
    spec = NodeSpec("a", "relay", 1, capacity, compute_ms)
    return FlowNode(spec, config, random.Random(1))


def hello(stage: int, compute_ms: float, role: str = "relay") -> Hello:
    return Hello(role, stage, CONFIG.stages, 4, 4, 0, compute_ms, 0, True)


# ---- the rule ----------------------------------------------------------------------------------


@given(
    capacity=st.integers(1, 64),
    mine_ms=st.floats(1.0, 10_000.0),
    fastest_ms=st.floats(0.0, 10_000.0),
    scale=st.floats(0.0, 5.0),
)
def test_offer_is_between_one_and_capacity(
    capacity: int, mine_ms: float, fastest_ms: float, scale: float
) -> None:
    assert 1 <= offered_slots(capacity, mine_ms, fastest_ms, scale) <= capacity


@pytest.mark.parametrize("scale", [1.0, 1.5, 2.0])
def test_equal_speeds_offer_every_slot(scale: float) -> None:
    assert offered_slots(4, 600.0, 600.0, scale) == 4


def test_slower_relays_offer_fewer_slots_and_scale_zero_offers_all() -> None:
    # The grid's GPUs: 600 ms at speed 1.0, 1,000 ms at 0.6, 1,714 ms at 0.35.
    assert offered_slots(4, 1000.0, 600.0, 1.5) == 4  # 4 x 0.6 x 1.5 = 3.6
    assert offered_slots(4, 1714.0, 600.0, 1.5) == 2  # 4 x 0.35 x 1.5 = 2.1
    assert offered_slots(4, 1714.0, 600.0, 1.0) == 1
    assert offered_slots(1, 10_000.0, 1.0, 1.5) == 1  # at least one
    assert offered_slots(4, 1714.0, 600.0, 0.0) == 4  # switched off
    # A "fastest" slower than the node itself (stale news) never raises the offer.
    assert offered_slots(4, 600.0, 1714.0, 1.5) == 4
    # A peer claiming to be a thousand times faster cuts it as one four times faster would.
    assert offered_slots(8, 1000.0, 1.0, 1.5) == offered_slots(8, 1000.0, 250.0, 1.5) == 3


def test_config_refuses_a_negative_or_infinite_scale() -> None:
    for bad in (-0.5, float("inf"), float("nan")):
        with pytest.raises(FlowConfigError, match="slot_speed_scale"):
            FlowConfig(stages=2, activation_bytes=1.0, slot_speed_scale=bad)


# ---- one relay ---------------------------------------------------------------------------------


def test_a_slow_relay_offers_fewer_slots_once_it_hears_of_a_faster_peer() -> None:
    node = relay(1714.0)
    assert node.spare == 4  # alone, it is the fastest it knows
    node.handle("fast", hello(1, 600.0), 0.0)
    assert node.offered_slots() == 2 and node.spare == 2
    assert node.hello().capacity == 4 and node.hello().spare == 2
    node.handle("faster-upstream", hello(0, 100.0, role="data"), 0.0)  # other stages: no effect
    assert node.spare == 2
    node.peer_dead("fast", 1.0)  # the fast peer gone: every slot again
    assert node.spare == 4


def test_a_slow_relay_watches_the_peer_that_cuts_its_offer_and_offers_all_when_it_dies() -> None:
    """Keep-alives watch flow partners; a faster same-stage peer is none, yet a relay that never
    learned it died would offer fewer slots for good (its stage then carried half the max flow
    after the fastest relay crashed)."""
    node = relay(1714.0)
    node.handle("fast", hello(1, 600.0), 0.0)
    assert node.speed_reference() == "fast" and "fast" in node.flow_partners()
    # It carries none of this relay's flows: watched after a few quiet intervals, not one.
    interval = REFERENCE_WATCH_INTERVALS * CONFIG.keepalive_interval_s
    assert node.next_keepalive_s(0.0) == interval
    assert not [o for o in node.keepalive(interval - 1.0) if isinstance(o.message, Ping)]
    pings = [o for o in node.keepalive(interval) if isinstance(o.message, Ping)]
    assert [o.to for o in pings] == ["fast"]
    now = interval
    for _ in range(CONFIG.keepalive_misses):  # it never answers
        now += CONFIG.keepalive_timeout_s + 0.1
        node.keepalive(now)
    assert not node.peers["fast"].alive
    assert node.speed_reference() is None and node.spare == 4


def test_equal_peers_change_nothing_and_scale_zero_ignores_speeds() -> None:
    node = relay(600.0)
    node.handle("twin", hello(1, 600.0), 0.0)
    assert node.spare == 4
    off = relay(1714.0, config=FlowConfig(stages=2, activation_bytes=1e6, slot_speed_scale=0.0))
    off.handle("fast", hello(1, 600.0), 0.0)
    assert off.spare == 4


def test_flows_held_beyond_a_lowered_offer_are_kept_and_no_new_one_is_taken() -> None:
    node = relay(1714.0)
    node.handle("d0", hello(0, 10.0, role="data"), 0.0)
    for slot in range(3):
        sends = node.handle("d0", FlowRequest(slot, f"d0/{slot}", ("d0",), 5.0), 0.0)
        assert any(isinstance(s.message, FlowAccept) for s in sends)
    node.handle("fast", hello(1, 600.0), 1.0)  # now it offers 2 and holds 3
    assert len(node.in_slots) == 3 and node.spare == -1
    assert node.hello().spare == 0
    sends = node.handle("d0", FlowRequest(9, "d0/9", ("d0",), 5.0), 2.0)
    assert [type(s.message) for s in sends] == [FlowReject]
    node.check_invariants()


# ---- swarms ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 5, 9])
def test_relays_carry_no_more_flows_than_they_offer(seed: int) -> None:
    swarm = random_swarm(seed, capacity=(2, 4))
    network = build_network(swarm, seed)
    network.run_until(200.0)
    settle(network)
    paths = trace_flows(network)
    assert paths
    relays = [n for n in network.nodes.values() if not n.is_data]
    assert all(len(n.in_slots) <= n.offered_slots() <= n.spec.capacity for n in relays)
    slow = [n for n in relays if n.offered_slots() < n.spec.capacity]
    assert slow  # the instances mix 20 / 33 / 57 ms GPUs: some relays offer fewer slots


def test_optimum_graph_gives_slow_relays_fewer_slots() -> None:
    scenario = build_scenario(GridCell(True, False, 0.0), 0, GridSize(iterations=1))
    world = World(scenario, full_knowledge=True)
    for index, entry in enumerate(scenario.nodes):
        world.mark_known(entry.id)
        world.nodes[entry.id].alive = True
        if entry.role == "relay":
            world.assign_stage(entry.id, 1 + index % scenario.model.stages)
    every = build_flow_graph(world, world.is_alive)
    scaled = build_flow_graph(world, world.is_alive, 1.5)
    for stage in range(1, scenario.model.stages + 1):
        members = world.nodes_in_stage(stage)
        fastest = max(world.spec(r).speed for r in members)
        for r in members:
            expected = offered_slots(4, 1 / world.spec(r).speed, 1 / fastest, 1.5)
            assert scaled[f"in:{r}"][f"out:{r}"]["capacity"] == expected
            assert every[f"in:{r}"][f"out:{r}"]["capacity"] == 4
    assert nx.maximum_flow_value(scaled, "__source__", "__sink__") <= nx.maximum_flow_value(
        every, "__source__", "__sink__"
    )


def test_optimum_with_speed_aware_slots_runs_and_refuses_a_bad_scale() -> None:
    scenario = build_scenario(GridCell(True, False, 0.0), 1, GridSize(iterations=3))
    metrics = run_scenario(scenario, CentralPolicy(slot_speed_scale=2.0))
    assert metrics.iterations_completed == 3 and metrics.capacity_exceeded == 0
    with pytest.raises(ConfigError, match="slot_speed_scale"):
        CentralPolicy(slot_speed_scale=0.0)


def test_optimum_never_forwards_to_a_relay_that_came_back_at_another_stage() -> None:
    # 100 % of relays crash per hour: relay0 crashes and comes back placed at stage 1 while a
    # microbatch's route (and a forward deadline) still named it for stage 2; that forward was
    # a contract violation until routes were checked against the current stage.
    scenario = build_scenario(GridCell(True, True, 1.0), 2, GridSize(iterations=30))
    metrics = run_scenario(scenario, CentralPolicy(slot_speed_scale=2.0))
    assert metrics.stopped_reason == "finished" and metrics.iterations_completed == 30
