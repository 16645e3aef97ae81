"""DT-FM (Yuan et al., NeurIPS 2022; ``DS3Lab/DT-FM``) as a simulator policy: a static schedule.
Every modelling choice, with its source and its measured effect, is tabled in
``baselines/README.md``.

* At start, the genetic search of ``dtfm_schedule`` groups relays into stages and matches them into
  D pipelines (relays beyond S x D are spares). Pipeline i serves data node i mod (#data nodes);
  each data node's batch is split evenly over its pipelines (a static quota per pipeline), and a
  pipeline holds at most as many microbatches as its smallest relay's capacity.
* DT-FM has no fault tolerance: the release's pipelines are NCCL send/recv between fixed ranks
  (``pipeline_parallel/dist_gpipe_pipeline_async.py``) and its data parallelism an NCCL
  all-reduce (``data_parallel/dist_dp_allreduce.py``); a dead rank hangs both, and there is no
  per-microbatch retry or watchdog. A hop that misses its deadline (30 s both ways, our choice: NCCL
  waits forever) marks the relay dead (for 60 s, or until it rejoins).
* ``on_failure="relaunch"`` (default, the release): the job is relaunched on the surviving
  devices, with the schedule re-matched within each stage, from the start of the iteration (we
  grant it a checkpoint at each iteration boundary, which the release does not write): every
  unfinished microbatch of the iteration restarts. A microbatch that makes no progress for the
  watchdog's time is a hang, handled the same way.
* ``on_failure="rematch"`` (a fault-tolerant extension, not in the release): only the broken
  pipeline's microbatches restart and wait; once everything else of the iteration is done, the
  scheduler re-matches pipelines among the surviving relays of each stage and the stalled work
  runs there.
* At the end of an iteration in which membership changed (a detected crash, a join), the full
  search runs again; relays it moves change stage at the boundary (weights downloaded then).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from gwtf.coordinator_free.baselines.dtfm_schedule import Schedule, search_schedule
from gwtf.coordinator_free.sim.policy import (
    Action,
    Forward,
    Hold,
    HopDecision,
    MicrobatchView,
    MoveStage,
    PolicyDefaults,
    PolicyTiming,
    RepairDecision,
    Restart,
    RestartIteration,
    Retry,
    WorldView,
)
from gwtf.coordinator_free.sim.suspicion import Suspicions
from gwtf.errors import ConfigError

HOP_TIMEOUT_S = 30.0
ON_FAILURE = ("relaunch", "rematch")


class DtfmPolicy(PolicyDefaults):
    """Static DT-FM schedule; a crash stalls its pipeline until the scheduler re-matches."""

    name: ClassVar[str] = "dtfm"

    def __init__(
        self,
        hop_timeout_s: float = HOP_TIMEOUT_S,
        generations: int = 30,
        on_failure: str = "relaunch",
    ) -> None:
        if on_failure not in ON_FAILURE:
            raise ConfigError(f"DT-FM on_failure {on_failure!r}: choose one of {ON_FAILURE}")
        self._timing = PolicyTiming(hop_timeout_s, hop_timeout_s)
        self._relaunch = on_failure == "relaunch"
        self.relaunches = 0
        self._generations = generations
        self._rng = random.Random(0)
        self._schedule: Schedule | None = None
        self._dead = Suspicions()
        self._clock_s = 0.0  # latest `now` seen: suspicions expire against it
        self._membership_changed = False
        self._broken: set[int] = set()
        self._quota: dict[int, int] = {}
        self._in_flight: dict[int, int] = {}
        self._mb_pipeline: dict[int, int] = {}
        self._expected = 0
        self._done = 0
        self.reschedules = 0

    def timing(self) -> PolicyTiming:
        return self._timing

    @property
    def schedule(self) -> Schedule | None:
        return self._schedule

    # ---- membership ----

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        self._rng = random.Random(rng.random())
        relays = [n for n in world.known_nodes() if world.spec(n).role == "relay"]
        unplaced = [r for r in relays if world.stage_of(r) is None]
        if len(unplaced) < len(relays):
            # Some relays come with a stage: keep them, fill the thinnest stages, and let the
            # first iteration match pipelines within the stages.
            placement: dict[str, int] = {}
            for relay in unplaced:
                counts = {s: len(world.nodes_in_stage(s)) for s in range(1, world.stages + 1)}
                for placed, stage in placement.items():
                    counts[stage] += 1 if placed else 0
                placement[relay] = min(counts, key=lambda s: (counts[s], s))
            return placement
        self._schedule = self._search(world, [relays])
        placement = self._schedule.stage_of() if self._schedule else {}
        for index, spare in enumerate(self._schedule.spares if self._schedule else relays):
            placement[spare] = 1 + index % world.stages
        return placement

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        self._clock_s = now
        self._dead.clear(node_id)
        self._membership_changed = True
        if self._schedule is not None and node_id in self._schedule.stage_of():
            return self._schedule.stage_of()[node_id]  # a device that comes back resumes its slot
        counts = {
            s: len([n for n in self._usable(world, s) if n != node_id])
            for s in range(1, world.stages + 1)
        }
        return min(counts, key=lambda s: (counts[s], s))

    # ---- iterations ----

    def on_iteration_start(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        self._clock_s = now
        self._expected = sum(world.spec(d).capacity for d in world.data_nodes())
        self._done = 0
        self._mb_pipeline.clear()
        schedule = self._schedule
        if schedule is None or self._broken or self._uses_dead(schedule):
            self._rematch(world)
        elif (stale := self._stale_pipelines(world, schedule)) and not self._rematch(world):
            # A move did not happen (its relay had died unnoticed) and no new match is possible
            # (some stage has no usable relay): the pipelines through a relay of the wrong stage
            # wait, broken, until a join lets the stalled work be re-matched.
            self._broken |= stale
        self._reset_quotas(world, self._expected)
        return ()

    def on_iteration_end(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        self._clock_s = now
        if not self._membership_changed:
            return ()
        self._membership_changed = False
        relays = [
            n for n in world.known_nodes() if world.spec(n).role == "relay" and not self._is_dead(n)
        ]
        schedule = self._search(world, [relays])
        if schedule is None:
            return ()
        self._schedule = schedule
        self._broken.clear()
        stage_of = schedule.stage_of()
        return [MoveStage(r, s) for r, s in sorted(stage_of.items()) if world.stage_of(r) != s]

    # ---- routing ----

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        self._clock_s = now
        if mb.stage == 0:
            return self._dispatch(world, mb)
        if mb.stage == world.stages:
            return Forward(mb.origin)
        pipeline = self._mb_pipeline.get(mb.mb_id)
        if self._schedule is None or pipeline is None:
            self._refund(mb.mb_id, broken=False)
            return Restart()
        return Forward(self._schedule.pipelines[pipeline][mb.stage])

    def on_microbatch_done(
        self, world: WorldView, mb: MicrobatchView, now: float
    ) -> Sequence[Action]:
        self._clock_s = now
        self._done += 1
        pipeline = self._mb_pipeline.pop(mb.mb_id, None)
        if pipeline is not None:
            self._in_flight[pipeline] -= 1
        if self._all_rest_stalled():
            self._rematch(world)
        return [Retry(d) for d in world.data_nodes()]

    def on_stall(self, world: WorldView, mb: MicrobatchView, now: float) -> RepairDecision:
        if self._relaunch:  # the job hangs: relaunched like after a detected failure
            return self._relaunch_job(world, mb)
        self._refund(mb.mb_id, broken=False)
        return Restart()

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        self._clock_s = now
        return self._fail(world, mb, suspect)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        self._clock_s = now
        return self._fail(world, mb, suspect)

    # ---- internals ----

    def _dispatch(self, world: WorldView, mb: MicrobatchView) -> HopDecision:
        if self._schedule is None:
            self._rematch(world)
        schedule = self._schedule
        if schedule is None:
            return Hold()
        for pipeline in self._pipelines_of(world, mb.origin):
            if pipeline in self._broken:
                continue
            cap = min(world.spec(r).capacity for r in schedule.pipelines[pipeline])
            if self._quota.get(pipeline, 0) > 0 and self._in_flight.get(pipeline, 0) < cap:
                self._quota[pipeline] -= 1
                self._in_flight[pipeline] = self._in_flight.get(pipeline, 0) + 1
                self._mb_pipeline[mb.mb_id] = pipeline
                return Forward(schedule.pipelines[pipeline][0])
        if self._all_rest_stalled() and self._rematch(world):
            return Hold(actions=tuple(Retry(d) for d in world.data_nodes()))
        return Hold()

    def _fail(self, world: WorldView, mb: MicrobatchView, suspect: str) -> Restart:
        if world.spec(suspect).role == "relay":
            self._dead.mark(suspect, self._clock_s)
            self._membership_changed = True
        if self._relaunch:
            return self._relaunch_job(world, mb)
        self._refund(mb.mb_id, broken=True)
        return Restart()

    def _relaunch_job(self, world: WorldView, mb: MicrobatchView) -> Restart:
        """The whole job restarts from the iteration's start on the surviving relays: every
        unfinished microbatch of the iteration is sent again over a re-matched schedule."""
        self.relaunches += 1
        self._mb_pipeline.clear()
        self._in_flight = {p: 0 for p in self._in_flight}
        if not self._rematch(world) and self._schedule is not None:
            # Some stage has no live relay: the relaunch waits for a join (Retry on join).
            self._broken = set(range(len(self._schedule.pipelines)))
            self._reset_quotas(world, self._expected - self._done)
        return Restart(actions=(RestartIteration(besides=mb.mb_id),))

    def _refund(self, mb_id: int, broken: bool) -> None:
        """A restarted microbatch goes back to its pipeline's quota (the pipeline must redo it)."""
        pipeline = self._mb_pipeline.pop(mb_id, None)
        if pipeline is None:
            pipeline = 0
        else:
            self._in_flight[pipeline] -= 1
            if broken:
                self._broken.add(pipeline)
        self._quota[pipeline] = self._quota.get(pipeline, 0) + 1

    def _all_rest_stalled(self) -> bool:
        """Everything of the iteration not done is waiting on a broken pipeline."""
        stalled = sum(self._quota.get(p, 0) for p in self._broken)
        in_flight = sum(self._in_flight.values())
        return stalled > 0 and in_flight == 0 and self._done + stalled >= self._expected

    def _rematch(self, world: WorldView) -> bool:
        """Re-match pipelines among the live relays of each stage; stalled quota moves there.

        False when some stage has no usable relay (the work waits for a join).
        """
        blocks = [self._usable(world, s) for s in range(1, world.stages + 1)]
        schedule = self._search(world, blocks)
        if schedule is None:
            return False
        self.reschedules += 1
        # Everything of the iteration neither done nor in flight goes onto the new pipelines.
        leftover = max(0, self._expected - self._done - sum(self._in_flight.values()))
        self._schedule = schedule
        self._broken.clear()
        self._in_flight = {p: 0 for p in range(len(schedule.pipelines))}
        self._reset_quotas(world, leftover)
        return True

    def _reset_quotas(self, world: WorldView, total: int) -> None:
        schedule = self._schedule
        if schedule is None:
            return
        count = len(schedule.pipelines)
        self._quota = {p: total // count + (1 if p < total % count else 0) for p in range(count)}
        self._in_flight = {p: self._in_flight.get(p, 0) for p in range(count)}

    def _pipelines_of(self, world: WorldView, origin: str) -> list[int]:
        schedule = self._schedule
        if schedule is None:
            return []
        data = list(world.data_nodes())
        count = len(schedule.pipelines)
        own = [p for p in range(count) if data[p % len(data)] == origin]
        others = [p for p in range(count) if p not in own]
        # A data node with fewer pipelines than data nodes shares the others' quota.
        return own + others

    def _usable(self, world: WorldView, stage: int) -> list[str]:
        return [n for n in world.nodes_in_stage(stage) if not self._is_dead(n)]

    def _is_dead(self, relay: str) -> bool:
        return self._dead.is_suspected(relay, self._clock_s)

    def _stale_pipelines(self, world: WorldView, schedule: Schedule) -> set[int]:
        """The pipelines with a relay that is not at the stage the schedule gives it."""
        return {
            p
            for p, relays in enumerate(schedule.pipelines)
            if any(world.stage_of(r) != k + 1 for k, r in enumerate(relays))
        }

    def _uses_dead(self, schedule: Schedule) -> bool:
        return any(self._is_dead(r) for p in schedule.pipelines for r in p)

    def _search(self, world: WorldView, blocks: list[list[str]]) -> Schedule | None:
        microbatches = sum(world.spec(d).capacity for d in world.data_nodes())
        return search_schedule(world, blocks, microbatches, self._rng, self._generations)
