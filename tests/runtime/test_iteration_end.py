"""Ending an iteration: a stage whose replicas do not step is counted and warned about."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.roles.data import DataRole
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


def test_a_holder_gone_before_the_last_attempt_counts_its_gradients_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage-2 replica says what it holds, then dies before the end's probe, on the last
    attempt (here the first: one attempt in all). No replica is told of it, so none names it
    missing; its stage steps without it. Its gradients are in no step: the iteration's result
    counts each of them lost, not 0."""
    monkeypatch.setattr(control, "MAX_END_ATTEMPTS", 1)
    swarm = Swarm()
    crashed: dict[str, int] = {}  # the crashed holder's id -> microbatches it held

    async def scenario(sw: Swarm) -> None:
        while not all(name in sw.nodes for name in ("data", "a1", "b1", "b2")):
            await trio.sleep(0.01)
        data = sw.nodes["data"].role
        assert isinstance(data, DataRole)
        names = {sw.nodes[name].plane.node_id: name for name in ("b1", "b2")}
        end_iteration = data.roster.end_iteration

        async def ending(iteration: int, timeout_s: float, holders, *args, **kwargs):  # type: ignore[no-untyped-def]
            held = [relay for relay, stage in (holders or {}).items() if stage == 2]
            if iteration == 1 and held and not crashed:
                relay = held[0]
                assert data.ending is not None
                crashed[relay] = data.ending.report.holders[relay][1]
                sw.crash(names[relay])
                await trio.sleep(0.5)  # its host closes
            return await end_iteration(iteration, timeout_s, holders, *args, **kwargs)

        data.roster.end_iteration = ending  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(150):
            return await run_swarm(
                tmp_path, 2, 4, {"a1": 1, "b1": 2, "b2": 2}, scenario, swarm=swarm
            )

    results = trio.run(main)
    assert len(crashed) == 1, crashed
    (held,) = crashed.values()
    assert held >= 1
    assert [r.gradients_lost for r in results] == [0, held]
    assert 2 not in results[1].stages_not_stepped


def test_another_data_nodes_holder_of_no_known_stage_counts_lost(tmp_path: Path) -> None:
    """With two data nodes, the one ending iteration 1 hears of a holder of the other's
    gradients whose stage it does not know (discovery never listed it): it can ask no stage
    to wait for it, so its gradients are in no step, and at least one counts lost."""
    swarm = Swarm()
    unknown = "a-relay-of-no-known-stage"

    async def scenario(sw: Swarm) -> None:
        while not all(name in sw.nodes for name in ("data", "data-1", "a1", "b1")):
            await trio.sleep(0.01)
        for name in ("data", "data-1"):
            peers = sw.nodes[name].role.peers  # type: ignore[union-attr]
            holders_of_others = peers.holders_of_others

            def with_unknown(iteration: int, live: list[str], told=holders_of_others) -> set[str]:
                return told(iteration, live) | ({unknown} if iteration == 1 else set())

            peers.holders_of_others = with_unknown

    async def main() -> None:
        with trio.fail_after(150):
            await run_swarm(tmp_path, 2, 2, {"a1": 1, "b1": 2}, scenario, swarm=swarm, data_nodes=2)

    trio.run(main)
    lost = [[r.gradients_lost for r in swarm.results[name]] for name in ("data", "data-1")]
    assert sorted(lost) == [[0, 0], [0, 1]], lost
