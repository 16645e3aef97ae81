"""Reroutes settle in a large swarm even when cost adverts are coarse.

A relay's cost jumps whenever a next-stage peer fills or frees; a reroute on such a jump fills
and frees peers along two paths, which upstream nodes see as new jumps. The second look of
``MovesMixin.try_reroute`` (the same flow and peer best twice in a row) keeps passing jumps from
moving flows. Without it a 10 % advert threshold never settled (bench/README.md, sim_scale):
in this swarm 344 reroutes and 288 k control messages in 20 iterations, against 46 and 149 k.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gwtf.coordinator_free.protocol import routing
from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.protocol.moves import MovesMixin
from gwtf.coordinator_free.sim.algorithms import make_policy
from gwtf.coordinator_free.sim.engine import EngineConfig, run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario


def test_reroutes_settle_in_a_500_node_swarm_with_a_coarse_advert_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routing, "_ADVERT_CHANGE", 0.10)  # twice the shipped threshold
    reroutes = 0
    try_reroute: Callable[[MovesMixin, float], list[Outbound]] = MovesMixin.try_reroute

    def counted(node: MovesMixin, now: float) -> list[Outbound]:
        nonlocal reroutes
        sends = try_reroute(node, now)
        reroutes += bool(sends)
        return sends

    monkeypatch.setattr(MovesMixin, "try_reroute", counted)
    size = GridSize(stages=8, relays=490, data_nodes=10, data_capacity=16, iterations=20)
    scenario = build_scenario(GridCell(True, True, 0.0), 0, size)
    metrics = run_scenario(scenario, make_policy("gwtf"), EngineConfig())
    assert metrics.stopped_reason == "finished"
    assert reroutes < 100
    assert metrics.control_messages < 200_000
