"""The discrete-event simulator's engine: one scenario, one routing policy, one run.

It carries out the model stated in ``policy.py`` and asks the policy for every decision. The
engine is built in layers, one concern each: ``engine_base`` (event heap, actions, compute and
uplinks, control messages, tick grid), ``hops`` (forward and backward hops, acks, parking),
``recovery`` (deadlines, one-hop repair, restarts, the watchdog), ``membership`` (churn, joins,
downloads) and ``iterations`` (barrier, all-reduce, stage moves). Every microbatch carries a
``version``; any recovery (re-send, repair, restart) bumps it, and events of an older version are
dropped when they fire, which is how work superseded by a recovery is discarded.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable

from gwtf.coordinator_free.sim.events import (
    ACK,
    ALLREDUCE_DONE,
    ARRIVE_BWD,
    ARRIVE_FWD,
    ARRIVE_REPAIR,
    BWD_DEADLINE,
    CALL_BWD,
    COMPUTE_DONE,
    CRASH,
    FORWARD_SHARE,
    FWD_DEADLINE,
    INJECT,
    JOIN,
    MESSAGE,
    PARK_TIMER,
    QUEUED_DEADLINE,
    REPAIR_START,
    RESTART,
    RETRY,
    RETURN_FWD,
    STALL,
    TICK,
    ComputeRecord,
    EngineConfig,
)
from gwtf.coordinator_free.sim.iterations import IterationsMixin
from gwtf.coordinator_free.sim.metrics import RunMetrics
from gwtf.coordinator_free.sim.policy import PolicyContractError, RoutingPolicy
from gwtf.coordinator_free.sim.scenario import Scenario

#: Allocations between two young-generation collections during a run (Python's default: 700).
_GC_THRESHOLD = 20_000


class Engine(IterationsMixin):
    """Runs one scenario with one policy; ``run()`` returns the metrics."""

    def __init__(
        self, scenario: Scenario, policy: RoutingPolicy, config: EngineConfig | None = None
    ) -> None:
        super().__init__(scenario, policy, config)
        self._handlers: dict[int, Callable[..., None]] = {
            ARRIVE_FWD: self._on_arrive_forward,
            ARRIVE_BWD: self._on_arrive_backward,
            ARRIVE_REPAIR: self._on_arrive_repair,
            COMPUTE_DONE: self._on_compute_done,
            ACK: self._on_ack,
            FWD_DEADLINE: self._on_forward_deadline,
            BWD_DEADLINE: self._on_backward_deadline,
            STALL: self._on_stall_check,
            REPAIR_START: self._on_repair_start,
            RESTART: self._on_restart_event,
            INJECT: self._on_inject,
            RETRY: self._retry_parked,
            MESSAGE: self._on_message,
            TICK: self._on_tick,
            CRASH: self._on_crash,
            JOIN: self._on_join,
            ALLREDUCE_DONE: self._on_allreduce_done,
            PARK_TIMER: self._on_park_timer,
            QUEUED_DEADLINE: self._on_queued_deadline,
            RETURN_FWD: self._on_return_forward,
            CALL_BWD: self._on_call_backward,
        }
        self._deadline_moot = {
            FWD_DEADLINE: self._forward_deadline_moot,
            BWD_DEADLINE: self._backward_deadline_moot,
        }

    def run(self) -> RunMetrics:
        # A run allocates millions of short-lived containers (event tuples, messages) next to a
        # large, long-lived swarm state; with the default threshold the collector rescans that
        # state every ~700 allocations (~3 % of a 1,000-node run). Collect less often meanwhile.
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], _GC_THRESHOLD), *thresholds[1:])
        try:
            return self._run()
        finally:
            gc.set_threshold(*thresholds)

    def _run(self) -> RunMetrics:
        self._start()
        limit = self.config.max_sim_time_s
        heap = self._heap
        handlers = self._handlers
        world = self.world
        pop = heapq.heappop
        processed = 0
        max_events = self.config.max_events or -1
        while heap and not self._finished:
            if processed == max_events:
                self.metrics.stopped_reason = "event_limit"
                break
            when, _, kind, args = pop(heap)
            if when > limit:
                self.now = limit
                self.metrics.stopped_reason = "time_limit"
                break
            self.now = world.now_s = when
            handlers[kind](*args)
            processed += 1
        else:
            if not self._finished:
                self.metrics.stopped_reason = "deadlock"
        self.metrics.events_processed = processed
        self.metrics.sim_time_s = self.now
        return self.metrics

    def step(self) -> None:
        """Run the next event on the heap alone, as ``run`` would (for driving a run by hand)."""
        when, _, kind, args = heapq.heappop(self._heap)
        self.now = self.world.now_s = when
        self._handlers[kind](*args)

    def _on_queued_deadline(self, kind: int, args: tuple[object, ...]) -> None:
        """The deadline at the head of ``kind``'s queue is due (``_schedule_deadline``)."""
        self._deadlines[kind].popleft()
        self._deadline_armed.discard(kind)
        self._handlers[kind](*args)
        if kind not in self._deadline_armed:  # the handler may have set (and armed) another
            self._arm_deadline(kind)

    def _start(self) -> None:
        joining_later = {e.node for e in self.scenario.churn.events if e.event == "join"}
        initial = [e.id for e in self.scenario.nodes if e.id not in joining_later]
        for node_id in initial:
            self.world.mark_known(node_id)
        placement = self.policy.place_initial(self.world, self._policy_rng)
        for entry in self.scenario.nodes:
            if entry.id in joining_later or entry.role == "data" or entry.stage is not None:
                continue
            if entry.id not in placement:
                raise PolicyContractError(f"{self.policy.name} left relay {entry.id} unplaced")
            self.world.assign_stage(entry.id, placement[entry.id])
        for node_id in initial:
            self._bring_up(node_id, download=False)
        for event in self.scenario.churn.events:
            kind = JOIN if event.event == "join" else CRASH
            self._schedule(event.t, kind, event.node, None)
        self._start_iteration()


def run_scenario(
    scenario: Scenario, policy: RoutingPolicy, config: EngineConfig | None = None
) -> RunMetrics:
    """Simulate ``scenario`` under ``policy`` and return its metrics."""
    return Engine(scenario, policy, config).run()


__all__ = ["FORWARD_SHARE", "ComputeRecord", "Engine", "EngineConfig", "run_scenario"]
