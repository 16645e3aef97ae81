"""The lower bound on training time: each term on hand-computed scenarios, and no algorithm the
engine runs ever finishes faster than it (fixed scenarios with every algorithm, random ones with
round-robin)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf.coordinator_free.baselines.swarm import SwarmPolicy
from gwtf.coordinator_free.sim.algorithms import ALGORITHMS, make_policy
from gwtf.coordinator_free.sim.bound import Bound, lower_bound
from gwtf.coordinator_free.sim.bound_lives import Life, relay_lives
from gwtf.coordinator_free.sim.engine import Engine, EngineConfig, run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy
from gwtf.coordinator_free.sim.scenario import ChurnEvent, Scenario, parse_scenario
from tests.coordinator_free.sim_helpers import scenario_document, small_scenario

# The helper's scenarios: 300 ms per stage, 1 MB activations over 2 Gbit/s (4 ms) + 5 ms within a
# region; 10 MB parameters.
HOP_S = 0.004 + 0.005
STAGE_S = 0.3


def _with_events(events: list[dict[str, Any]], **kwargs: Any) -> Scenario:
    return parse_scenario(scenario_document(events=events, **kwargs))


# ---- terms on hand-computed scenarios ----


def test_one_microbatch_is_bounded_by_its_chain_and_round_robin_meets_it() -> None:
    scenario = small_scenario(relays_per_stage=1, data_capacity=1, relay_capacity=1, iterations=1)
    bound = lower_bound(scenario)
    term = bound.per_iteration
    # 2 stages x 300 ms at speed 1, the sink's 300 ms, 6 hops.
    assert term.critical_path_s == pytest.approx(0.9 + 6 * HOP_S)
    assert term.sink_s == pytest.approx(term.critical_path_s)
    # 6 transfers of 4 ms over 3 uplinks; one replica anywhere: nothing to average.
    assert term.uplink_s == pytest.approx(6 * 0.004 / 3)
    assert term.allreduce_s == 0.0
    assert bound.binding in ("sink_s", "critical_path_s")
    metrics = run_scenario(scenario, RoundRobinPolicy())
    assert metrics.sim_time_s >= bound.total_s
    assert metrics.sim_time_s == pytest.approx(bound.total_s, rel=1e-8)  # the bound is exact here


def test_sink_term_spreads_the_batch_over_data_nodes_and_relays_average_by_pigeonhole() -> None:
    scenario = small_scenario(relays_per_stage=3, data_capacity=8, iterations=3)
    term = lower_bound(scenario).per_iteration
    assert term.microbatches == 8
    # Fill (3 hops, 2 forwards of 100 ms) + drain (3 hops, 2 backwards of 200 ms) + 8 x 300 ms.
    assert term.sink_s == pytest.approx(6 * HOP_S + 0.6 + 8 * STAGE_S)
    # 6 always-up relays in 2 stages: some stage has 3, 2/3 of 80 Mbit at 2 Gbit/s + 5 ms, twice.
    assert term.relay_allreduce_s == pytest.approx(2 * (2 / 3 * 0.08 / 2 + 0.005))
    assert term.binding == "sink_s"
    metrics = run_scenario(scenario, RoundRobinPolicy())
    assert metrics.sim_time_s == pytest.approx(lower_bound(scenario).total_s, rel=1e-8)


def test_compute_term_nests_the_stages_windows_and_splits_stages_that_hold() -> None:
    document = scenario_document(relays_per_stage=1, stages=2, data_nodes=4, data_capacity=4)
    for node in document["nodes"]:
        node["speed"] = 10.0 if node["role"] == "data" else 0.5
    fixed = lower_bound(parse_scenario(document)).per_iteration
    # 16 microbatches x 300 ms per stage over 1.0 of relay speed; h_j: 2 hops for stage 1,
    # 4 hops + 600 ms (forward + backward at speed 0.5) for stage 2.
    work, h1, h2 = 16 * STAGE_S, 2 * HOP_S, 4 * HOP_S + 0.6
    nested = max(h1 + 2 * work / 1.0, h2 + work / 1.0)
    # Split: the least λ with work/(λ - h1) + work/(λ - h2) = 1.0.
    split = (h1 + h2 + 2 * work + ((h2 - h1) ** 2 + 4 * work**2) ** 0.5) / 2
    assert fixed.compute_s == pytest.approx(max(nested, split))
    assert fixed.binding == "compute_s"
    document["churn"].update(crash_rate_per_hour=1.0, rejoin=True)  # relays may change stage
    assert lower_bound(parse_scenario(document)).per_iteration.compute_s == pytest.approx(nested)


def test_uplinks_that_may_come_back_are_not_counted() -> None:
    steady = lower_bound(small_scenario(relays_per_stage=2, data_capacity=8)).per_iteration
    # 6 transfers each of 8 microbatches over 5 uplinks, or 2 each over the data node's alone.
    assert steady.uplink_s == pytest.approx(max(6 * 8 / 5, 2 * 8) * 0.004)
    churn = small_scenario(relays_per_stage=2, data_capacity=8, crash_rate_per_hour=5.0)
    assert lower_bound(churn).per_iteration.uplink_s == pytest.approx(2 * 8 * 0.004)
    assert lower_bound(churn).per_iteration.relay_allreduce_s == 0.0


def test_data_nodes_average_exactly_when_all_are_up() -> None:
    scenario = small_scenario(data_nodes=2, regions=2)
    # Two replicas in regions a and b: each sends half of 80 Mbit at 0.5 Gbit/s, 50 ms apart.
    assert lower_bound(scenario).per_iteration.data_allreduce_s == pytest.approx(
        2 * (0.04 / 0.5 + 0.05)
    )


def test_a_data_node_that_joins_or_crashes_early_is_not_counted() -> None:
    joiner = [{"t": 5.0, "node": "d1", "event": "join"}]
    bound = lower_bound(_with_events(joiner, data_nodes=2, data_capacity=4))
    assert bound.counted == ("d0",)
    assert bound.per_iteration.microbatches == 4
    early = [{"t": 0.5, "node": "d1", "event": "crash"}]
    bound = lower_bound(_with_events(early, data_nodes=2, data_capacity=4))
    assert bound.counted == ("d0",)
    late = [{"t": 1e6, "node": "d1", "event": "crash"}]
    bound = lower_bound(_with_events(late, data_nodes=2, data_capacity=4))
    assert bound.counted == ("d0", "d1")
    assert bound.horizon_s == 1e6
    both = lower_bound(small_scenario(data_nodes=2, data_capacity=4))
    assert bound.total_s == pytest.approx(both.total_s)


def test_a_data_node_crash_caps_the_bound_at_its_time() -> None:
    soon = [{"t": 2.0, "node": "d0", "event": "crash"}]
    bound = lower_bound(_with_events(soon, data_capacity=8, iterations=5))
    # Counting d0 gives far more than 2 s, so only "the run lasts 2 s" holds (or, without d0,
    # no microbatch at all: only the averaging).
    assert bound.horizon_s == 2.0
    assert bound.binding == "horizon_s"
    assert bound.total_s == pytest.approx(2.0)


# ---- no algorithm beats the bound ----


def _small_grid(cell: GridCell) -> Scenario:
    """9 relays, 2 data nodes; at 9 crashes per relay-hour (back after 20 s) a run sees a few."""
    size = GridSize(
        stages=3, relays=9, data_nodes=2, data_capacity=4, iterations=4, mean_downtime_s=20.0
    )
    return build_scenario(cell, 0, size)


def _fast_data(document: dict[str, Any]) -> Scenario:
    """Data nodes 10x faster: relays' compute, not the sinks, sets the pace."""
    for node in document["nodes"]:
        if node["role"] == "data":
            node["speed"] = 10.0
    return parse_scenario(document)


