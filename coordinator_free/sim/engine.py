"""The discrete-event engine: virtual clock, event queue, compute and transfers, churn, barrier.

It carries out the model stated in ``policy.py`` and asks the policy for every decision. Events sit
in a heap ordered by (time, sequence number), so equal-time events run in the order they were
scheduled and a run is a pure function of the scenario, the seed and the policy. Every microbatch
carries a ``version``; any recovery (re-send, repair, restart) bumps it, and events of an older
version are dropped when they fire, which is how work superseded by a recovery is discarded.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator_free.sim.metrics import RunMetrics
from coordinator_free.sim.microbatch import Microbatch
from coordinator_free.sim.policy import (
    DATA_STAGE,
    Action,
    Forward,
    Hold,
    HopDecision,
    HopReport,
    Message,
    MoveStage,
    PolicyContractError,
    RepairDecision,
    Replace,
    Restart,
    Retry,
    RoutingPolicy,
    Send,
)
from coordinator_free.sim.scenario import Scenario
from coordinator_free.sim.world import World

# Event kinds. Plain ints keep the heap tuples cheap to compare and dispatch.
_ARRIVE_FWD, _ARRIVE_BWD, _ARRIVE_REPAIR, _COMPUTE_DONE, _ACK = 0, 1, 2, 3, 4
_FWD_DEADLINE, _BWD_DEADLINE, _STALL, _REPAIR_START, _RESTART = 5, 6, 7, 8, 9
_INJECT, _RETRY, _MESSAGE, _TICK, _CRASH, _JOIN, _ALLREDUCE_DONE = 10, 11, 12, 13, 14, 15, 16
_PARK_TIMER = 17

# Compute task kinds.
_TASK_FWD, _TASK_SINK, _TASK_BWD, _TASK_REPAIR = 0, 1, 2, 3
#: Share of a relay's forward + backward time spent on the forward (backward costs twice as much).
FORWARD_SHARE = 1.0 / 3.0


@dataclass(frozen=True)
class EngineConfig:
    """Limits of one run: simulated time and events processed, to stop a run that cannot finish."""

    max_sim_time_s: float = 36_000.0
    max_events: int | None = None
    record_trace: bool = False


@dataclass(frozen=True)
class ComputeRecord:
    """One executed compute task (kept only with ``record_trace``, for invariant tests)."""

    node_id: str
    incarnation: int
    start_s: float
    end_s: float


class Engine:
    """Runs one scenario with one policy; ``run()`` returns the metrics."""

    def __init__(
        self, scenario: Scenario, policy: RoutingPolicy, config: EngineConfig | None = None
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.config = config or EngineConfig()
        self.world = World(scenario, policy.full_knowledge)
        self.timing = policy.timing()
        self.metrics = RunMetrics(policy.name, scenario.name, scenario.seed, scenario.iterations)
        self._rng = random.Random(scenario.seed)
        self._churn_rngs: dict[str, random.Random] = {}
        self._entry_stage = {e.id: e.stage for e in scenario.nodes}
        self._policy_rng = random.Random(scenario.seed * 7919 + 17)
        self._heap: list[tuple[float, int, int, tuple[Any, ...]]] = []
        self._seq = 0
        self.now = 0.0
        self._mbs: dict[int, Microbatch] = {}
        self._iteration_mbs: list[Microbatch] = []
        self._remaining = 0
        self._parked: dict[str, deque[tuple[int, int]]] = {}
        self._park_timers: set[str] = set()
        self._pending_moves: dict[str, int] = {}
        self._ever_joined: set[str] = set()
        self._finished = False
        self._running = False
        self.trace: list[ComputeRecord] = []
        self.liveness: list[tuple[float, str, bool]] = []
        self._handlers: dict[int, Callable[..., None]] = {
            _ARRIVE_FWD: self._on_arrive_forward,
            _ARRIVE_BWD: self._on_arrive_backward,
            _ARRIVE_REPAIR: self._on_arrive_repair,
            _COMPUTE_DONE: self._on_compute_done,
            _ACK: self._on_ack,
            _FWD_DEADLINE: self._on_forward_deadline,
            _BWD_DEADLINE: self._on_backward_deadline,
            _STALL: self._on_stall_check,
            _REPAIR_START: self._on_repair_start,
            _RESTART: self._on_restart_event,
            _INJECT: self._on_inject,
            _RETRY: self._retry_parked,
            _MESSAGE: self._on_message,
            _TICK: self._on_tick,
            _CRASH: self._on_crash,
            _JOIN: self._on_join,
            _ALLREDUCE_DONE: self._on_allreduce_done,
            _PARK_TIMER: self._on_park_timer,
        }

    # ---- running ----

    def run(self) -> RunMetrics:
        self._start()
        limit = self.config.max_sim_time_s
        heap = self._heap
        handlers = self._handlers
        processed = 0
        max_events = self.config.max_events or -1
        while heap and not self._finished:
            if processed == max_events:
                self.metrics.stopped_reason = "event_limit"
                break
            when, _, kind, args = heapq.heappop(heap)
            if when > limit:
                self.now = limit
                self.metrics.stopped_reason = "time_limit"
                break
            self.now = when
            self.world.set_now(when)
            handlers[kind](*args)
            processed += 1
        else:
            if not self._finished:
                self.metrics.stopped_reason = "deadlock"
        self.metrics.events_processed = processed
        self.metrics.sim_time_s = self.now
        return self.metrics

    def _schedule(self, when: float, kind: int, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, args))

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
            kind = _JOIN if event.event == "join" else _CRASH
            self._schedule(event.t, kind, event.node, None)
        self._start_iteration()

    # ---- membership ----

    def _bring_up(self, node_id: str, download: bool) -> None:
        node = self.world.nodes[node_id]
        node.alive = True
        node.compute_free_at_s = self.now
        node.nic_free_at_s = self.now
        node.ready_at_s = self.now + (self._download_s(node_id) if download else 0.0)
        self._ever_joined.add(node_id)
        self.liveness.append((self.now, node_id, True))
        self._apply(self.policy.on_node_up(self.world, node_id, self.now))
        period = self.timing.tick_period_s
        if period is not None:
            self._schedule(
                self.now + self._rng.uniform(0.0, period), _TICK, node_id, node.incarnation
            )
        rate = self.scenario.churn.crash_rate_per_hour
        if rate > 0 and node.spec.role == "relay":
            crash_at = self.now + self._churn_rng(node_id).expovariate(rate / 3600.0)
            self._schedule(crash_at, _CRASH, node_id, node.incarnation)

    def _on_join(self, node_id: str, _unused: object) -> None:
        node = self.world.nodes[node_id]
        if node.alive:
            return
        first_time = node_id not in self._ever_joined
        self.world.mark_known(node_id)
        if node.spec.role == "relay":
            entry_stage = self._entry_stage[node_id]
            if first_time and entry_stage is not None:
                stage = entry_stage
            else:
                stage = self.policy.place_joiner(self.world, node_id, self.now)
            self.world.assign_stage(node_id, stage)
        self.metrics.joins += 1
        self._bring_up(node_id, download=node.spec.role == "relay")
        # The joiner's announcement may unblock microbatches parked anywhere (a stage that was
        # empty, a schedule that needed it): ask again for every parked one.
        for parked_at, queue in self._parked.items():
            if queue:
                self._schedule(self.now, _RETRY, parked_at)

    def _on_crash(self, node_id: str, incarnation: int | None) -> None:
        node = self.world.nodes[node_id]
        if not node.alive or (incarnation is not None and incarnation != node.incarnation):
            return
        node.alive = False
        node.incarnation += 1
        self.metrics.crashes += 1
        self.liveness.append((self.now, node_id, False))
        for start, end in node.tasks:
            if start < self.now:
                self._count_compute(node_id, node.incarnation - 1, start, min(end, self.now))
        node.tasks.clear()
        node.held.clear()
        node.waiting.clear()
        for mb_id, _ in self._parked.pop(node_id, ()):
            lost = self._mbs.get(mb_id)
            if lost is not None and lost.parked_at == node_id:
                lost.parked_at = None  # lost with the node: the origin's watchdog will see it
        if node.spec.role == "data":
            self._abandon_origin(node_id)
        if self.policy.full_knowledge:
            self._apply(self.policy.on_node_down(self.world, node_id, self.now))
        churn = self.scenario.churn
        if churn.rejoin and churn.crash_rate_per_hour > 0 and node.spec.role == "relay":
            downtime = churn.mean_downtime_s
            rng = self._churn_rng(node_id)
            back = self.now + (rng.expovariate(1.0 / downtime) if downtime > 0 else 0.0)
            self._schedule(back, _JOIN, node_id, None)

    def _churn_rng(self, node_id: str) -> random.Random:
        """Each node's own stream of up/down times: churn is the same whatever the policy does."""
        rng = self._churn_rngs.get(node_id)
        if rng is None:
            rng = random.Random(f"{self.scenario.seed}/churn/{node_id}")
            self._churn_rngs[node_id] = rng
        return rng

    def _abandon_origin(self, data_node: str) -> None:
        for mb in self._iteration_mbs:
            if mb.origin == data_node and not mb.done and not mb.abandoned:
                mb.abandoned = True
                mb.version += 1
                self.metrics.microbatches_abandoned += 1
                self._release_holds(mb)
                self._remaining -= 1
        self._check_barrier()

    def _download_s(self, node_id: str) -> float:
        """Fetch the stage's weights from the fastest live replica (or a data node)."""
        stage = self.world.stage_of(node_id)
        size = self.scenario.model.stage_param_bytes
        sources = [
            n
            for n in self.world.alive_in_stage(stage if stage is not None else DATA_STAGE)
            if n != node_id and self.world.nodes[n].ready_at_s <= self.now
        ] or self.world.alive_in_stage(DATA_STAGE)
        if not sources:
            return 0.0
        return min(
            self.world.latency_ms(src, node_id) / 1000.0 + self.world.transfer_s(src, node_id, size)
            for src in sources
        )

    # ---- iterations ----

    def _start_iteration(self) -> None:
        iteration = self.metrics.iterations_completed
        self.world.current_iteration = iteration
        self._apply(self.policy.on_iteration_start(self.world, iteration, self.now))
        self._iteration_mbs = []
        for data_node in self.world.data_nodes():
            node = self.world.nodes[data_node]
            if not node.alive:
                continue
            for _ in range(node.spec.capacity):
                mb_id = self.metrics.microbatches_injected
                self.metrics.microbatches_injected += 1
                mb = Microbatch(mb_id, data_node, iteration, self.scenario.model.stages, self.now)
                self._mbs[mb_id] = mb
                self._iteration_mbs.append(mb)
                self._schedule(self.now + self.timing.stall_timeout_s, _STALL, mb_id, 0)
        self._remaining = len(self._iteration_mbs)
        if not self._iteration_mbs:
            self._finish("no_data_nodes")
            return
        self._running = True
        for mb in self._iteration_mbs:
            self._decide_at(mb.origin, mb)
        self._check_barrier()

    def _check_barrier(self) -> None:
        if self._remaining > 0 or self._finished or not self._running:
            return
        self._running = False
        iteration = self.world.current_iteration
        self._apply(self.policy.on_iteration_end(self.world, iteration, self.now))
        self._count_useful()
        self._iteration_mbs = []
        self._schedule(self.now + self._allreduce_s(), _ALLREDUCE_DONE)

    def _on_allreduce_done(self) -> None:
        self.metrics.iterations_completed += 1
        self.metrics.iteration_end_times_s.append(self.now)
        for node_id, stage in sorted(self._pending_moves.items()):
            node = self.world.nodes[node_id]
            if node.alive and node.stage != stage:
                self.world.assign_stage(node_id, stage)
                node.ready_at_s = self.now + self._download_s(node_id)
                self.metrics.stage_moves += 1
        self._pending_moves.clear()
        for mb_id in [m for m, mb in self._mbs.items() if mb.done or mb.abandoned]:
            del self._mbs[mb_id]
        if self.metrics.iterations_completed >= self.scenario.iterations:
            self._finish("finished")
        else:
            self._start_iteration()

    def _finish(self, reason: str) -> None:
        self._finished = True
        self.metrics.stopped_reason = reason

    def _allreduce_s(self) -> float:
        """Ring all-reduce of each stage among its live replicas; stages reduce in parallel."""
        size_bits = self.scenario.model.stage_param_bytes * 8.0
        slowest = 0.0
        for stage in range(self.scenario.model.stages + 1):
            members = sorted(
                self.world.alive_in_stage(stage), key=lambda n: self.world.nodes[n].region_index
            )
            count = len(members)
            if count < 2:
                continue
            ring = list(zip(members, members[1:] + members[:1], strict=True))
            bandwidth = min(self.world.bandwidth_gbps(a, b) for a, b in ring) * 1e9
            latency_s = max(self.world.latency_ms(a, b) for a, b in ring) / 1000.0
            # Reduce-scatter then all-gather: 2(n-1) steps of 1/n of the parameters each.
            seconds = 2.0 * (count - 1) * (size_bits / count / bandwidth + latency_s)
            slowest = max(slowest, seconds)
        return slowest

    def _count_useful(self) -> None:
        nodes = self.world.nodes
        useful = 0.0
        for mb in self._iteration_mbs:
            if not mb.done:
                continue
            for node_id, incarnation, seconds in mb.records():
                node = nodes[node_id]
                if node.alive and node.incarnation == incarnation:
                    useful += seconds
        self.metrics.useful_gpu_s += useful

    # ---- decisions ----

    def _decide_at(self, node_id: str, mb: Microbatch) -> None:
        decision = self.policy.choose_next_hop(self.world, node_id, mb.view(), self.now)
        self._apply_hop_decision(node_id, mb, decision, parked_retry=False)

    def _apply_hop_decision(
        self, node_id: str, mb: Microbatch, decision: HopDecision, parked_retry: bool
    ) -> bool:
        """Carry out a forward decision; False when it was ``Hold``."""
        self._apply(decision.actions)
        if isinstance(decision, Forward):
            self._check_next_hop(mb, decision.to)
            mb.parked_at = None
            self._send_forward(node_id, decision.to, mb)
            return True
        if isinstance(decision, Hold):
            if not parked_retry:
                self._park(node_id, mb)
            return False
        if isinstance(decision, Restart):
            mb.parked_at = None
            self._restart(mb)
            return True
        raise PolicyContractError(f"{self.policy.name} answered {decision!r} to a forward hop")

    def _check_next_hop(self, mb: Microbatch, to: str) -> None:
        node = self.world.nodes.get(to)
        if node is None or not node.known:
            raise PolicyContractError(f"{self.policy.name} routed to unknown node {to!r}")
        expected_sink = mb.stage == self.scenario.model.stages
        if expected_sink != (node.spec.role == "data"):
            raise PolicyContractError(
                f"{self.policy.name} routed microbatch {mb.mb_id} from stage {mb.stage} to {to}"
            )
        if not expected_sink and node.stage != mb.stage + 1:
            raise PolicyContractError(
                f"{self.policy.name} routed stage {mb.stage} to {to} of stage {node.stage}"
            )

    def _park(self, node_id: str, mb: Microbatch) -> None:
        mb.parked_at = node_id
        mb.progress_s = self.now
        self._parked.setdefault(node_id, deque()).append((mb.mb_id, mb.version))
        self._arm_park_timer(node_id)

    def _arm_park_timer(self, node_id: str) -> None:
        """Whatever the policy waits for (a suspicion to expire, a peer), ask again later."""
        if node_id not in self._park_timers:
            self._park_timers.add(node_id)
            self._schedule(self.now + self.timing.park_retry_s, _PARK_TIMER, node_id)

    def _on_park_timer(self, node_id: str) -> None:
        self._park_timers.discard(node_id)
        self._retry_parked(node_id)

    def _retry_parked(self, node_id: str) -> None:
        queue = self._parked.get(node_id)
        node = self.world.nodes[node_id]
        while queue and node.alive:
            mb_id, version = queue[0]
            mb = self._mbs.get(mb_id)
            if mb is None or mb.version != version or mb.done or mb.abandoned:
                queue.popleft()
                continue
            decision = self.policy.choose_next_hop(self.world, node_id, mb.view(), self.now)
            if isinstance(decision, Hold):
                self._apply(decision.actions)
                self._arm_park_timer(node_id)
                return
            queue.popleft()
            self._apply_hop_decision(node_id, mb, decision, parked_retry=True)
        if not queue:
            self._parked.pop(node_id, None)

    def _retry_stage(self, stage: int) -> None:
        # Only nodes with parked microbatches are in ``_parked``: cheap with thousands of nodes.
        nodes = self.world.nodes
        for node_id, queue in self._parked.items():
            if queue and nodes[node_id].stage == stage:
                self._schedule(self.now, _RETRY, node_id)

    def _apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send_message(action)
            elif isinstance(action, Retry):
                self._schedule(self.now, _RETRY, action.node_id)
            elif isinstance(action, MoveStage):
                if self.world.nodes[action.node_id].spec.role != "relay":
                    raise PolicyContractError(f"MoveStage of data node {action.node_id}")
                self._pending_moves[action.node_id] = action.stage
            else:
                raise PolicyContractError(f"{self.policy.name} returned unknown action {action!r}")

    # ---- forward ----

    def _send_forward(self, sender: str, receiver: str, mb: Microbatch) -> None:
        node = self.world.nodes[receiver]
        mb.set_next(receiver)
        mb.hop_seq += 1
        mb.hop_sent_s = self.now
        arrival = self._transfer(sender, receiver)
        incarnation = node.incarnation
        self._schedule(arrival, _ARRIVE_FWD, receiver, incarnation, mb.mb_id, mb.version, sender)
        deadline = self.now + self.timing.forward_timeout_s
        args = (sender, self.world.nodes[sender].incarnation, mb.mb_id, mb.version, mb.hop_seq)
        self._schedule(deadline, _FWD_DEADLINE, *args, receiver)

    def _transfer(self, sender: str, receiver: str) -> float:
        """Queue activations on the sender's uplink; return their arrival time."""
        node = self.world.nodes[sender]
        start = max(self.now, node.nic_free_at_s)
        node.nic_free_at_s = start + self.world.transfer_s(
            sender, receiver, self.scenario.model.activation_bytes
        )
        return node.nic_free_at_s + self.world.latency_ms(sender, receiver) / 1000.0

    def _on_arrive_forward(
        self, receiver: str, incarnation: int, mb_id: int, version: int, sender: str
    ) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return
        node = self.world.nodes[receiver]
        if not node.alive or node.incarnation != incarnation:
            self.metrics.hops_lost += 1
            return
        if node.spec.role == "data":
            compute_s = self.world.compute_ms(receiver) / 1000.0
            self._enqueue(receiver, _TASK_SINK, compute_s, mb, sender)
        elif len(node.held) >= node.spec.capacity:
            # Full: the activations wait outside the node's memory (the sender still buffers
            # them) and are admitted, in arrival order, when a slot frees.
            self.metrics.admission_waits += 1
            node.waiting.append((mb_id, version, sender))
        else:
            self._admit(receiver, mb, sender)

    def _admit(self, node_id: str, mb: Microbatch, sender: str) -> None:
        self.world.nodes[node_id].held.add(mb.mb_id)
        compute_s = self.world.compute_ms(node_id) / 1000.0
        self._enqueue(node_id, _TASK_FWD, compute_s * FORWARD_SHARE, mb, sender)

    def _free_slot(self, node_id: str, mb_id: int) -> None:
        """``mb_id`` no longer occupies ``node_id``: admit waiting forwards."""
        node = self.world.nodes[node_id]
        node.held.discard(mb_id)
        waiting = node.waiting
        while waiting and len(node.held) < node.spec.capacity and node.alive:
            waiting_id, version, sender = waiting.popleft()
            mb = self._mbs.get(waiting_id)
            if mb is not None and mb.version == version:
                self._admit(node_id, mb, sender)

    def _on_forward_deadline(
        self, sender: str, incarnation: int, mb_id: int, version: int, hop: int, suspect: str
    ) -> None:
        mb = self._mbs.get(mb_id)
        node = self.world.nodes[sender]
        if mb is None or mb.version != version or mb.acked_seq >= hop:
            return
        if not node.alive or node.incarnation != incarnation:
            return
        self.metrics.forward_timeouts += 1
        mb.version += 1
        self._free_slot(suspect, mb_id)
        self._retry_stage(mb.stage)
        decision = self.policy.on_forward_timeout(self.world, sender, mb.view(), suspect, self.now)
        self._apply_hop_decision(sender, mb, decision, parked_retry=False)

    # ---- compute ----

    def _enqueue(self, node_id: str, task: int, seconds: float, mb: Microbatch, peer: str) -> None:
        node = self.world.nodes[node_id]
        start = max(self.now, node.compute_free_at_s, node.ready_at_s)
        end = start + seconds
        node.compute_free_at_s = end
        node.tasks.append((start, end))
        args = (node_id, node.incarnation, mb.mb_id, mb.version, task, peer, start)
        self._schedule(end, _COMPUTE_DONE, *args)

    def _count_compute(self, node_id: str, incarnation: int, start: float, end: float) -> None:
        self.metrics.total_gpu_s += end - start
        if self.config.record_trace:
            self.trace.append(ComputeRecord(node_id, incarnation, start, end))

    def _on_compute_done(
        self,
        node_id: str,
        incarnation: int,
        mb_id: int,
        version: int,
        task: int,
        peer: str,
        start: float,
    ) -> None:
        node = self.world.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        node.tasks.popleft()
        self._count_compute(node_id, incarnation, start, self.now)
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return
        mb.progress_s = self.now
        seconds = self.now - start
        if task == _TASK_FWD:
            mb.record_forward(node_id, incarnation, seconds)
            self._schedule_ack(node_id, peer, mb, "forward")
            self._decide_at(node_id, mb)
        elif task == _TASK_SINK:
            mb.record_sink(node_id, incarnation, seconds)
            self._schedule_ack(node_id, peer, mb, "forward")
            self._send_backward(node_id, mb)
        else:
            if task == _TASK_REPAIR:
                mb.record_repair(node_id, incarnation, seconds, FORWARD_SHARE)
            else:
                mb.record_backward(node_id, incarnation, seconds)
            self._schedule_ack(node_id, peer, mb, "backward")
            self._free_slot(node_id, mb_id)
            self._retry_stage(mb.stage - 1)
            self._send_backward(node_id, mb)

    def _schedule_ack(self, node_id: str, peer: str, mb: Microbatch, direction: str) -> None:
        arrive = self.now + self.world.latency_ms(node_id, peer) / 1000.0
        peer_incarnation = self.world.nodes[peer].incarnation
        args = (peer, peer_incarnation, mb.mb_id, mb.version, mb.hop_seq, node_id, direction)
        self._schedule(arrive, _ACK, *args, mb.hop_sent_s, mb.stage)

    def _on_ack(
        self,
        sender: str,
        incarnation: int,
        mb_id: int,
        version: int,
        hop: int,
        receiver: str,
        direction: Any,
        sent_at: float,
        stage: int,
    ) -> None:
        node = self.world.nodes[sender]
        if not node.alive or node.incarnation != incarnation:
            return
        mb = self._mbs.get(mb_id)
        if mb is not None and mb.version == version:
            mb.acked_seq = max(mb.acked_seq, hop)
        report = HopReport(mb_id, sender, receiver, stage, direction, sent_at, self.now)
        self._apply(self.policy.on_hop_acked(self.world, report, self.now))

    # ---- backward ----

    def _send_backward(self, sender: str, mb: Microbatch) -> None:
        """Send the gradient from ``sender`` (stage ``mb.stage``) to the previous hop."""
        receiver = mb.previous_hop()
        mb.direction = "backward"
        mb.hop_seq += 1
        mb.hop_sent_s = self.now
        arrival = self._transfer(sender, receiver)
        incarnation = self.world.nodes[receiver].incarnation
        self._schedule(arrival, _ARRIVE_BWD, receiver, incarnation, mb.mb_id, mb.version, sender)
        args = (sender, self.world.nodes[sender].incarnation, mb.mb_id, mb.version, mb.hop_seq)
        self._schedule(self.now + self.timing.backward_timeout_s, _BWD_DEADLINE, *args, receiver)

    def _on_arrive_backward(
        self, receiver: str, incarnation: int, mb_id: int, version: int, sender: str
    ) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return
        node = self.world.nodes[receiver]
        if not node.alive or node.incarnation != incarnation:
            self.metrics.hops_lost += 1
            return
        if receiver == mb.origin and mb.stage == 1:
            mb.stage = DATA_STAGE
            self._schedule_ack(receiver, sender, mb, "backward")
            self._complete(mb)
            return
        compute_s = self.world.compute_ms(receiver) / 1000.0
        self._enqueue(receiver, _TASK_BWD, compute_s * (1.0 - FORWARD_SHARE), mb, sender)

    def _complete(self, mb: Microbatch) -> None:
        mb.done = True
        self.metrics.microbatches_completed += 1
        self._remaining -= 1
        self._apply(self.policy.on_microbatch_done(self.world, mb.view(), self.now))
        self._check_barrier()

    def _on_backward_deadline(
        self, sender: str, incarnation: int, mb_id: int, version: int, hop: int, suspect: str
    ) -> None:
        mb = self._mbs.get(mb_id)
        node = self.world.nodes[sender]
        if mb is None or mb.version != version or mb.acked_seq >= hop or mb.done:
            return
        if not node.alive or node.incarnation != incarnation:
            return
        self.metrics.backward_timeouts += 1
        view = mb.view()
        decision = self.policy.on_backward_timeout(self.world, sender, view, suspect, self.now)
        self._apply_repair_decision(sender, mb, suspect, decision)

    def _apply_repair_decision(
        self, sender: str, mb: Microbatch, suspect: str, decision: RepairDecision
    ) -> None:
        self._apply(decision.actions)
        if isinstance(decision, Hold):
            args = (sender, self.world.nodes[sender].incarnation, mb.mb_id, mb.version, mb.hop_seq)
            self._schedule(self.now + self.timing.backward_timeout_s, _BWD_DEADLINE, *args, suspect)
        elif isinstance(decision, Restart):
            self._restart(mb)
        elif isinstance(decision, Replace):
            stage = mb.stage - 1
            node = self.world.nodes.get(decision.to)
            if decision.stage != stage or node is None or node.stage != stage or stage < 1:
                raise PolicyContractError(
                    f"{self.policy.name} repaired stage {decision.stage} with {decision.to}; "
                    f"the dead hop is at stage {stage}"
                )
            self.metrics.replacements += 1
            mb.version += 1
            self._free_slot(suspect, mb.mb_id)
            when = self.now + max(0.0, decision.delay_s)
            self._schedule(when, _REPAIR_START, mb.mb_id, mb.version, decision.to, sender)
        else:
            raise PolicyContractError(f"{self.policy.name} answered {decision!r} to a repair")

    def _on_repair_start(self, mb_id: int, version: int, replacement: str, sender: str) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return
        upstream = mb.upstream_of_dead_hop()
        nodes = self.world.nodes
        if not nodes[upstream].alive or not nodes[sender].alive:
            when = self.now + self.timing.forward_timeout_s
            self._schedule(when, _RESTART, mb_id, version)
            return
        node = nodes[replacement]
        if len(node.held) >= node.spec.capacity:
            # A repair never waits behind forwards: that could deadlock a full stage.
            self.metrics.capacity_exceeded += 1
        node.held.add(mb_id)
        mb.replace_dead_hop(replacement)
        mb.hop_seq += 1
        arrival = max(self._transfer(upstream, replacement), self._transfer(sender, replacement))
        self._schedule(
            arrival, _ARRIVE_REPAIR, replacement, node.incarnation, mb_id, version, sender
        )
        deadline = self.now + self.timing.backward_timeout_s
        hop = (sender, nodes[sender].incarnation, mb_id, version, mb.hop_seq)
        self._schedule(deadline, _BWD_DEADLINE, *hop, replacement)

    def _on_arrive_repair(
        self, receiver: str, incarnation: int, mb_id: int, version: int, sender: str
    ) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return
        node = self.world.nodes[receiver]
        if not node.alive or node.incarnation != incarnation:
            self.metrics.hops_lost += 1
            return
        self._enqueue(receiver, _TASK_REPAIR, self.world.compute_ms(receiver) / 1000.0, mb, sender)

    # ---- restarts and the watchdog ----

    def _restart(self, mb: Microbatch) -> None:
        self.metrics.restarts += 1
        self._release_holds(mb)
        mb.restart(self.now)
        self._schedule(self.now, _INJECT, mb.mb_id, mb.version)

    def _release_holds(self, mb: Microbatch) -> None:
        for node_id in mb.relays():
            self._free_slot(node_id, mb.mb_id)

    def _on_restart_event(self, mb_id: int, version: int) -> None:
        mb = self._mbs.get(mb_id)
        if mb is not None and mb.version == version and not mb.done:
            self._restart(mb)

    def _on_inject(self, mb_id: int, version: int) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version or mb.abandoned:
            return
        self._decide_at(mb.origin, mb)

    def _on_stall_check(self, mb_id: int, _unused: int) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.done or mb.abandoned:
            return
        stall_s = self.timing.stall_timeout_s
        parked = mb.parked_at
        if parked is not None and self.world.nodes[parked].alive:
            mb.progress_s = self.now
        due = mb.progress_s + stall_s  # compared as scheduled: float subtraction could loop
        if self.now < due:
            self._schedule(due, _STALL, mb_id, 0)
            return
        self.metrics.stalls += 1
        decision = self.policy.on_stall(self.world, mb.view(), self.now)
        self._apply(decision.actions)
        if isinstance(decision, Restart):
            mb.parked_at = None
            self._restart(mb)
        elif not isinstance(decision, Hold):
            raise PolicyContractError(f"{self.policy.name} answered {decision!r} to a stall")
        mb.progress_s = self.now
        self._schedule(self.now + stall_s, _STALL, mb_id, 0)

    # ---- control plane ----

    def _send_message(self, send: Send) -> None:
        src = self.world.nodes.get(send.src)
        if send.dst not in self.world.nodes or src is None:
            raise PolicyContractError(f"{self.policy.name} sent a message {send.src}->{send.dst}")
        if not src.alive:
            return
        size = max(0, int(send.size_bytes))
        self.metrics.control_messages += 1
        self.metrics.control_bytes += size
        delay = self.world.latency_ms(send.src, send.dst) / 1000.0
        delay += self.world.transfer_s(send.src, send.dst, size)
        message = Message(send.src, send.dst, send.payload, size, self.now)
        self._schedule(self.now + delay, _MESSAGE, message)

    def _on_message(self, message: Message) -> None:
        if self.world.nodes[message.dst].alive:
            self._apply(self.policy.on_message(self.world, message, self.now))

    def _on_tick(self, node_id: str, incarnation: int) -> None:
        node = self.world.nodes[node_id]
        period = self.timing.tick_period_s
        if not node.alive or node.incarnation != incarnation or period is None:
            return
        self._apply(self.policy.on_tick(self.world, node_id, self.now))
        self._retry_parked(node_id)
        self._schedule(self.now + period, _TICK, node_id, incarnation)


def run_scenario(
    scenario: Scenario, policy: RoutingPolicy, config: EngineConfig | None = None
) -> RunMetrics:
    """Simulate ``scenario`` under ``policy`` and return its metrics."""
    return Engine(scenario, policy, config).run()
