"""The data plane of the engine: a microbatch's hops forward and backward, compute, acks, parking.

Each node computes one task at a time (FIFO); activations queue on the sender's uplink. A forward
that reaches a full relay waits outside its memory until a slot frees. A microbatch the policy
holds is parked at its node and asked about again (module docstring of ``policy.py``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gwtf.coordinator_free.protocol.config import DATA_STAGE
from gwtf.coordinator_free.sim.engine_base import EngineBase
from gwtf.coordinator_free.sim.events import (
    ACK,
    ARRIVE_BWD,
    ARRIVE_FWD,
    BWD_DEADLINE,
    FORWARD_SHARE,
    FWD_DEADLINE,
    PARK_TIMER,
    RETRY,
    RETURN_FWD,
    TASK_BWD,
    TASK_FWD,
    TASK_REPAIR,
    TASK_SINK,
)
from gwtf.coordinator_free.sim.microbatch import Microbatch
from gwtf.coordinator_free.sim.policy import (
    Forward,
    Hold,
    HopDecision,
    HopReport,
    PolicyContractError,
    Restart,
)


class HopsMixin(EngineBase):
    """Forward and backward hops, compute tasks, acknowledgements and parked microbatches."""

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
            mb.unpark(self.now)
            if self._client_routed and decision.to == node_id:
                self._compute_loss_here(node_id, mb)
            else:
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

    # ---- parking ----

    def _park(self, node_id: str, mb: Microbatch) -> None:
        mb.parked_at = node_id
        mb.progress_s = self.now
        self._parked.setdefault(node_id, deque()).append((mb.mb_id, mb.version))
        self._arm_park_timer(node_id)
        if self.timing.ticks_on_request:  # the holder asks again every period, as it did
            self._request_tick(node_id, self.now)

    def _arm_park_timer(self, node_id: str) -> None:
        """Whatever the policy waits for (a suspicion to expire, a peer), ask again later."""
        if node_id not in self._park_timers:
            self._park_timers.add(node_id)
            self._schedule(self.now + self.timing.park_retry_s, PARK_TIMER, node_id)

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
                self._schedule(self.now, RETRY, node_id)

    # ---- forward ----

    def _compute_loss_here(self, origin: str, mb: Microbatch) -> None:
        """Client-routed: the origin computes the loss itself, with nothing to transfer."""
        if origin != mb.origin:
            raise PolicyContractError(
                f"{self.policy.name} is client-routed; microbatch {mb.mb_id} must end at its origin"
            )
        mb.set_next(origin)
        mb.hop_seq += 1
        mb.hop_sent_s = self.now
        self._enqueue(origin, TASK_SINK, self.world.compute_ms(origin) / 1000.0, mb, origin)

    def _send_forward(self, sender: str, receiver: str, mb: Microbatch) -> None:
        node = self.world.nodes[receiver]
        mb.set_next(receiver)
        mb.hop_seq += 1
        mb.hop_sent_s = self.now
        arrival = self._transfer(sender, receiver)
        incarnation = node.incarnation
        self._schedule(arrival, ARRIVE_FWD, receiver, incarnation, mb.mb_id, mb.version, sender)
        deadline = self.now + self.timing.forward_timeout_s
        args = (sender, self.world.nodes[sender].incarnation, mb.mb_id, mb.version, mb.hop_seq)
        self._schedule_deadline(deadline, FWD_DEADLINE, *args, receiver)

    def _on_arrive_forward(
        self, receiver: str, incarnation: int, mb_id: int, version: int, sender: str
    ) -> None:
        mb = self._arrived(receiver, incarnation, mb_id, version)
        if mb is None:
            return
        node = self.world.nodes[receiver]
        if node.spec.role == "data":
            compute_s = self.world.compute_ms(receiver) / 1000.0
            self._enqueue(receiver, TASK_SINK, compute_s, mb, sender)
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
        self._enqueue(node_id, TASK_FWD, compute_s * FORWARD_SHARE, mb, sender)

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

    def _forward_deadline_moot(
        self, sender: str, incarnation: int, mb_id: int, version: int, hop: int, suspect: str
    ) -> bool:
        """Whether ``_on_forward_deadline`` would do nothing (then or at any later time)."""
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version or mb.acked_seq >= hop:
            return True
        node = self.world.nodes[sender]
        return not node.alive or node.incarnation != incarnation

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
        for ahead in mb.rewind_before(suspect):
            self._free_slot(ahead, mb_id)
        self._free_slot(suspect, mb_id)
        self._retry_stage(mb.stage)
        decision = self.policy.on_forward_timeout(self.world, sender, mb.view(), suspect, self.now)
        self._apply_hop_decision(sender, mb, decision, parked_retry=False)

    # ---- compute ----

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
        if task == TASK_FWD:
            mb.record_forward(node_id, incarnation, seconds)
            if self._client_routed:
                self._return_to_origin(node_id, mb)
            else:
                self._schedule_ack(node_id, peer, mb, "forward")
                self._decide_at(node_id, mb)
        elif task == TASK_SINK:
            mb.record_sink(node_id, incarnation, seconds)
            self._schedule_ack(node_id, peer, mb, "forward")
            self._send_backward(node_id, mb)
        else:
            if self._client_routed:
                # The call is answered (and the stage done) when the input gradient reaches the
                # origin; an answer that never arrives is wasted work.
                self._answers[mb_id] = (node_id, incarnation, seconds)
                self._free_slot(node_id, mb_id)
                self._retry_stage(DATA_STAGE)  # the origins call every stage
                self._send_backward(node_id, mb)
                return
            if task == TASK_REPAIR:
                mb.record_repair(node_id, incarnation, seconds, FORWARD_SHARE)
            else:
                mb.record_backward(node_id, incarnation, seconds)
            self._schedule_ack(node_id, peer, mb, "backward")
            self._free_slot(node_id, mb_id)
            self._retry_stage(mb.stage - 1)
            self._send_backward(node_id, mb)

    def _return_to_origin(self, relay: str, mb: Microbatch) -> None:
        """Client-routed: the relay keeps nothing and sends its output back to the origin."""
        self._free_slot(relay, mb.mb_id)
        self._retry_stage(mb.stage)
        arrival = self._transfer(relay, mb.origin)
        origin = self.world.nodes[mb.origin]
        self._schedule(
            arrival, RETURN_FWD, mb.origin, origin.incarnation, mb.mb_id, mb.version, relay
        )

    def _on_return_forward(
        self, origin: str, incarnation: int, mb_id: int, version: int, relay: str
    ) -> None:
        """The output reached the origin: the call is answered (its ack); route the next stage."""
        mb = self._arrived(origin, incarnation, mb_id, version)
        if mb is None:
            return
        mb.acked_seq = max(mb.acked_seq, mb.hop_seq)
        report = HopReport(mb_id, origin, relay, mb.stage, "forward", mb.hop_sent_s, self.now)
        self._apply(self.policy.on_hop_acked(self.world, report, self.now))
        self._decide_at(origin, mb)

    def _schedule_ack(self, node_id: str, peer: str, mb: Microbatch, direction: str) -> None:
        arrive = self.now + self.world.latency_ms(node_id, peer) / 1000.0
        peer_incarnation = self.world.nodes[peer].incarnation
        args = (peer, peer_incarnation, mb.mb_id, mb.version, mb.hop_seq, node_id, direction)
        self._schedule(arrive, ACK, *args, mb.hop_sent_s, mb.stage)

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
        if self._client_routed:
            if sender == mb.origin:
                self._call_backward(mb)
                return
            # The relay answers the origin's call: the origin's deadline covers the whole call
            # (request, compute, answer), so the relay arms none of its own.
            arrival = self._transfer(sender, mb.origin)
            origin = self.world.nodes[mb.origin]
            answer = (mb.origin, origin.incarnation, mb.mb_id, mb.version, sender)
            self._schedule(arrival, ARRIVE_BWD, *answer)
            return
        receiver = mb.previous_hop()
        mb.direction = "backward"
        mb.hop_seq += 1
        mb.hop_sent_s = self.now
        arrival = self._transfer(sender, receiver)
        incarnation = self.world.nodes[receiver].incarnation
        self._schedule(arrival, ARRIVE_BWD, receiver, incarnation, mb.mb_id, mb.version, sender)
        args = (sender, self.world.nodes[sender].incarnation, mb.mb_id, mb.version, mb.hop_seq)
        self._schedule_deadline(
            self.now + self.timing.backward_timeout_s, BWD_DEADLINE, *args, receiver
        )

    def _on_arrive_backward(
        self, receiver: str, incarnation: int, mb_id: int, version: int, sender: str
    ) -> None:
        mb = self._arrived(receiver, incarnation, mb_id, version)
        if mb is None:
            return
        if self._client_routed:
            self._answer_backward_call(mb, sender)
            return
        if receiver == mb.origin and mb.stage == 1:
            mb.stage = DATA_STAGE
            self._schedule_ack(receiver, sender, mb, "backward")
            self._complete(mb)
            return
        compute_s = self.world.compute_ms(receiver) / 1000.0
        self._enqueue(receiver, TASK_BWD, compute_s * (1.0 - FORWARD_SHARE), mb, sender)

    def _answer_backward_call(self, mb: Microbatch, relay: str) -> None:
        """Client-routed: the input gradient is back at the origin, which answers its own call
        (the ack) and calls the stage below, or is done after stage 1."""
        node_id, incarnation, seconds = self._answers.pop(mb.mb_id)
        mb.record_repair(node_id, incarnation, seconds, FORWARD_SHARE)
        mb.acked_seq = max(mb.acked_seq, mb.hop_seq)
        report = HopReport(
            mb.mb_id, mb.origin, relay, mb.stage, "backward", mb.hop_sent_s, self.now
        )
        self._apply(self.policy.on_hop_acked(self.world, report, self.now))
        if mb.stage == 1:
            mb.stage = DATA_STAGE
            self._complete(mb)
        else:
            self._call_backward(mb)

    def _complete(self, mb: Microbatch) -> None:
        mb.done = True
        self.metrics.microbatches_completed += 1
        self._remaining -= 1
        self._apply(self.policy.on_microbatch_done(self.world, mb.view(), self.now))
        if self._barrier:
            self._check_barrier()
        else:
            self._stream_done(mb)