def _fixed_scenarios() -> dict[str, Scenario]:
    relay_crash = [{"t": 1.0, "node": "r1_0", "event": "crash"}]
    data_crash = [{"t": 2.0, "node": "d1", "event": "crash"}]
    relay_join = [{"t": 1.5, "node": "r2_1", "event": "join"}]
    gone = [{"t": 0.001, "node": "r1_1", "event": "crash"}]
    return {
        "hom-1reg": small_scenario(relays_per_stage=2, data_capacity=6),
        "het-2reg": small_scenario(data_nodes=2, regions=2, speeds=[1.0, 0.5, 0.7, 0.3]),
        "unplaced": small_scenario(relays_per_stage=3, data_capacity=6, preset_stages=False),
        "relay-crash": _with_events(relay_crash, relays_per_stage=2, data_capacity=4),
        "data-crash-join": _with_events(data_crash + relay_join, data_nodes=2, data_capacity=3),
        "grid-hom-10reg-churn": _small_grid(GridCell(False, True, 9.0)),
        "grid-het-10reg-churn": _small_grid(GridCell(True, True, 9.0)),
        "grid-het-1reg": _small_grid(GridCell(True, False, 0.0)),
        # Relays down for much of the run: the bound counts only the lives (tested lifted below).
        "relay-gone": _fast_data(
            scenario_document(stages=1, data_nodes=2, data_capacity=8, events=gone)
        ),
        "heavy-churn": _fast_data(scenario_document(data_capacity=8, crash_rate_per_hour=300.0)),
    }


