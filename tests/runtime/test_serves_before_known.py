"""A node serves the flow protocol and the data plane before any peer learns of it.

A joiner runs discovery (it finds its stage's replicas through it) while it loads its stage's
state. Had it announced itself meanwhile, the running nodes would learn of it and greet it on a
protocol it does not speak yet: the request is refused ('na', protocol not supported), and a
hop sent that way counts as a failed attempt of its microbatch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from gwtf.node.runtime import live_node
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.runtime.roles.data import DataRole, IterationResult
from tests.runtime.swarm_harness import Swarm, node_config, run_relay, run_swarm

ITERATIONS = 8
BATCH = 4
#: The joiner's load of its stage's state lasts at least this long: ample time for its card
#: and hints, were they published, to reach the running nodes.
JOIN_S = 1.5


def test_a_joiner_is_known_to_no_peer_before_it_serves_flows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    swarm = Swarm()
    known_when_served: dict[str, list[str]] = {}  # joiner -> running nodes that knew it then
    serve = FlowService.serve

    def serve_noting_who_knows(self: FlowService) -> None:
        node_id = str(self.rpc.host.get_id())
        knowers = [n for n, node in swarm.nodes.items() if node_id in node.book.peers]
        known_when_served[node_id] = knowers
        serve(self)

    real_join = live_node.join_stage

    async def slow_join(*args: object, **kwargs: object) -> None:
        await trio.sleep(JOIN_S)
        await real_join(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FlowService, "serve", serve_noting_who_knows)
    monkeypatch.setattr(live_node, "join_stage", slow_join)

    async def join(swarm: Swarm) -> None:
        while "data" not in swarm.nodes:
            await trio.sleep(0.01)
        data = swarm.nodes["data"].role
        assert isinstance(data, DataRole)
        while not data.results:
            await trio.sleep(0.01)
        config = node_config(
            tmp_path, "a2", "relay", 1, bootstrap=(swarm.nodes["data"].address,), join=True
        )
        assert swarm.nursery is not None
        await swarm.nursery.start(run_relay, config, swarm)

    async def main() -> list[IterationResult]:
        with trio.fail_after(150):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, {"a1": 1, "b1": 2}, join, swarm)

    caplog.set_level(logging.ERROR, logger="libp2p")
    results = trio.run(main)
    joiner = swarm.nodes["a2"].plane.node_id
    assert known_when_served[joiner] == []
    refused = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert refused == []
    assert all(r.restarts == 0 for r in results)
