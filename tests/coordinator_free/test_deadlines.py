"""Hop deadlines kept in per-kind queues (``EngineBase._schedule_deadline``) give exactly the run
of scheduling every deadline as a plain heap event, with fewer events."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator_free.baselines.swarm import SwarmPolicy
from coordinator_free.sim.algorithms import make_policy
from coordinator_free.sim.engine import Engine, EngineConfig
from coordinator_free.sim.events import BWD_DEADLINE, FWD_DEADLINE, QUEUED_DEADLINE
from coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from coordinator_free.sim.microbatch import Microbatch
from coordinator_free.sim.policy import RoutingPolicy
from coordinator_free.sim.round_robin import RoundRobinPolicy
from coordinator_free.sim.scenario import Scenario
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
