"""The engine's state and its primitives: the event heap, actions, compute and uplink queues,
control messages and each node's tick grid.

Events sit in a heap ordered by (time, sequence number), so equal-time events run in the order
they were scheduled and a run is a pure function of the scenario, the seed and the policy. The
layers above (``hops``, ``recovery``, ``membership``, ``iterations``) each add one concern;
``engine.Engine`` puts them together.
"""

from __future__ import annotations

import heapq
import math
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gwtf.coordinator_free.sim.events import (
    COMPUTE_DONE,
    MESSAGE,
    QUEUED_DEADLINE,
    RETRY,
    TICK,
    ComputeRecord,
    EngineConfig,
)
from gwtf.coordinator_free.sim.metrics import RunMetrics
from gwtf.coordinator_free.sim.microbatch import Microbatch
from gwtf.coordinator_free.sim.policy import (
    Action,
    MoveStage,
    PolicyContractError,
    RestartIteration,
    Retry,
    RoutingPolicy,
    Send,
    Wake,
)
from gwtf.coordinator_free.sim.scenario import Scenario
from gwtf.coordinator_free.sim.world import BITS_PER_BYTE, World


class EngineBase(ABC):
    """State of one run, and the primitives every layer of the engine uses."""

    def __init__(
        self, scenario: Scenario, policy: RoutingPolicy, config: EngineConfig | None = None
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.config = config or EngineConfig()
        self.world = World(scenario, policy.full_knowledge)
        self.timing = policy.timing()
        self._client_routed = policy.client_routed
        self._barrier = policy.iteration_barrier
        self._wire_bytes = scenario.model.activation_bytes * policy.activation_wire_ratio
        #: Without the barrier: microbatches injected in the whole run, the global batch, and
        #: how many are left to inject.
        self._batch_size = 0
        self._left_to_inject = 0
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
        #: Client-routed: per microbatch, the backward call computed and on its way back to the
        #: origin (relay, its incarnation, seconds), recorded when the answer arrives.
        self._answers: dict[int, tuple[str, int, float]] = {}
        self._remaining = 0
        self._parked: dict[str, deque[tuple[int, int]]] = {}
        self._park_timers: set[str] = set()
        self._pending_moves: dict[str, int] = {}
        self._ever_joined: set[str] = set()
        self._finished = False
        self._running = False
        self.trace: list[ComputeRecord] = []
        # Each node's tick grid: its random phase, the index of the last tick it ran, and the
        # index of the tick scheduled next (``ticks_on_request``: the earliest one asked for).
        self._tick_phase_s: dict[str, float] = {}
        self._tick_done: dict[str, int] = {}
        self._tick_due: dict[str, int] = {}
        self.liveness: list[tuple[float, str, bool]] = []
        # Hop deadlines waiting in order, per kind (``_schedule_deadline``): (when, seq, args).
        self._deadlines: dict[int, deque[tuple[float, int, tuple[Any, ...]]]] = {}
        self._deadline_armed: set[int] = set()
        #: Per deadline kind: whether a deadline with these args can no longer do anything.
        self._deadline_moot: dict[int, Callable[..., bool]] = {}

    # ---- what the layers above provide ----

    @abstractmethod
    def _retry_parked(self, node_id: str) -> None:
        """Ask the policy again about the microbatches parked at ``node_id`` (``hops``)."""

    @abstractmethod
    def _restart(self, mb: Microbatch) -> None:
        """Drop the attempt and re-inject ``mb`` at its origin (``recovery``)."""

    @abstractmethod
    def _call_backward(self, mb: Microbatch) -> None:
        """Client-routed: the origin calls a relay for the next backward (``recovery``)."""

    @abstractmethod
    def _check_barrier(self) -> None:
        """End the iteration if every microbatch is done (``iterations``)."""

    @abstractmethod
    def _new_microbatch(self, data_node: str) -> Microbatch:
        """Inject a fresh microbatch at ``data_node`` (``iterations``)."""

    @abstractmethod
    def _stream_done(self, mb: Microbatch) -> None:
        """Without the barrier: inject the origin's next microbatch, end a full batch."""

    # ---- events and actions ----

    def scheduled_events(self) -> list[tuple[float, int]]:
        """(time, kind) of each event waiting on the heap, in the order they will run."""
        return [(when, kind) for when, _, kind, _ in sorted(self._heap)]

    def queued_deadlines(self, kind: int) -> list[float]:
        """When the hop deadlines of ``kind`` waiting in its queue come due (the first that may
        still fire is also on the heap, as a ``QUEUED_DEADLINE``)."""
        return [when for when, _, _ in self._deadlines.get(kind, ())]

    def _schedule(self, when: float, kind: int, *args: Any) -> None:
        assert when >= self.now, f"event {kind} scheduled in the past ({when} < {self.now})"
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, args))

    def _schedule_deadline(self, when: float, kind: int, *args: Any) -> None:
        """Schedule a hop deadline, ``_schedule`` with the same order of events but cheaper.

        Nearly every hop deadline is moot when it comes (the ack came first), and each is set a
        fixed timeout after the hop, so a kind's deadlines come due in the order they were set.
        They wait in one queue per kind; only the first that may still fire is on the heap, with
        the time and sequence number it was set with, so events run in exactly the order they
        would if every deadline were on the heap. A moot deadline stays moot (acks, versions and
        incarnations only grow), so moot ones are dropped from the queue's head unseen.
        """
        assert when >= self.now, f"deadline {kind} scheduled in the past ({when} < {self.now})"
        self._seq += 1
        queue = self._deadlines.get(kind)
        if queue is None:
            queue = self._deadlines[kind] = deque()
        if queue and when < queue[-1][0]:  # out of order (another timeout): a plain event
            heapq.heappush(self._heap, (when, self._seq, kind, args))
            return
        queue.append((when, self._seq, args))
        if kind not in self._deadline_armed:
            self._arm_deadline(kind)

    def _arm_deadline(self, kind: int) -> None:
        """Drop the moot deadlines at the head of ``kind``'s queue; put the first live one on
        the heap."""
        queue = self._deadlines[kind]
        moot = self._deadline_moot[kind]
        while queue and moot(*queue[0][2]):
            queue.popleft()
        if queue:
            when, seq, args = queue[0]
            heapq.heappush(self._heap, (when, seq, QUEUED_DEADLINE, (kind, args)))
            self._deadline_armed.add(kind)
        else:
            self._deadline_armed.discard(kind)

    def _apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send_messages(action)
            elif isinstance(action, Wake):
                self._request_tick(action.node_id, action.at_s, action.postpone)
            elif isinstance(action, Retry):
                self._schedule(self.now, RETRY, action.node_id)
            elif isinstance(action, MoveStage):
                if self.world.nodes[action.node_id].spec.role != "relay":
                    raise PolicyContractError(f"MoveStage of data node {action.node_id}")
                self._pending_moves[action.node_id] = action.stage
            elif isinstance(action, RestartIteration):
                for mb in self._iteration_mbs:
                    if not mb.done and not mb.abandoned and mb.mb_id != action.besides:
                        self._restart(mb)
            else:
                raise PolicyContractError(f"{self.policy.name} returned unknown action {action!r}")

    # ---- compute and uplinks ----

    def _arrived(
        self, receiver: str, incarnation: int, mb_id: int, version: int
    ) -> Microbatch | None:
        """The microbatch a hop carried, if it is still current and its receiver is the same live
        incarnation it was sent to; a hop that reached a dead or restarted node is counted lost."""
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return None
        node = self.world.nodes[receiver]
        if not node.alive or node.incarnation != incarnation:
            self.metrics.hops_lost += 1
            return None
        return mb

    def _transfer(self, sender: str, receiver: str) -> float:
        """Queue activations on the sender's uplink; return their arrival time."""
        node = self.world.nodes[sender]
        start = max(self.now, node.nic_free_at_s)
        node.nic_free_at_s = start + self.world.transfer_s(sender, receiver, self._wire_bytes)
        return node.nic_free_at_s + self.world.latency_ms(sender, receiver) / 1000.0

    def _enqueue(self, node_id: str, task: int, seconds: float, mb: Microbatch, peer: str) -> None:
        node = self.world.nodes[node_id]
        start = max(self.now, node.compute_free_at_s, node.ready_at_s)
        end = start + seconds
        node.compute_free_at_s = end
        node.tasks.append((start, end, task))
        args = (node_id, node.incarnation, mb.mb_id, mb.version, task, peer, start)
        self._schedule(end, COMPUTE_DONE, *args)

    def _count_compute(self, node_id: str, incarnation: int, start: float, end: float) -> None:
        self.metrics.total_gpu_s += end - start
        if self.config.record_trace:
            self.trace.append(ComputeRecord(node_id, incarnation, start, end))

    # ---- control plane ----

    def _send_messages(self, send: Send) -> None:
        """Schedule each message's arrival; the event carries (src, dst, payload) as they are."""
        nodes = self.world.nodes
        src = nodes.get(send.src)
        if src is None:
            raise PolicyContractError(f"{self.policy.name} sent a message from {send.src}")
        if not src.alive:
            return
        metrics = self.metrics
        # ``world.region_delay_s``, inlined with the same arithmetic: one row per sender.
        latency_s = self.world.latency_s_by_region[src.region_index]
        bits_per_s = self.world.bits_per_s_by_region[src.region_index]
        src_id, now, heap = send.src, self.now, self._heap
        for dst_id, payload, size in send.messages:
            dst = nodes.get(dst_id)
            if dst is None:
                raise PolicyContractError(f"{self.policy.name} sent a message {src_id}->{dst_id}")
            if size.__class__ is not int or size < 0:
                size = max(0, int(size))
            metrics.control_messages += 1
            metrics.control_bytes += size
            self._seq += 1  # ``_schedule``, inlined: one event per control message
            region = dst.region_index
            when = now + (latency_s[region] + size * BITS_PER_BYTE / bits_per_s[region])
            heapq.heappush(heap, (when, self._seq, MESSAGE, (src_id, dst_id, payload)))

    def _on_message(self, src: str, dst: str, payload: object) -> None:
        if self.world.nodes[dst].alive:
            self._apply(self.policy.on_message(self.world, src, dst, payload, self.now))

    # ---- ticks ----

    def _schedule_tick(self, node_id: str, index: int) -> None:
        self._tick_due[node_id] = index
        period = self.timing.tick_period_s
        assert period is not None
        when = self._tick_phase_s[node_id] + index * period
        self._schedule(when, TICK, node_id, self.world.nodes[node_id].incarnation, index)

    def _request_tick(self, node_id: str, at_s: float, postpone: bool = False) -> None:
        """Tick ``node_id`` at the first point of its grid at or after ``at_s``, after its last
        (``postpone``: also when that is later than the tick pending, unless it holds parked
        microbatches, which are asked about again on every tick)."""
        period = self.timing.tick_period_s
        node = self.world.nodes.get(node_id)
        if node is None or not node.alive or period is None or at_s == math.inf:
            return
        # Never in the past: a time already gone means the next grid point from now.
        after = math.ceil((max(at_s, self.now) - self._tick_phase_s[node_id]) / period - 1e-9)
        index = max(self._tick_done[node_id] + 1, after)
        due = self._tick_due.get(node_id)
        if due is None or index < due:
            self._schedule_tick(node_id, index)
        elif (
            postpone
            and index > due
            and self.timing.ticks_on_request
            and not self._parked.get(node_id)
        ):
            self._schedule_tick(node_id, index)  # the pending event is then skipped

    def _on_tick(self, node_id: str, incarnation: int, index: int) -> None:
        node = self.world.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        if self._tick_due.get(node_id) != index:
            return  # superseded by an earlier request
        del self._tick_due[node_id]
        self._tick_done[node_id] = index
        self._apply(self.policy.on_tick(self.world, node_id, self.now))
        self._retry_parked(node_id)
        if not self.timing.ticks_on_request:
            self._schedule_tick(node_id, index + 1)
        elif self._parked.get(node_id):
            self._request_tick(node_id, self.now)
