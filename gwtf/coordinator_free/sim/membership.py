"""Who is up in the engine: nodes brought up, churn (crashes and rejoins), joins, weight downloads.

Every node draws its up and down times from its own seeded stream, so every policy faces the
same crashes. The engine never tells a surviving node who crashed (only a ``full_knowledge``
policy hears of it).
"""

from __future__ import annotations

import random

from gwtf.coordinator_free.protocol.config import DATA_STAGE
from gwtf.coordinator_free.sim.events import CRASH, JOIN, RETRY, TASK_FWD
from gwtf.coordinator_free.sim.recovery import RecoveryMixin


class MembershipMixin(RecoveryMixin):
    """Bringing nodes up, crashing them, rejoining them, and what a joiner downloads."""

    # ---- membership ----

    def _bring_up(self, node_id: str, download: bool) -> None:
        node = self.world.nodes[node_id]
        node.alive = True
        node.up_since_s = self.now
        node.compute_free_at_s = self.now
        node.nic_free_at_s = self.now
        node.ready_at_s = self.now + (self._download_s(node_id) if download else 0.0)
        self._ever_joined.add(node_id)
        self.liveness.append((self.now, node_id, True))
        period = self.timing.tick_period_s
        if period is not None:  # the first tick at a random phase; on_node_up may ask sooner
            self._tick_phase_s[node_id] = self.now + self._rng.uniform(0.0, period)
            self._tick_done[node_id] = -1
            self._schedule_tick(node_id, 0)
        self._apply(self.policy.on_node_up(self.world, node_id, self.now))
        rate = self.scenario.churn.crash_rate_per_hour
        if rate > 0 and node.spec.role == "relay":
            crash_at = self.now + self._churn_rng(node_id).expovariate(rate / 3600.0)
            self._schedule(crash_at, CRASH, node_id, node.incarnation)

    def _on_join(self, node_id: str, _unused: object) -> None:
        node = self.world.nodes[node_id]
        if node.alive:
            return
        first_time = node_id not in self._ever_joined
        if not first_time:
            # A new life: hops sent to the dead node carry the number it died with, and must
            # not land in this life (it may serve another stage now).
            node.incarnation += 1
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
                self._schedule(self.now, RETRY, parked_at)

    def _on_crash(self, node_id: str, incarnation: int | None) -> None:
        node = self.world.nodes[node_id]
        if not node.alive or (incarnation is not None and incarnation != node.incarnation):
            return
        node.alive = False
        node.down_at_s = self.now
        node.incarnation += 1
        self.metrics.crashes += 1
        self.liveness.append((self.now, node_id, False))
        phase = "idle"
        for start, end, task in node.tasks:
            if start < self.now:
                self._count_compute(node_id, node.incarnation - 1, start, min(end, self.now))
                self.metrics.cut_by_crash_gpu_s += min(end, self.now) - start
                phase = "forward" if task == TASK_FWD else "backward"
        self.metrics.crashes_by_phase[phase] += 1
        node.tasks.clear()
        node.held.clear()
        node.waiting.clear()
        for mb_id, _ in self._parked.pop(node_id, ()):
            lost = self._mbs.get(mb_id)
            if lost is not None and lost.parked_at == node_id:
                lost.unpark(self.now)  # lost with the node: the origin's watchdog will see it
        if node.spec.role == "data":
            self._abandon_origin(node_id)
        if self.policy.full_knowledge:
            self._apply(self.policy.on_node_down(self.world, node_id, self.now))
        churn = self.scenario.churn
        if churn.rejoin and churn.crash_rate_per_hour > 0 and node.spec.role == "relay":
            downtime = churn.mean_downtime_s
            rng = self._churn_rng(node_id)
            back = self.now + (rng.expovariate(1.0 / downtime) if downtime > 0 else 0.0)
            self._schedule(back, JOIN, node_id, None)

    def _churn_rng(self, node_id: str) -> random.Random:
        """Each node's own stream of up/down times: churn is the same whatever the policy does."""
        rng = self._churn_rngs.get(node_id)
        if rng is None:
            rng = random.Random(f"{self.scenario.seed}/churn/{node_id}")
            self._churn_rngs[node_id] = rng
        return rng

    def _abandon_origin(self, data_node: str) -> None:
        in_flight = self._iteration_mbs if self._barrier else list(self._mbs.values())
        abandoned = 0
        for mb in in_flight:
            if mb.origin == data_node and not mb.done and not mb.abandoned:
                lost = mb.recomputed_s + sum(r[2] for r in mb.records())
                self.metrics.lost_with_replica_gpu_s += lost
                mb.abandoned = True
                mb.version += 1
                self.metrics.microbatches_abandoned += 1
                self._release_holds(mb)
                self._remaining -= 1
                abandoned += 1
        if self._barrier:
            self._check_barrier()
            return
        # Without the barrier the global batch still needs them: the live origins take them over.
        live = [d for d in self.world.data_nodes() if self.world.nodes[d].alive]
        for index in range(abandoned if live else 0):
            origin = live[index % len(live)]
            self._decide_at(origin, self._new_microbatch(origin))

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