LIFTED = ("relay-gone", "heavy-churn")


FIXED = _fixed_scenarios()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", sorted(FIXED))
def test_no_algorithm_finishes_faster_than_the_bound(name: str, algorithm: str) -> None:
    scenario = FIXED[name]
    bound = lower_bound(scenario)
    # The bound is per iteration, behind the engine's barrier; SWARM as released has none (its
    # batches overlap), so it is held to the bound under the barrier.
    policy = SwarmPolicy(barrier=True) if algorithm == "swarm" else make_policy(algorithm)
    metrics = run_scenario(scenario, policy, EngineConfig(max_events=400_000))
    if algorithm == "round_robin":  # the reference policy finishes each: no case is vacuous
        assert metrics.stopped_reason == "finished"
    if metrics.stopped_reason == "finished":
        assert metrics.sim_time_s >= bound.total_s, _explain(bound, metrics.sim_time_s)


@pytest.mark.parametrize("name", LIFTED)
def test_the_lives_lift_the_bound_in_the_churn_scenarios(name: str) -> None:
    bound = lower_bound(FIXED[name])
    assert bound.run_s > 1.05 * bound.iterations * bound.per_iteration.total_s
    assert bound.binding.endswith("+lives")


def _explain(bound: Bound, seconds: float) -> str:
    return f"run took {seconds:.6f} s, bound {bound.total_s:.6f} s: {bound.per_iteration}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stages=st.integers(1, 3),
    relays_per_stage=st.integers(1, 3),
    data_nodes=st.integers(1, 3),
    data_capacity=st.integers(1, 6),
    relay_capacity=st.integers(1, 3),
    regions=st.integers(1, 3),
    speeds=st.lists(st.sampled_from([1.0, 0.6, 0.35, 2.0]), min_size=9, max_size=9),
    crash_rate_per_hour=st.sampled_from([0.0, 0.0, 30.0, 300.0, 900.0]),
    data_speed=st.sampled_from([1.0, 10.0]),
    events=st.lists(
        st.tuples(st.floats(0.0, 20.0), st.integers(0, 20), st.sampled_from(["crash", "join"])),
        max_size=3,
    ),
)
def test_round_robin_never_beats_the_bound_on_random_scenarios(
    stages: int,
    relays_per_stage: int,
    data_nodes: int,
    data_capacity: int,
    relay_capacity: int,
    regions: int,
    speeds: list[float],
    crash_rate_per_hour: float,
    data_speed: float,
    events: list[tuple[float, int, str]],
) -> None:
    document = scenario_document(
        relays_per_stage=relays_per_stage,
        stages=stages,
        data_nodes=data_nodes,
        data_capacity=data_capacity,
        relay_capacity=relay_capacity,
        regions=regions,
        speeds=speeds,
        crash_rate_per_hour=crash_rate_per_hour,
    )
    for node in document["nodes"]:
        if node["role"] == "data":  # fast data nodes leave the relays' lives to bind
            node["speed"] = data_speed
    ids = [node["id"] for node in document["nodes"]]
    document["churn"]["events"] = [
        {"t": t, "node": ids[index % len(ids)], "event": kind} for t, index, kind in events
    ]
    scenario = replace(parse_scenario(document), seed=len(events) + data_capacity)
    bound = lower_bound(scenario)
    metrics = run_scenario(scenario, RoundRobinPolicy(), EngineConfig(max_events=200_000))
    if metrics.stopped_reason == "finished":
        assert metrics.sim_time_s >= bound.total_s, _explain(bound, metrics.sim_time_s)


