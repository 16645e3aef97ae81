"""Hop deadlines kept in per-kind queues (``EngineBase._schedule_deadline``) give exactly the run
of scheduling every deadline as a plain heap event, with fewer events."""

from __future__ import annotations

from typing import Any

import pytest

from gwtf.coordinator_free.baselines.swarm import SwarmPolicy
from gwtf.coordinator_free.sim.algorithms import make_policy
from gwtf.coordinator_free.sim.engine import Engine, EngineConfig
from gwtf.coordinator_free.sim.events import BWD_DEADLINE, FWD_DEADLINE, QUEUED_DEADLINE
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.microbatch import Microbatch
from gwtf.coordinator_free.sim.policy import Forward, Hold, RoutingPolicy
from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy
from gwtf.coordinator_free.sim.scenario import Scenario
from tests.coordinator_free.sim_helpers import small_scenario


class _HeapDeadlineEngine(Engine):
    """The reference: every deadline is an event on the heap, fired whether moot or not."""

    def _schedule_deadline(self, when: float, kind: int, *args: Any) -> None:
        self._schedule(when, kind, *args)


def _run(engine_class: type[Engine], scenario: Scenario, policy: RoutingPolicy) -> Engine:
    engine = engine_class(scenario, policy, EngineConfig(record_trace=True))
    engine.run()
    return engine


def _summary(engine: Engine) -> dict[str, object]:
    summary = engine.metrics.to_json()
    summary.pop("events_processed")
    return summary


_CHURN = GridSize(relays=12, data_nodes=2, data_capacity=4, iterations=6, mean_downtime_s=30.0)


@pytest.mark.parametrize(
    ("policy_name", "churn_per_hour"),
    [("swarm", 30.0), ("gwtf", 30.0), ("round_robin", 30.0), ("gwtf", 0.0)],
)
def test_queued_deadlines_give_the_run_of_heap_deadlines(
    policy_name: str, churn_per_hour: float
) -> None:
    scenario = build_scenario(GridCell(True, True, churn_per_hour), 1, _CHURN)
    queued = _run(Engine, scenario, make_policy(policy_name))
    heap = _run(_HeapDeadlineEngine, scenario, make_policy(policy_name))
    assert _summary(queued) == _summary(heap)
    assert queued.trace == heap.trace
    assert queued.liveness == heap.liveness
    # Moot deadlines never became events.
    assert queued.metrics.events_processed < heap.metrics.events_processed
    if churn_per_hour > 0:
        # Deadlines did fire: the comparison covers them.
        assert heap.metrics.forward_timeouts + heap.metrics.backward_timeouts > 0


def test_a_deadline_that_fires_still_fires_from_the_queue() -> None:
    events = [{"t": 0.0, "node": "r1_0", "event": "crash"}]
    scenario = small_scenario(data_capacity=1, relay_capacity=1, iterations=1, events=events)
    queued = _run(Engine, scenario, RoundRobinPolicy(forward_timeout_s=5.0))
    heap = _run(_HeapDeadlineEngine, scenario, RoundRobinPolicy(forward_timeout_s=5.0))
    assert queued.metrics.forward_timeouts == heap.metrics.forward_timeouts == 1
    assert _summary(queued) == _summary(heap)


def test_a_deadline_set_out_of_order_goes_on_the_heap() -> None:
    engine = Engine(small_scenario(), SwarmPolicy())
    engine.world.nodes["d0"].alive = True
    for mb_id in range(1, 5):  # hops not acked yet: none of the deadlines is moot
        engine._mbs[mb_id] = Microbatch(mb_id, "d0", 0, 2, 0.0)
    engine._schedule_deadline(30.0, FWD_DEADLINE, "d0", 0, 1, 0, 1, "r1_0")
    engine._schedule_deadline(40.0, FWD_DEADLINE, "d0", 0, 2, 0, 1, "r1_1")
    engine._schedule_deadline(35.0, FWD_DEADLINE, "d0", 0, 3, 0, 1, "r1_0")
    engine._schedule_deadline(75.0, BWD_DEADLINE, "d0", 0, 4, 0, 1, "r1_0")
    # The queue heads of both kinds are armed; the one set out of order is a plain event.
    assert engine.scheduled_events() == [
        (30.0, QUEUED_DEADLINE),
        (35.0, FWD_DEADLINE),
        (75.0, QUEUED_DEADLINE),
    ]
    assert engine.queued_deadlines(FWD_DEADLINE) == [30.0, 40.0]


def test_moot_deadlines_at_the_head_are_dropped_unseen() -> None:
    engine = Engine(small_scenario(), SwarmPolicy())
    engine.world.nodes["d0"].alive = True
    for mb_id in (1, 2):
        engine._mbs[mb_id] = Microbatch(mb_id, "d0", 0, 2, 0.0)
    engine._schedule_deadline(30.0, FWD_DEADLINE, "d0", 0, 1, 0, 1, "r1_0")
    engine._schedule_deadline(31.0, FWD_DEADLINE, "d0", 0, 2, 0, 1, "r1_0")
    engine._mbs[1].acked_seq = 1  # the first hop is acknowledged: its deadline is moot
    assert engine.scheduled_events() == [(30.0, QUEUED_DEADLINE)]
    engine.step()  # fires nothing (moot), and arms the next live one
    assert engine.now == 30.0
    assert engine.metrics.forward_timeouts == 0
    assert engine.scheduled_events() == [(31.0, QUEUED_DEADLINE)]
    assert engine.queued_deadlines(FWD_DEADLINE) == [31.0]


class _WaitsThenSendsToTheDead(RoundRobinPolicy):
    """Holds the microbatch at its origin for 30 s, then sends it to r1_0, which crashed at 1 s;
    after that hop's timeout, to r1_1. Records the timeouts and the watchdog's stalls."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float]] = []

    def choose_next_hop(self, world: Any, node_id: str, mb: Any, now: float) -> Any:
        if mb.stage != 0:
            return super().choose_next_hop(world, node_id, mb, now)
        if now < 30.0:
            return Hold()
        return Forward("r1_1" if self.seen else "r1_0")

    def on_forward_timeout(
        self, world: Any, node_id: str, mb: Any, suspect: str, now: float
    ) -> Any:
        self.seen.append(("timeout", now))
        return super().on_forward_timeout(world, node_id, mb, suspect, now)

    def on_stall(self, world: Any, mb: Any, now: float) -> Any:
        self.seen.append(("stall", now))
        return super().on_stall(world, mb, now)


def test_time_parked_at_a_live_node_does_not_cut_the_hop_sent_after_it() -> None:
    # Parked 30 s, then sent to a dead relay at 30 s: the hop's deadline (50 s) comes before the
    # watchdog, which counts from the send (70 s), not from the parking (40 s).
    scenario = small_scenario(
        data_capacity=1, iterations=1, events=[{"t": 1.0, "node": "r1_0", "event": "crash"}]
    )
    policy = _WaitsThenSendsToTheDead()
    metrics = Engine(scenario, policy).run()
    assert metrics.stopped_reason == "finished"
    assert policy.seen == [("timeout", pytest.approx(50.0, abs=0.5))]
    assert metrics.stalls == 0 and metrics.restarts == 0
