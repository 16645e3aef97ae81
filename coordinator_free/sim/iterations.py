"""Iterations in the engine: injection, the barrier, gradient averaging, stage moves, useful work.

An iteration ends when every microbatch injected in it finished its backward; then each stage's
live replicas average gradients by ring all-reduce (stages in parallel), pending stage moves
happen, and the next iteration starts.
"""

from __future__ import annotations

from coordinator_free.sim.events import ALLREDUCE_DONE, STALL
from coordinator_free.sim.membership import MembershipMixin
from coordinator_free.sim.microbatch import Microbatch


class IterationsMixin(MembershipMixin):
    """Starting iterations, the barrier, the all-reduce and counting useful compute."""

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
                self._schedule(self.now + self.timing.stall_timeout_s, STALL, mb_id, 0)
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
        self._schedule(self.now + self._allreduce_s(), ALLREDUCE_DONE)

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
