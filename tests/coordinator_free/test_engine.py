"""Simulator invariants, checked with the round-robin reference policy and the baselines."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf.coordinator_free.baselines.swarm import SwarmPolicy
from gwtf.coordinator_free.sim.algorithms import make_policy
from gwtf.coordinator_free.sim.engine import ComputeRecord, Engine, EngineConfig, run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.policy import (
    Forward,
    HopDecision,
    MicrobatchView,
    PolicyContractError,
    WorldView,
)
from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy
from gwtf.coordinator_free.sim.scenario import Scenario, parse_scenario
from tests.coordinator_free.sim_helpers import scenario_document, small_scenario


def _traced(scenario: Scenario, policy: object, max_sim_time_s: float = 36_000.0) -> Engine:
    config = EngineConfig(max_sim_time_s=max_sim_time_s, record_trace=True)
    engine = Engine(scenario, policy, config)  # type: ignore[arg-type]
    engine.run()
    return engine


def _up_intervals(engine: Engine) -> dict[str, list[tuple[float, float]]]:
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    up_since: dict[str, float] = {}
    for when, node, alive in engine.liveness:
        if alive:
            up_since[node] = when
        else:
            intervals[node].append((up_since.pop(node), when))
    for node, since in up_since.items():
        intervals[node].append((since, float("inf")))
    return intervals


def test_one_microbatch_takes_exactly_compute_plus_transfers() -> None:
    # One relay per stage, one microbatch: 2 relays x (100 fwd + 200 bwd) + 300 sink = 900 ms,
    # plus 6 hops of 5 ms latency + 1 MB at 2 Gbit/s (4 ms); no all-reduce with one replica.
    scenario = small_scenario(relays_per_stage=1, data_capacity=1, relay_capacity=1, iterations=1)
    metrics = run_scenario(scenario, RoundRobinPolicy())
    assert metrics.sim_time_s == pytest.approx(0.9 + 6 * 0.009)
    assert metrics.total_gpu_s == pytest.approx(0.9)
    assert metrics.wasted_gpu_s == pytest.approx(0.0)


def test_every_microbatch_completes_without_churn() -> None:
    scenario = small_scenario(relays_per_stage=3, data_capacity=8, iterations=4)
    metrics = run_scenario(scenario, RoundRobinPolicy())
    assert metrics.stopped_reason == "finished"
    assert metrics.iterations_completed == 4
    assert metrics.microbatches_completed == metrics.microbatches_injected == 32
    assert metrics.useful_gpu_s == pytest.approx(metrics.total_gpu_s)


def test_capacity_is_enforced_by_admission() -> None:
    # Round-robin ignores capacity; the engine makes the extra forwards wait for a slot.
    scenario = small_scenario(relays_per_stage=1, data_capacity=6, relay_capacity=2)
    engine = _traced(scenario, RoundRobinPolicy())
    assert engine.metrics.admission_waits > 0
    assert engine.metrics.capacity_exceeded == 0
    assert engine.metrics.microbatches_completed == 18


def test_a_crash_after_forward_is_repaired_by_recomputing_only_that_hop() -> None:
    # r1_0 computes its forward by ~0.11 s, then dies; the backward to it times out (20 s) and
    # the hop is recomputed on r1_1. The microbatch is not restarted.
    events = [{"t": 0.2, "node": "r1_0", "event": "crash"}]
    scenario = small_scenario(data_capacity=1, relay_capacity=1, iterations=1, events=events)
    metrics = run_scenario(scenario, RoundRobinPolicy())
    assert metrics.backward_timeouts == 1
    assert metrics.replacements == 1
    assert metrics.restarts == 0
    assert metrics.microbatches_completed == 1
    assert metrics.wasted_gpu_s == pytest.approx(0.1)  # the lost forward of r1_0
    assert metrics.sim_time_s > 20.0


def test_a_forward_to_a_dead_node_is_resent_after_its_deadline() -> None:
    events = [{"t": 0.0, "node": "r1_0", "event": "crash"}]
    scenario = small_scenario(data_capacity=1, relay_capacity=1, iterations=1, events=events)
    metrics = run_scenario(scenario, RoundRobinPolicy(forward_timeout_s=5.0))
    assert metrics.forward_timeouts == 1
    assert metrics.hops_lost == 1
    assert metrics.microbatches_completed == 1
    assert 5.0 < metrics.sim_time_s < 6.1  # + 0.954 s of work, + 0.05 s all-reduce of stage 2


def test_a_forward_acked_after_its_deadline_is_sent_again_from_the_sender() -> None:
    # r1_0 computes the forward in 200 ms: with the 9 ms transfer and the 5 ms ack it answers
    # after the 211 ms deadline, having already sent the microbatch on to stage 2. The re-send
    # to r1_1 starts again at stage 1: no stage is skipped and no slot is left held.
    document = scenario_document(
        data_capacity=1, relay_capacity=1, iterations=1, speeds=[0.5, 2.0, 1.0, 1.0]
    )
    document["nodes"][0]["speed"] = 10.0  # the sink answers in time (30 ms)
    engine = Engine(parse_scenario(document), RoundRobinPolicy(forward_timeout_s=0.211))
    metrics = engine.run()
    assert metrics.forward_timeouts == 1
    assert metrics.microbatches_completed == 1
    # The final path: r1_1 (50 + 100 ms), a stage-2 relay (300 ms), the sink (30 ms).
    assert metrics.useful_gpu_s == pytest.approx(0.48)
    assert all(not node.held and not node.waiting for node in engine.world.nodes.values())


@pytest.mark.parametrize("policy_name", ["round_robin", "swarm"])
def test_under_churn_work_is_done_or_redone_and_never_on_a_dead_node(policy_name: str) -> None:
    scenario = small_scenario(
        relays_per_stage=3, data_capacity=6, iterations=40, crash_rate_per_hour=40.0
    )
    policy = RoundRobinPolicy() if policy_name == "round_robin" else SwarmPolicy()
    engine = _traced(scenario, policy)
    metrics = engine.metrics
    assert metrics.crashes > 0
    assert metrics.stopped_reason == "finished"
    assert metrics.microbatches_completed == metrics.microbatches_injected == 240
    assert metrics.total_gpu_s >= metrics.useful_gpu_s
    up = _up_intervals(engine)
    for record in engine.trace:
        assert _inside(record, up[record.node_id]), record


def _inside(record: ComputeRecord, intervals: list[tuple[float, float]]) -> bool:
    return any(lo <= record.start_s and record.end_s <= hi for lo, hi in intervals)


def test_same_seed_same_run_and_churn_is_the_same_for_every_policy() -> None:
    scenario = build_scenario(GridCell(True, True, 1.0), 3, GridSize(iterations=15))
    first = run_scenario(scenario, SwarmPolicy()).to_json()
    second = run_scenario(scenario, SwarmPolicy()).to_json()
    assert first == second
    a = Engine(scenario, SwarmPolicy())
    a.run()
    b = Engine(scenario, RoundRobinPolicy())
    b.run()
    horizon = min(a.now, b.now)
    crashes_a = [(t, n) for t, n, alive in a.liveness if not alive and t < horizon]
    crashes_b = [(t, n) for t, n, alive in b.liveness if not alive and t < horizon]
    assert crashes_a == crashes_b


def test_a_joiner_is_absent_until_its_join_then_works() -> None:
    events = [{"t": 2.0, "node": "r1_1", "event": "join"}]
    scenario = small_scenario(data_capacity=4, iterations=6, events=events, preset_stages=False)
    engine = _traced(scenario, RoundRobinPolicy())
    assert engine.metrics.joins == 1
    joiner = [r for r in engine.trace if r.node_id == "r1_1"]
    assert joiner, "the joiner was never used"
    assert min(r.start_s for r in joiner) > 2.0


class _WrongStagePolicy(RoundRobinPolicy):
    name: ClassVar[str] = "wrong"

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        return Forward(world.nodes_in_stage(world.stages)[0])


def test_a_policy_that_breaks_the_contract_is_stopped() -> None:
    with pytest.raises(PolicyContractError, match="routed"):
        run_scenario(small_scenario(), _WrongStagePolicy())


def test_liveness_is_hidden_from_policies_without_full_knowledge() -> None:
    engine = Engine(small_scenario(), RoundRobinPolicy())
    with pytest.raises(PolicyContractError, match="deadlines"):
        engine.world.is_alive("r1_0")


def test_time_limit_stops_a_run_that_cannot_finish() -> None:
    # Every relay of stage 2 dies for good: nothing can finish.
    events = [{"t": 0.0, "node": f"r2_{i}", "event": "crash"} for i in range(2)]
    scenario = small_scenario(data_capacity=2, iterations=2, events=events)
    metrics = run_scenario(scenario, RoundRobinPolicy(), EngineConfig(max_sim_time_s=300.0))
    assert metrics.stopped_reason in ("time_limit", "deadlock")
    assert metrics.iterations_completed == 0


def test_random_schedules_keep_conservation() -> None:
    # Many random explicit crashes and joins: the run still finishes with nothing lost.
    rng = random.Random(5)
    events = []
    for _ in range(12):
        node = f"r{rng.randint(1, 2)}_{rng.randint(0, 2)}"
        t = rng.uniform(0, 40)
        events.append({"t": t, "node": node, "event": "crash"})
        events.append({"t": t + rng.uniform(1, 20), "node": node, "event": "join"})
    scenario = small_scenario(relays_per_stage=3, data_capacity=6, iterations=20, events=events)
    metrics = run_scenario(scenario, SwarmPolicy(forward_timeout_s=5, backward_timeout_s=10))
    assert metrics.stopped_reason == "finished"
    assert metrics.microbatches_completed == metrics.microbatches_injected


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    relays_per_stage=st.integers(2, 3),
    stages=st.integers(1, 3),
    capacity=st.integers(1, 3),
    crashes=st.lists(
        st.tuples(st.floats(0.0, 30.0), st.integers(0, 8), st.floats(0.5, 30.0)), max_size=6
    ),
    policy_name=st.sampled_from(["round_robin", "swarm", "dtfm", "central"]),
)
def test_property_conservation_and_liveness(
    relays_per_stage: int,
    stages: int,
    capacity: int,
    crashes: list[tuple[float, int, float]],
    policy_name: str,
) -> None:
    # Any crash/rejoin pattern that leaves every relay back up eventually: the run finishes,
    # every injected microbatch completes, and no compute runs on a dead node.
    relays = [f"r{s}_{i}" for s in range(1, stages + 1) for i in range(relays_per_stage)]
    events = []
    for t, index, downtime in crashes:
        node = relays[index % len(relays)]
        events.append({"t": t, "node": node, "event": "crash"})
        events.append({"t": t + downtime, "node": node, "event": "join"})
    events.extend({"t": 200.0, "node": node, "event": "join"} for node in relays)
    scenario = small_scenario(
        relays_per_stage=relays_per_stage,
        stages=stages,
        relay_capacity=capacity,
        data_capacity=4,
        iterations=3,
        events=events,
    )
    engine = _traced(scenario, make_policy(policy_name), max_sim_time_s=1500.0)
    metrics = engine.metrics
    assert metrics.stopped_reason == "finished", metrics.to_json()
    assert metrics.microbatches_completed == metrics.microbatches_injected == 12
    up = _up_intervals(engine)
    assert all(_inside(r, up[r.node_id]) for r in engine.trace)
