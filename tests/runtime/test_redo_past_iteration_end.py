"""Two data nodes share a run (live swarm over loopback). The one in charge of ending an
iteration asks the other to redo its share's lost gradients (``RedoLost``), gives up waiting
and ends the iteration; the other's redo is still under way when its iteration ends, and its
microbatches' records (their attempt numbers) go with it. The redo is cut off there and the
asker gets a refusal: not a handler failure charged to an honest data node."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import trio

from gwtf.errors import ProtocolError
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.gradient_redo import RedoReport
from gwtf.node.runtime.roles.data import DataRole, Redone
from tests.runtime.swarm_harness import Swarm, run_swarm

ITERATIONS = 2
BATCH = 2
RELAYS = {"a1": 1, "b1": 2}


def test_a_redo_asked_by_another_data_node_ends_with_its_iteration(tmp_path: Path) -> None:
    swarm = Swarm()
    answers: list[dict[str, object] | str] = []

    async def arm(swarm: Swarm) -> None:
        while not {"data", "data-1", *RELAYS} <= set(swarm.nodes):
            await trio.sleep(0.01)
        asker, other = swarm.nodes["data"], swarm.nodes["data-1"]
        role = other.role
        assert isinstance(role, DataRole)
        relays_end, save_lost = role._relays_end, role.redo.save_lost

        async def ask_redo() -> None:
            request = control.RedoLost(0, 1 << 1)
            try:
                reply = await control.ask(asker.rpc, other.plane.node_id, request, 60.0)
                answers.append(control.decode_reply(reply))
            except ProtocolError as exc:
                answers.append(str(exc))

        async def relays_end_asked(
            iteration: int, data_nodes: list[str], redone: Redone
        ) -> tuple[dict[int, int] | None, int]:
            if iteration == 0 and swarm.nursery is not None and not answers:
                swarm.nursery.start_soon(ask_redo)
            return await relays_end(iteration, data_nodes, redone)

        async def slow_redo(
            iteration: int,
            first: int,
            paths: Mapping[int, tuple[str, ...]],
            only: Collection[int] | None = None,
        ) -> RedoReport:
            if only is None:
                return await save_lost(iteration, first, paths, only)
            # A redo that outlasts the asker's patience: its next step comes once the
            # iteration has ended here.
            while (iteration, first) in role.microbatches:
                await trio.sleep(0.01)
            await trio.sleep(0.05)
            role._take_attempt((iteration, first))
            return RedoReport()

        role._relays_end = relays_end_asked  # type: ignore[method-assign]
        role.redo.save_lost = slow_redo  # type: ignore[method-assign]

    async def main() -> None:
        with trio.fail_after(150):
            await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm, data_nodes=2)

    trio.run(main)
    assert answers == [{"ok": False, "why": "the iteration ended meanwhile", "holders": []}]
    assert [r.iteration for r in swarm.results["data-1"]] == list(range(ITERATIONS))
