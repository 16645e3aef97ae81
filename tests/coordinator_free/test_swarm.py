"""SWARM as released, and the rules every algorithm shares: the client-routed data plane, the
balancer, bans, one membership view, one watchdog rule, waste split by cause."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from gwtf.coordinator_free.baselines.swarm import (
    BACKWARD_TIMEOUT_S,
    BLOCKWISE_8BIT_RATIO,
    SwarmPolicy,
)
from gwtf.coordinator_free.baselines.swarm_balancer import Balancer, PerformanceEma
from gwtf.coordinator_free.sim.algorithms import ALGORITHMS, make_policy
from gwtf.coordinator_free.sim.engine import Engine, EngineConfig, run_scenario
from gwtf.coordinator_free.sim.policy import HopReport, PolicyTiming
from gwtf.coordinator_free.sim.scenario import parse_scenario
from gwtf.coordinator_free.sim.world import ANNOUNCE_PERIOD_S, MEMBERSHIP_EXPIRY_S
from tests.coordinator_free.sim_helpers import live_world, scenario_document, small_scenario

# ---- the client-routed data plane ----


def test_swarm_calls_every_stage_from_the_trainer_and_recomputes_each_forward() -> None:
    # One relay per stage, one microbatch; a transfer of 1 MB at 2 Gbit/s is 4 ms + 5 ms latency.
    # Forward: d0 -> r1 -> d0 -> r2 -> d0, each relay 100 ms; loss 300 ms at d0 (no transfer).
    # Backward, per stage: input and gradient to the relay (8 ms on d0's uplink + 5 ms), the
    # forward again and the backward (300 ms), the input gradient back (9 ms).
    scenario = small_scenario(relays_per_stage=1, data_capacity=1, relay_capacity=1, iterations=1)
    metrics = run_scenario(scenario, SwarmPolicy())
    forward = 4 * 0.009 + 2 * 0.1
    backward = 2 * (0.013 + 0.3 + 0.009)
    assert metrics.sim_time_s == pytest.approx(forward + 0.3 + backward)
    assert metrics.total_gpu_s == pytest.approx(1.1)
    # The first forward of each stage is work done twice, and counted so.
    assert metrics.recomputed_gpu_s == pytest.approx(0.2)
    assert metrics.wasted_gpu_s == pytest.approx(0.2)


def test_a_backward_goes_to_any_peer_of_the_stage_not_the_forward_one() -> None:
    scenario = small_scenario(relays_per_stage=3, data_capacity=12, relay_capacity=8)
    engine = Engine(scenario, SwarmPolicy(), EngineConfig(record_trace=True))
    metrics = engine.run()
    assert metrics.microbatches_completed == metrics.microbatches_injected
    # Relays hold nothing between forward and backward, so their slots never overflow on
    # forwards, and every stage's calls are spread over all three peers.
    assert Counter(r.node_id for r in engine.trace if r.node_id.startswith("r1")).keys() == {
        "r1_0",
        "r1_1",
        "r1_2",
    }


# ---- the balancer ----


def test_the_balancer_gives_calls_in_proportion_to_measured_throughput() -> None:
    balancer = Balancer(random.Random(1))
    members = ("fast", "slow")
    picks = Counter()
    for _ in range(500):
        peer = balancer.pick(1.0, lambda: members, lambda _: 0.0, 0.0)
        assert peer is not None
        picks[peer] += 1
        balancer.observe(peer, 1.0, 0.25 if peer == "fast" else 1.0)
    assert picks["fast"] == pytest.approx(400, abs=10)


def test_the_throughput_average_is_bias_corrected() -> None:
    ema = PerformanceEma()
    assert ema.expected_s(2.0) == 2.0  # never measured: a second per unit of work
    ema.update(1.0, 0.5)
    assert ema.expected_s(1.0) == pytest.approx(0.5)  # not 0.05, as an uncorrected EMA gives
    ema.update(1.0, 1.5)
    assert ema.expected_s(1.0) == pytest.approx((0.1 * 1.5 + 0.09 * 0.5) / 0.19)


def test_a_banned_peer_waits_for_its_next_announcement() -> None:
    balancer = Balancer(random.Random(1))
    announced = {"a": 0.0, "b": 0.0}
    balancer.pick(1.0, lambda: ("a", "b"), announced.__getitem__, 0.0)
    balancer.ban("a", 10.0)
    for t in (10.0, 45.0):
        assert balancer.pick(1.0, lambda: ("a", "b"), announced.__getitem__, t) == "b"
    announced["a"] = 60.0  # it announced itself again: the next refresh takes it back
    picks = {balancer.pick(1.0, lambda: ("a", "b"), announced.__getitem__, 80.0) for _ in "xyz"}
    assert "a" in picks


def test_swarm_learns_from_acknowledged_calls() -> None:
    scenario = small_scenario(relays_per_stage=2)
    world = live_world(scenario)
    policy = SwarmPolicy()
    for _ in range(30):  # r1_0 answers in 10 s (overloaded), r1_1 in 0.1 s
        policy.on_hop_acked(world, HopReport(0, "d0", "r1_0", 1, "forward", 0.0, 10.0), 0.0)
        policy.on_hop_acked(world, HopReport(0, "d0", "r1_1", 1, "forward", 0.0, 0.1), 0.0)
        policy.pick(world, "d0", 1, 1.0, 0.0)  # the balancer knows a peer once it chose it
    picks = Counter(policy.pick(world, "d0", 1, 1.0, 0.0) for _ in range(200))
    assert picks["r1_0"] <= 4


def test_swarm_faster_peer_does_more_work_in_a_run() -> None:
    scenario = small_scenario(relays_per_stage=2, data_capacity=8, speeds=[1.0, 0.35, 1.0, 1.0])
    engine = Engine(scenario, SwarmPolicy(), EngineConfig(record_trace=True))
    engine.run()
    tasks = Counter(r.node_id for r in engine.trace)
    assert tasks["r1_0"] > 1.5 * tasks["r1_1"]


def test_swarm_rebalancing_moves_a_peer_to_the_weakest_stage() -> None:
    scenario = small_scenario(relays_per_stage=3, speeds=[1.0, 1.0, 1.0, 0.3, 0.3, 0.3])
    world = live_world(scenario)
    move = SwarmPolicy().rebalancing_move(world)
    assert move is not None
    assert move.stage == 2
    assert world.stage_of(move.node_id) == 1


# ---- rules every algorithm shares ----


def test_a_dead_node_leaves_the_membership_view_after_the_expiry() -> None:
    world = live_world(small_scenario(relays_per_stage=2))
    crash_at = 100.0
    node = world.nodes["r1_0"]
    node.alive, node.down_at_s = False, crash_at
    last = (crash_at // ANNOUNCE_PERIOD_S) * ANNOUNCE_PERIOD_S
    assert world.announced_at("r1_0") == last
    world.now_s = last + MEMBERSHIP_EXPIRY_S - 1.0
    assert "r1_0" in world.nodes_in_stage(1)
    world.now_s = last + MEMBERSHIP_EXPIRY_S + 1.0
    assert world.nodes_in_stage(1) == ("r1_1",)
    assert world.announced_at("r1_1") == pytest.approx(
        (world.now_s // ANNOUNCE_PERIOD_S) * ANNOUNCE_PERIOD_S
    )


def test_the_watchdog_is_twice_the_longest_hop_deadline_for_everyone() -> None:
    assert PolicyTiming(20.0, 20.0).stall_timeout_s == 40.0
    assert SwarmPolicy().timing().stall_timeout_s == 2 * BACKWARD_TIMEOUT_S


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_waste_is_split_by_cause_and_the_causes_add_up(algorithm: str) -> None:
    scenario = small_scenario(
        relays_per_stage=3, data_capacity=6, iterations=25, crash_rate_per_hour=60.0
    )
    metrics = run_scenario(scenario, make_policy(algorithm))
    assert metrics.crashes > 0
    causes = metrics.waste_by_cause()
    named = sum(v for k, v in causes.items() if k != "superseded")
    assert named <= metrics.wasted_gpu_s + 1e-6
    assert sum(causes.values()) == pytest.approx(metrics.wasted_gpu_s)
    assert metrics.useful_gpu_s + metrics.wasted_gpu_s == pytest.approx(metrics.total_gpu_s)
    assert metrics.to_json()["wasted_by_cause_gpu_s"].keys() == causes.keys()
    assert sum(metrics.crashes_by_phase.values()) == metrics.crashes


def test_crashes_land_in_forwards_and_in_backwards() -> None:
    scenario = small_scenario(
        relays_per_stage=3, data_capacity=12, iterations=40, crash_rate_per_hour=120.0
    )
    phases = run_scenario(scenario, make_policy("gwtf")).crashes_by_phase
    assert phases["forward"] > 0 and phases["backward"] > 0


# ---- the trainer's deadline covers the whole call ----


def test_a_slow_answer_to_a_backward_call_times_out_at_the_trainer() -> None:
    # The relay's link back to the trainer is slow: 1 MB at 0.3 Mbit/s takes ~27 s, more than the
    # 20 s backward deadline but less than the 60 s forward one. In SWARM the deadline belongs to
    # the trainer's call (request, compute and answer); the relay has no deadline of its own, so
    # the call times out at the trainer (which has no other peer: it waits), and nothing asks for
    # a stage-0 repair.
    document = scenario_document(
        relays_per_stage=1, stages=1, regions=2, data_nodes=2, data_capacity=1
    )
    for node in document["nodes"]:
        node["region"] = "b" if node["role"] == "relay" else "a"
    document["topology"]["bandwidth_gbps"][1][0] = 0.0003
    timeouts: list[str] = []

    class Recording(SwarmPolicy):
        def on_backward_timeout(self, world, node_id, mb, suspect, now):  # type: ignore[no-untyped-def]
            timeouts.append(node_id)
            return super().on_backward_timeout(world, node_id, mb, suspect, now)

    policy = Recording(forward_timeout_s=60.0, backward_timeout_s=20.0)
    metrics = run_scenario(parse_scenario(document), policy, EngineConfig(max_sim_time_s=400.0))
    assert metrics.stopped_reason == "finished"
    assert metrics.backward_timeouts > 0
    assert timeouts and set(timeouts) <= {"d0", "d1"}


# ---- no global barrier; 8-bit activations ----


class _Watched(SwarmPolicy):
    """SWARM recording when each microbatch first leaves its trainer and when batches end."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first_sent: dict[int, float] = {}
        self.batch_ends: list[float] = []

    def choose_next_hop(self, world, node_id, mb, now):  # type: ignore[no-untyped-def]
        if mb.stage == 0:
            self.first_sent.setdefault(mb.mb_id, now)
        return super().choose_next_hop(world, node_id, mb, now)

    def on_iteration_end(self, world, iteration, now):  # type: ignore[no-untyped-def]
        self.batch_ends.append(now)
        return super().on_iteration_end(world, iteration, now)