# ---- the relays' lives ----


def test_lives_replay_the_engines_crashes_and_rejoins_exactly() -> None:
    # Each relay crashes after 4 s up and is back after 30 s, on average.
    scenario = small_scenario(relays_per_stage=2, iterations=30, crash_rate_per_hour=900.0)
    engine = Engine(scenario, RoundRobinPolicy(), EngineConfig(max_sim_time_s=300.0))
    metrics = engine.run()
    assert metrics.crashes >= 4 and metrics.joins >= 2  # the run sees churn: not vacuous
    end = metrics.sim_time_s
    replayed = sorted(
        (t, life.relay, up)
        for life in relay_lives(scenario, end)
        for t, up in ((life.start_s, True), (life.end_s, False))
        if t <= end
    )
    logged = sorted((t, node, up) for t, node, up in engine.liveness if node.startswith("r"))
    assert replayed == logged


def test_a_relay_down_for_the_run_is_not_credited() -> None:
    calm = lower_bound(_fast_data(scenario_document(stages=1, data_nodes=2, data_capacity=8)))
    scenario = FIXED["relay-gone"]
    bound = lower_bound(scenario)
    # 16 microbatches x 300 ms on one relay instead of two, between a hop in and a hop out; the
    # lone replica has nothing to average with, the two data nodes 2 x (40 Mbit / 2 Gbit/s + 5 ms).
    assert calm.total_s == pytest.approx(3 * (2 * HOP_S + 2.4 + 0.05))
    assert bound.total_s == pytest.approx(3 * (2 * HOP_S + 4.8 + 0.05))
    assert bound.binding == "compute_s+lives"
    metrics = run_scenario(scenario, RoundRobinPolicy(), EngineConfig(max_events=400_000))
    assert metrics.stopped_reason == "finished"
    assert metrics.sim_time_s >= bound.total_s, _explain(bound, metrics.sim_time_s)


def test_a_relay_that_crashes_mid_iteration_is_credited_until_its_crash() -> None:
    crash = [{"t": 1.0, "node": "r1_1", "event": "crash"}]
    scenario = _fast_data(scenario_document(stages=1, data_nodes=2, data_capacity=8, events=crash))
    bound = lower_bound(scenario)
    # First iteration: 4.8 s of work in [hop, e - hop], r1_1 doing its share until 1.0 s;
    # then the data nodes average (the lone relay has nobody to average with); then r1_0 alone.
    first = 4.8 - (1.0 - HOP_S) + 2 * HOP_S
    assert bound.total_s == pytest.approx(first + 0.05 + 2 * (4.8 + 2 * HOP_S + 0.05))
    metrics = run_scenario(scenario, RoundRobinPolicy(), EngineConfig(max_events=400_000))
    assert metrics.stopped_reason == "finished"
    assert metrics.sim_time_s >= bound.total_s, _explain(bound, metrics.sim_time_s)


def test_a_relay_whose_churn_cannot_be_replayed_counts_as_always_up() -> None:
    scenario = small_scenario(relays_per_stage=2, crash_rate_per_hour=100.0)
    crash = ChurnEvent(t=1.0, node="r1_0", event="crash")
    touched = replace(scenario, churn=replace(scenario.churn, events=(crash,)))
    lives = [life for life in relay_lives(touched, 1e6) if life.relay == "r1_0"]
    assert lives == [Life("r1_0", 1.0, 0.0, math.inf, exact=False)]
