"""Recovery in the engine: backward deadlines, one-hop repair, restarts and the origin's watchdog.

A repair recomputes only the dead hop on a replacement, fed from the neighbours' buffers; a
restart drops the attempt and re-injects the microbatch at its origin. Either bumps the
microbatch's version, so events of the superseded attempt are dropped when they fire.
"""

from __future__ import annotations

from gwtf.coordinator_free.sim.events import (
    ARRIVE_REPAIR,
    BWD_DEADLINE,
    CALL_BWD,
    INJECT,
    REPAIR_START,
    RESTART,
    STALL,
    TASK_REPAIR,
)
from gwtf.coordinator_free.sim.hops import HopsMixin
from gwtf.coordinator_free.sim.microbatch import Microbatch
from gwtf.coordinator_free.sim.policy import (
    Hold,
    PolicyContractError,
    RepairDecision,
    Replace,
    Restart,
)


class RecoveryMixin(HopsMixin):
    """What happens when a backward hop misses its deadline or a microbatch stalls."""

    # ---- backward deadlines and repair ----

    def _backward_deadline_moot(
        self, sender: str, incarnation: int, mb_id: int, version: int, hop: int, suspect: str
    ) -> bool:
        """Whether ``_on_backward_deadline`` would do nothing (then or at any later time)."""
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version or mb.acked_seq >= hop or mb.done:
            return True
        node = self.world.nodes[sender]
        return not node.alive or node.incarnation != incarnation

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
            deadline = self.now + self.timing.backward_timeout_s
            self._schedule_deadline(deadline, BWD_DEADLINE, *args, suspect)
        elif isinstance(decision, Restart):
            self._restart(mb)
        elif isinstance(decision, Replace):
            self._check_repair(mb, decision)
            self.metrics.replacements += 1
            mb.version += 1
            self._free_slot(suspect, mb.mb_id)
            if self._client_routed:
                mb.hop_sent_s = self.now
            when = self.now + max(0.0, decision.delay_s)
            self._schedule(when, REPAIR_START, mb.mb_id, mb.version, decision.to, sender)
        else:
            raise PolicyContractError(f"{self.policy.name} answered {decision!r} to a repair")

    # ---- client-routed backward calls ----

    def _call_backward(self, mb: Microbatch) -> None:
        """Client-routed: the origin calls the relay the policy names for the backward of the
        stage below; the call is a repair fed from the origin's own buffers."""
        decision = self.policy.choose_backward_hop(self.world, mb.origin, mb.view(), self.now)
        self._apply(decision.actions)
        if isinstance(decision, Replace):
            self._check_repair(mb, decision)
            mb.hop_sent_s = self.now
            when = self.now + max(0.0, decision.delay_s)
            self._schedule(when, REPAIR_START, mb.mb_id, mb.version, decision.to, mb.origin)
        elif isinstance(decision, Restart):
            self._restart(mb)
        elif isinstance(decision, Hold):
            self._schedule(self.now + self.timing.park_retry_s, CALL_BWD, mb.mb_id, mb.version)
        else:
            raise PolicyContractError(f"{self.policy.name} answered {decision!r} to a backward")

    def _on_call_backward(self, mb_id: int, version: int) -> None:
        mb = self._mbs.get(mb_id)
        if mb is not None and mb.version == version and not mb.done and not mb.abandoned:
            self._call_backward(mb)

    def _check_repair(self, mb: Microbatch, decision: Replace) -> None:
        stage = mb.stage - 1
        node = self.world.nodes.get(decision.to)
        if decision.stage != stage or node is None or node.stage != stage or stage < 1:
            raise PolicyContractError(
                f"{self.policy.name} repaired stage {decision.stage} with {decision.to}; "
                f"the hop to compute is at stage {stage}"
            )

    def _on_repair_start(self, mb_id: int, version: int, replacement: str, sender: str) -> None:
        mb = self._mbs.get(mb_id)
        if mb is None or mb.version != version:
            return
        upstream = mb.upstream_of_dead_hop()
        nodes = self.world.nodes
        if not nodes[upstream].alive or not nodes[sender].alive:
            when = self.now + self.timing.forward_timeout_s
            self._schedule(when, RESTART, mb_id, version)
            return
        node = nodes[replacement]
        mb.replace_dead_hop(replacement)
        mb.hop_seq += 1
        if node.alive and node.stage == mb.stage - 1:
            if len(node.held) >= node.spec.capacity:
                # A repair never waits behind forwards: that could deadlock a full stage.
                self.metrics.capacity_exceeded += 1
            node.held.add(mb_id)
            arrival = max(
                self._transfer(upstream, replacement), self._transfer(sender, replacement)
            )
            self._schedule(
                arrival, ARRIVE_REPAIR, replacement, node.incarnation, mb_id, version, sender
            )
        else:
            # The replacement crashed during the probe, or came back at another stage: the
            # repair is lost like a hop to a dead node, and its deadline repairs again.
            self.metrics.hops_lost += 1
        deadline = self.now + self.timing.backward_timeout_s
        hop = (sender, nodes[sender].incarnation, mb_id, version, mb.hop_seq)
        self._schedule_deadline(deadline, BWD_DEADLINE, *hop, replacement)

    def _on_arrive_repair(
        self, receiver: str, incarnation: int, mb_id: int, version: int, sender: str
    ) -> None:
        mb = self._arrived(receiver, incarnation, mb_id, version)
        if mb is None:
            return
        self._enqueue(receiver, TASK_REPAIR, self.world.compute_ms(receiver) / 1000.0, mb, sender)

    # ---- restarts and the watchdog ----

    def _restart(self, mb: Microbatch) -> None:
        self.metrics.restarts += 1
        self.metrics.restarted_gpu_s += mb.recomputed_s + sum(r[2] for r in mb.records())
        self._release_holds(mb)
        mb.restart(self.now)
        self._schedule(self.now, INJECT, mb.mb_id, mb.version)

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
            self._schedule(due, STALL, mb_id, 0)
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
        self._schedule(self.now + stall_s, STALL, mb_id, 0)
