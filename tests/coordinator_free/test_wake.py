"""Ticks on request: a policy wakes its nodes only when their core has work, and nothing changes.

The GWTF core says when its next tick has anything to do (``FlowNode.next_tick_s``); the engine
ticks a node only then, on the node's grid of decision periods. Skipping the idle ticks must give
exactly the run that ticking every node every period gives.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Sequence

import pytest

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.sim.engine import Engine
from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy
from gwtf.coordinator_free.sim.policy import Action, PolicyTiming, Wake, WorldView
from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy
from tests.coordinator_free.sim_helpers import small_scenario


class _CountingGwtf(GwtfPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.ticks = 0

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        self.ticks += 1
        return super().on_tick(world, node_id, now)


class _EveryPeriodGwtf(_CountingGwtf):
    """GWTF with the engine ticking every node every period (the reference)."""

    def timing(self) -> PolicyTiming:
        return dataclasses.replace(super().timing(), ticks_on_request=False)


def _summary(engine: Engine) -> tuple[object, ...]:
    m = engine.metrics
    return (
        m.iterations_completed,
        m.sim_time_s,
        m.microbatches_completed,
        m.control_messages,
        m.control_bytes,
        m.restarts,
        m.replacements,
        m.wasted_gpu_s,
    )


@pytest.mark.parametrize("crash", [False, True])
def test_skipping_idle_ticks_gives_exactly_the_run_of_ticking_every_period(crash: bool) -> None:
    events = [{"t": 60.0, "node": "r1_0", "event": "crash"}] if crash else []
    runs = []
    ticks = []
    for policy in (_CountingGwtf(), _EveryPeriodGwtf()):
        scenario = small_scenario(
            relays_per_stage=3, stages=2, data_nodes=2, iterations=25, regions=3, events=events
        )
        engine = Engine(scenario, policy)
        engine.run()
        runs.append(_summary(engine))
        ticks.append(policy.ticks)
    assert runs[0] == runs[1]
    assert runs[0][0] == 25
    assert ticks[0] < 0.7 * ticks[1]  # many periods of many nodes had nothing to do


class _WakeRecorder(RoundRobinPolicy):
    """Round robin that ticks only on request; at r1_0's first tick it asks for +7 s, then +3 s."""

    def __init__(self) -> None:
        super().__init__()
        self.ticks: list[tuple[str, float]] = []

    def timing(self) -> PolicyTiming:
        return PolicyTiming(20.0, 20.0, tick_period_s=2.0, ticks_on_request=True)

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        self.ticks.append((node_id, now))
        if node_id == "r1_0" and len([n for n, _ in self.ticks if n == node_id]) == 1:
            return [Wake("r1_0", now + 7.0), Wake("r1_0", now + 3.0), Wake("r1_0", now + 9.0)]
        return []


def test_the_engine_ticks_on_the_node_grid_at_the_earliest_time_asked_and_not_otherwise() -> None:
    policy = _WakeRecorder()
    engine = Engine(small_scenario(relays_per_stage=2, stages=2, iterations=3), policy)
    engine.run()
    mine = [t for node, t in policy.ticks if node == "r1_0"]
    # The first tick at the node's phase, then the first grid point at or after +3 s (the
    # request for +7 s was replaced by it, the one for +9 s dropped), and no other.
    assert len(mine) == 2
    assert mine[1] - mine[0] == pytest.approx(4.0)
    others = {node for node, _ in policy.ticks if node != "r1_0"}
    assert others and all(sum(1 for n, _ in policy.ticks if n == node) == 1 for node in others)


class _PostponingRecorder(_WakeRecorder):
    """At r1_0's first tick it asks for +3 s, then postpones that to +5 s."""

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        self.ticks.append((node_id, now))
        if node_id == "r1_0" and len([n for n, _ in self.ticks if n == node_id]) == 1:
            return [Wake("r1_0", now + 3.0), Wake("r1_0", now + 5.0, postpone=True)]
        return []


def test_a_postponing_wake_moves_the_pending_tick_later() -> None:
    policy = _PostponingRecorder()
    engine = Engine(small_scenario(relays_per_stage=2, stages=2, iterations=6), policy)
    engine.run()
    mine = [t for node, t in policy.ticks if node == "r1_0"]
    # The tick asked for at +3 s (grid +4 s) never ran: the postponed one ran at the grid
    # point at or after +5 s instead.
    assert len(mine) == 2
    assert mine[1] - mine[0] == pytest.approx(6.0)


class _CheckedGwtf(_EveryPeriodGwtf):
    """Ticks every period, and checks each tick the core called idle on a copy first."""

    def __init__(self) -> None:
        super().__init__()
        self.idle_ticks_checked = 0

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        node = self.flow_nodes.get(node_id)
        if node is not None and node.next_tick_s(now) > now + 1e-6:
            assert copy.deepcopy(node).tick(now) == [], (node_id, now)
            self.idle_ticks_checked += 1
        return super().on_tick(world, node_id, now)


def test_a_tick_before_the_time_the_core_names_sends_nothing() -> None:
    events = [{"t": 50.0, "node": "r2_1", "event": "crash"}]
    scenario = small_scenario(
        relays_per_stage=3, stages=2, data_nodes=2, iterations=40, regions=3, events=events
    )
    policy = _CheckedGwtf()
    Engine(scenario, policy).run()
    assert policy.idle_ticks_checked > 150


def test_idle_moves_come_at_the_configured_chance_per_period() -> None:
    config = FlowConfig(stages=1, activation_bytes=1.0, anneal_probability_idle=0.1)
    node = FlowNode(NodeSpec("r", "relay", 1, 1, 1.0), config, random.Random(7))
    draws = [node._periods_until_idle_move() for _ in range(20_000)]
    # Geometric: periods before the next move, mean (1 - p) / p = 9, P(0) = p.
    assert sum(draws) / len(draws) == pytest.approx(9.0, rel=0.05)
    assert draws.count(0.0) / len(draws) == pytest.approx(0.1, rel=0.1)
