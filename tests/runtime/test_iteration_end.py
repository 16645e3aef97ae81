"""Ending an iteration: a stage whose replicas do not step is counted and warned about."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from tests.runtime.swarm_harness import Swarm, run_swarm


def test_a_stage_with_no_replica_stepping_is_counted_and_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No relay answers the probe in time (a deadline nothing can meet): the iteration still
    ends, but its result names both stages as not stepped, the counter in the data node's stats
    grows, and a warning says so."""
    swarm = Swarm()

    async def unreachable_probe(swarm: Swarm) -> None:
        while "data" not in swarm.nodes:
            await trio.sleep(0.01)
        swarm.nodes["data"].role.roster.probe_timeout_s = 1e-6  # type: ignore[union-attr]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path, 1, 2, {"a1": 1, "b1": 2}, unreachable_probe, swarm=swarm
            )

    with caplog.at_level(logging.WARNING, logger="gwtf.node.runtime.roles.data"):
        results = trio.run(main)
    assert [r.relays_stepped for r in results] == [0]
    assert results[0].stages_not_stepped == (1, 2)
    assert swarm.nodes["data"].role.stats.stages_not_stepped == 2
    assert any("no replica of stage(s) 1, 2 stepped" in m for m in caplog.messages)
