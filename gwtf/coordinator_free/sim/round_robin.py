"""The simplest correct routing policy: round-robin over a stage's replicas, re-send on timeout.

It ignores costs and capacities on purpose. It is the engine's reference policy in tests: every
decision is obvious, so what a run measures is the engine, not the routing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from gwtf.coordinator_free.sim.policy import (
    Forward,
    Hold,
    HopDecision,
    MicrobatchView,
    PolicyDefaults,
    PolicyTiming,
    RepairDecision,
    Replace,
    Restart,
    WorldView,
)
from gwtf.coordinator_free.sim.suspicion import Suspicions


class RoundRobinPolicy(PolicyDefaults):
    """Next hop = the next replica of the next stage not suspected dead; the sink is the origin."""

    name: ClassVar[str] = "round_robin"

    def __init__(self, forward_timeout_s: float = 20.0, backward_timeout_s: float = 20.0) -> None:
        self._timing = PolicyTiming(forward_timeout_s, backward_timeout_s)
        self._turn: dict[int, int] = {}
        self._suspects = Suspicions()

    def timing(self) -> PolicyTiming:
        return self._timing

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        unplaced = [n for n in world.known_nodes() if _unplaced_relay(world, n)]
        return {node: 1 + index % world.stages for index, node in enumerate(unplaced)}

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        self._suspects.clear(node_id)
        sizes = {
            s: len([n for n in self._usable(world, s, now) if n != node_id])
            for s in range(1, world.stages + 1)
        }
        return min(sizes, key=lambda s: (sizes[s], s))

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        if mb.stage == world.stages:
            return Forward(mb.origin)
        target = self._next(world, mb.stage + 1, now)
        return Forward(target) if target is not None else Hold()

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        self._suspects.mark(suspect, now)
        return self.choose_next_hop(world, node_id, mb, now)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        self._suspects.mark(suspect, now)
        target = self._next(world, mb.stage - 1, now)
        return Replace(mb.stage - 1, target) if target is not None else Restart()

    def _usable(self, world: WorldView, stage: int, now: float) -> Sequence[str]:
        members = world.nodes_in_stage(stage)
        if self._suspects.is_empty():  # the usual case: no scan of the whole stage
            return members
        return [n for n in members if not self._suspects.is_suspected(n, now)]

    def _next(self, world: WorldView, stage: int, now: float) -> str | None:
        candidates = self._usable(world, stage, now)
        if not candidates:
            return None
        turn = self._turn.get(stage, 0)
        self._turn[stage] = turn + 1
        return candidates[turn % len(candidates)]


def _unplaced_relay(world: WorldView, node_id: str) -> bool:
    return world.spec(node_id).role == "relay" and world.stage_of(node_id) is None
