"""A live swarm finds itself through the DHT and hints, with no peer exchange at all."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.runtime.swarm_harness import Swarm, run_swarm


def test_a_live_swarm_meets_through_the_dht_not_the_exchange(tmp_path: Path) -> None:
    swarm = Swarm()

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, 1, 4, {"a1": 1, "b1": 2}, swarm=swarm)

    results = trio.run(main)
    assert [r.iteration for r in results] == [0]
    ids = {name: node.book.own.peer_id for name, node in swarm.nodes.items()}
    for name, node in swarm.nodes.items():
        assert node.discovery is not None
        counters = node.discovery.counters
        assert set(node.book.peers) == set(ids.values()) - {ids[name]}
        assert counters.exchanges == 0  # the routing table was never empty: no fallback
        assert counters.dht_peers + counters.hints_used >= 1
    # Cards carry each relay's stage: a joiner of stage 2 would ask b1, and only b1.
    stages = {record.peer_id: record.stage for record in swarm.nodes["a1"].book.peers.values()}
    assert stages == {ids["data"]: 0, ids["b1"]: 2}