def test_swarm_trainers_send_the_next_sample_without_waiting_for_the_batch() -> None:
    scenario = small_scenario(
        relays_per_stage=2, data_nodes=2, data_capacity=3, iterations=4, speeds=[1, 0.35] * 2
    )
    policy = _Watched()
    engine = Engine(scenario, policy, EngineConfig(record_trace=True))
    metrics = engine.run()
    batch = 2 * 3
    assert metrics.stopped_reason == "finished"
    assert metrics.microbatches_injected == metrics.microbatches_completed == 4 * batch
    # Samples of the second batch left before the first batch was averaged...
    assert any(
        t < metrics.iteration_end_times_s[0] for m, t in policy.first_sent.items() if m >= batch
    )
    # ...and no relay computed while its stage averaged (the all-reduce blocks the servers).
    averaging = list(zip(policy.batch_ends, metrics.iteration_end_times_s, strict=True))
    relays = [r for r in engine.trace if r.node_id.startswith("r")]
    assert all(not (a < r.start_s < b - 1e-9) for r in relays for a, b in averaging)
    barrier = run_scenario(scenario, SwarmPolicy(barrier=True))
    assert metrics.sim_time_s < barrier.sim_time_s


def test_swarm_8bit_activations_halve_every_transfer() -> None:
    # The one-microbatch run of the first test: 10 transfers of 4 ms (4 forward, 3 per backward).
    scenario = small_scenario(relays_per_stage=1, data_capacity=1, relay_capacity=1, iterations=1)
    plain = run_scenario(scenario, SwarmPolicy()).sim_time_s
    packed = run_scenario(scenario, SwarmPolicy(compress_8bit=True)).sim_time_s
    assert plain - packed == pytest.approx(10 * 0.004 * (1 - BLOCKWISE_8BIT_RATIO))


def test_without_the_barrier_a_crashed_trainers_samples_are_taken_over() -> None:
    events = [{"t": 0.5, "node": "d1", "event": "crash"}]
    scenario = small_scenario(relays_per_stage=2, data_nodes=2, data_capacity=3, events=events)
    metrics = run_scenario(scenario, SwarmPolicy(), EngineConfig(max_sim_time_s=600.0))
    assert metrics.stopped_reason == "finished"
    assert metrics.microbatches_abandoned > 0
    assert metrics.microbatches_completed == 3 * 2 * 3  # every global batch still full
