"""Iterations in the engine: injection, the barrier, gradient averaging, stage moves, useful work.

An iteration ends when every microbatch injected in it finished its backward; then each stage's
live replicas average gradients by butterfly all-reduce (stages in parallel), pending stage moves
happen, and the next iteration starts. Without the barrier (SWARM as released), origins inject
continuously and an iteration is a global batch of finished microbatches (``_stream_done``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from gwtf.coordinator_free.sim.events import ALLREDUCE_DONE, STALL
from gwtf.coordinator_free.sim.membership import MembershipMixin
from gwtf.coordinator_free.sim.microbatch import Microbatch


class IterationsMixin(MembershipMixin):
    """Starting iterations, the barrier, the all-reduce and counting useful compute."""

    # ---- iterations ----

    def _start_iteration(self) -> None:
        iteration = self.metrics.iterations_completed
        self.world.current_iteration = iteration
        self._apply(self.policy.on_iteration_start(self.world, iteration, self.now))
        self._iteration_mbs = []
        injected = []
        for data_node in self.world.data_nodes():
            node = self.world.nodes[data_node]
            if not node.alive:
                continue
            injected += [self._new_microbatch(data_node) for _ in range(node.spec.capacity)]
        if not injected:
            self._finish("no_data_nodes")
            return
        if self._barrier:
            self._iteration_mbs = injected
            self._remaining = len(injected)
        else:  # once, at the start: origins inject the rest as their microbatches finish
            self._batch_size = len(injected)
            self._left_to_inject = self._batch_size * self.scenario.iterations - len(injected)
        self._running = True
        for mb in injected:
            self._decide_at(mb.origin, mb)
        self._check_barrier()

    def _new_microbatch(self, data_node: str) -> Microbatch:
        mb_id = self.metrics.microbatches_injected
        self.metrics.microbatches_injected += 1
        stages = self.scenario.model.stages
        iteration = self.world.current_iteration
        mb = Microbatch(mb_id, data_node, iteration, stages, self.now, self._client_routed)
        self._mbs[mb_id] = mb
        self._schedule(self.now + self.timing.stall_timeout_s, STALL, mb_id, 0)
        return mb

    # ---- without the barrier ----

    def _stream_done(self, mb: Microbatch) -> None:
        """A microbatch finished: its origin injects the next one; a full global batch ends an
        iteration, and the relays average in place (their compute waits for the all-reduce)."""
        self._iteration_mbs.append(mb)
        if self._left_to_inject > 0 and self.world.nodes[mb.origin].alive:
            self._left_to_inject -= 1
            self._decide_at(mb.origin, self._new_microbatch(mb.origin))
        if len(self._iteration_mbs) < self._batch_size:
            return
        iteration = self.world.current_iteration
        self._apply(self.policy.on_iteration_end(self.world, iteration, self.now))
        self._count_useful()
        self._iteration_mbs = []
        self.world.current_iteration = iteration + 1
        seconds = self._allreduce_s()
        for node_id in self.world.known_nodes():
            node = self.world.nodes[node_id]
            if node.alive and node.spec.role == "relay":
                node.compute_free_at_s = max(node.compute_free_at_s, self.now) + seconds
        self._schedule(self.now + seconds, ALLREDUCE_DONE)

    def _check_barrier(self) -> None:
        if not self._barrier or self._remaining > 0 or self._finished or not self._running:
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
        elif self._barrier:
            self._start_iteration()
        else:
            iteration = self.world.current_iteration
            self._apply(self.policy.on_iteration_start(self.world, iteration, self.now))

    def _finish(self, reason: str) -> None:
        self._finished = True
        self.metrics.stopped_reason = reason

    def _allreduce_s(self) -> float:
        """Butterfly all-reduce of each stage among its live replicas; stages reduce in parallel."""
        topology = self.scenario.topology
        slowest = 0.0
        for stage in range(self.scenario.model.stages + 1):
            regions = Counter(
                self.world.nodes[n].region_index for n in self.world.alive_in_stage(stage)
            )
            seconds = butterfly_allreduce_s(
                regions,
                self.scenario.model.stage_param_bytes,
                topology.latency_ms,
                topology.bandwidth_gbps,
            )
            slowest = max(slowest, seconds)
        return slowest

    def _count_useful(self) -> None:
        """Split the finished iteration's final paths into useful work and work that died with
        its node before the averaging; count the forwards its repairs recomputed."""
        nodes = self.world.nodes
        useful = lost = recomputed = 0.0
        for mb in self._iteration_mbs:
            if not mb.done:
                continue
            recomputed += mb.recomputed_s
            for node_id, incarnation, seconds in mb.records():
                node = nodes[node_id]
                if node.alive and node.incarnation == incarnation:
                    useful += seconds
                else:
                    lost += seconds
        self.metrics.useful_gpu_s += useful
        self.metrics.lost_with_replica_gpu_s += lost
        self.metrics.recomputed_gpu_s += recomputed


def butterfly_allreduce_s(
    replicas_by_region: Mapping[int, int],
    param_bytes: float,
    latency_ms: Sequence[Sequence[float]],
    bandwidth_gbps: Sequence[Sequence[float]],
) -> float:
    """Seconds to average ``param_bytes`` among replicas placed by region (count per region).

    Butterfly all-reduce, as hivemind's ``AllReduceRunner`` runs it for SWARM and DeDLOC: each of
    the n replicas owns 1/n of the parameters; in the reduce-scatter every replica sends each
    other replica its part (all at once, one after another on its own uplink) and reduces its
    own; the all-gather sends the reduced parts back the same way. Each phase takes the slowest
    replica's uplink time, sum over peers j of (P/n) / bandwidth to j, plus the largest one-way
    latency between two replicas: 2 latency steps, against the 2(n-1) of a ring.
    """
    count = sum(replicas_by_region.values())
    if count < 2:
        return 0.0
    part_bits = param_bytes * 8.0 / count
    present = sorted(r for r, n in replicas_by_region.items() if n > 0)
    upload_s = 0.0
    latency_s = 0.0
    for src in present:
        seconds = 0.0
        for dst in present:
            peers = replicas_by_region[dst] - (1 if dst == src else 0)
            if peers <= 0:
                continue
            seconds += peers * part_bits / (bandwidth_gbps[src][dst] * 1e9)
            latency_s = max(latency_s, latency_ms[src][dst] / 1000.0)
        upload_s = max(upload_s, seconds)
    return 2.0 * (upload_s + latency_s)
