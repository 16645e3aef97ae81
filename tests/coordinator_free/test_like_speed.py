"""Pipelines of like GPUs: the speed-gap terms, what they make of a swarm of fast and slow relays,
and that equal GPUs route exactly as without them."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtf.coordinator_free.flow_errors import FlowConfigError
from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.protocol.like_speed import (
    hop_penalties_ms,
    speed_gap_ms,
    swap_speed_gain_ms,
    take_over_speed_gain_ms,
)
from gwtf.coordinator_free.protocol.loopback import LoopbackNetwork
from gwtf.coordinator_free.wire import FlowRequest, Hello
from tests.coordinator_free.flow_graphs import (
    ACTIVATION_BYTES,
    Swarm,
    build_network,
    check_consistent,
    random_swarm,
    settle,
    trace_flows,
)

FAST_MS, SLOW_MS = 20.0, 57.0
compute = st.floats(0.0, 10_000.0)


# ---- the terms ---------------------------------------------------------------------------------


def test_hop_penalties_charge_the_gap_beyond_the_best_matched_peer() -> None:
    peers = [("fast", 600.0), ("mid", 1000.0), ("slow", 1714.0)]
    assert hop_penalties_ms(1000.0, peers, 3.0) == {
        "fast": pytest.approx(3 * 400.0),
        "slow": pytest.approx(3 * 714.0),
    }
    assert hop_penalties_ms(1000.0, peers, 0.0) == {}
    # All alike (a data node at 300 ms choosing among equal relays): nothing, not even a shift.
    assert hop_penalties_ms(300.0, [("a", 600.0), ("b", 600.0)], 3.0) == {}


@given(mine=compute, theirs=compute, my_next=compute, their_next=compute)
def test_swap_gain_is_the_drop_of_the_two_gaps(
    mine: float, theirs: float, my_next: float, their_next: float
) -> None:
    gain = swap_speed_gain_ms(mine, theirs, my_next, their_next, 2.0)
    before = speed_gap_ms(mine, my_next) + speed_gap_ms(theirs, their_next)
    after = speed_gap_ms(mine, their_next) + speed_gap_ms(theirs, my_next)
    assert gain == pytest.approx(2.0 * (before - after))
    # Swapping back undoes it.
    assert swap_speed_gain_ms(mine, theirs, their_next, my_next, 2.0) == pytest.approx(-gain)


@given(value=compute)
def test_equal_compute_gives_exactly_zero(value: float) -> None:
    assert swap_speed_gain_ms(value, value, value, value, 3.0) == 0.0
    assert take_over_speed_gain_ms(value, value, value, value, 3.0) == 0.0


def test_take_over_by_a_like_node_gains_and_by_an_unlike_node_loses() -> None:
    # A slow flow (slow -> slow -> slow) carried by a fast peer: a slow node taking it gains.
    assert take_over_speed_gain_ms(SLOW_MS, FAST_MS, SLOW_MS, SLOW_MS, 1.0) == pytest.approx(
        2 * (SLOW_MS - FAST_MS)
    )
    assert take_over_speed_gain_ms(SLOW_MS, SLOW_MS, FAST_MS, SLOW_MS, 1.0) == pytest.approx(
        -2 * (SLOW_MS - FAST_MS)
    )


def test_config_refuses_a_negative_or_non_finite_weight() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(FlowConfigError, match="like_speed_weight"):
            FlowConfig(stages=2, activation_bytes=1.0, like_speed_weight=bad)


# ---- one node ----------------------------------------------------------------------------------


def _hello(stage: int, compute_ms: float) -> Hello:
    return Hello("relay", stage, 2, 4, 4, 0, compute_ms, 0, True)


def test_a_slow_relay_picks_a_slow_next_hop_over_a_slightly_cheaper_fast_one() -> None:
    def first_hop(weight: float) -> str | None:
        config = FlowConfig(stages=2, activation_bytes=1e6, like_speed_weight=weight)
        node = FlowNode(NodeSpec("a", "relay", 1, 4, SLOW_MS), config, random.Random(1))
        node.handle("fast", _hello(2, FAST_MS), 0.0)
        node.handle("slow", _hello(2, SLOW_MS), 0.0)
        for peer_id in ("fast", "slow"):
            node.observe_link(peer_id, 10.0, 1.0)
            node.peers[peer_id].cost_to_sink_ms = 50.0
        node.handle("d0", Hello("data", 0, 2, 4, 4, 0, 10.0, 0, True), 0.0)
        node.observe_link("d0", 10.0, 1.0)
        node.handle("d0", FlowRequest(1, "d0/1", ("d0",), 5.0), 0.0)
        (out,) = node.out_slots.values()
        return out.next_hop

    # The fast hop is cheaper by (57 - 20) / 2 = 18.5 ms of edge cost; the gap costs 3 x 37 ms.
    assert first_hop(0.0) == "fast"
    assert first_hop(3.0) == "slow"


# ---- swarms ------------------------------------------------------------------------------------


def two_speed_swarm(stages: int = 2) -> Swarm:
    """Two data nodes (4 microbatches each), per stage two fast and two slow relays of capacity
    2, every link alike: which relays a flow pairs is a matter of speed only."""
    specs = [NodeSpec(f"d{i}", "data", 0, 4, 10.0) for i in range(2)]
    for stage in range(1, stages + 1):
        for index, ms in enumerate((FAST_MS, FAST_MS, SLOW_MS, SLOW_MS)):
            specs.append(NodeSpec(f"s{stage}r{index}", "relay", stage, 2, ms))
    ids = sorted(s.node_id for s in specs)
    pairs = list(itertools.combinations(ids, 2))
    return Swarm(stages, tuple(specs), dict.fromkeys(pairs, 20.0), dict.fromkeys(pairs, 1.0))


def spreads_ms(swarm: Swarm, paths: list[tuple[str, ...]]) -> list[float]:
    """Per flow, its slowest relay's compute time less its fastest's."""
    result = []
    for path in paths:
        relays = [swarm.spec(n).compute_ms for n in path if swarm.spec(n).role == "relay"]
        result.append(max(relays) - min(relays))
    return result


def run_swarm(swarm: Swarm, seed: int, weight: float) -> LoopbackNetwork:
    config = FlowConfig(
        stages=swarm.stages, activation_bytes=ACTIVATION_BYTES, like_speed_weight=weight
    )
    network = build_network(swarm, seed, config=config)
    network.run_until(300.0)
    settle(network)
    check_consistent(network)
    return network


@pytest.mark.parametrize("seed", range(3))
def test_fast_relays_pair_with_fast_and_slow_with_slow(seed: int) -> None:
    swarm = two_speed_swarm()
    paths = trace_flows(run_swarm(swarm, seed, 3.0))
    # Slot offers at scale 2: fast relays 2 slots, slow round(2 x 20/57 x 2) = 1: six flows.
    assert len(paths) == 6
    assert spreads_ms(swarm, paths) == [0.0] * 6


def test_without_like_speed_the_same_swarm_mixes_speeds() -> None:
    """The test above can fail: the annealing's min-max objective alone mixes speeds here."""
    swarm = two_speed_swarm()
    mixed = [sum(spreads_ms(swarm, trace_flows(run_swarm(swarm, s, 0.0)))) for s in range(3)]
    assert max(mixed) > 0.0


@pytest.mark.parametrize("seed", range(4))
def test_equal_gpus_route_exactly_as_without_like_speed(seed: int) -> None:
    """Relays all alike and data nodes all alike (and faster, as in the grid): every term is 0,
    so the same messages go and the same flows form, to the last message."""
    base = random_swarm(seed)
    alike = {"data": 10.0, "relay": 33.0}
    swarm = replace(base, specs=tuple(replace(s, compute_ms=alike[s.role]) for s in base.specs))
    on, off = run_swarm(swarm, seed, 3.0), run_swarm(swarm, seed, 0.0)
    assert on.delivered == off.delivered
    assert trace_flows(on) == trace_flows(off)
    assert [n.moves_done for n in on.nodes.values()] == [n.moves_done for n in off.nodes.values()]
