"""A live swarm whose relays nobody can dial trains through its data node's circuit relay."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.relay import is_circuit, is_relayed, relay_through
from tests.runtime.swarm_harness import Swarm, reference_losses, run_swarm

ITERATIONS = 2
BATCH = 4


def test_neighbouring_stages_that_cannot_dial_each_other_train_through_the_data_node(
    tmp_path: Path,
) -> None:
    swarm = Swarm()
    seen: dict[str, bool] = {}

    async def during(swarm: Swarm) -> None:
        # While the data node trains: once it stops, its relay (and the circuits) go with it.
        while not {"a1", "b1"} <= swarm.nodes.keys():
            await trio.sleep(0.05)
        a1, b1 = swarm.nodes["a1"], swarm.nodes["b1"]
        b1_id = ID.from_base58(b1.book.own.peer_id)
        while not a1.rpc.host.get_network().connections.get(b1_id):
            await trio.sleep(0.05)
        seen["advertised"] = is_circuit(a1.book.own.address) and is_circuit(b1.book.own.address)
        seen["relayed"] = is_relayed(a1.rpc.host, b1_id)
        data_id = swarm.nodes["data"].book.own.peer_id
        seen["through the data node"] = str(relay_through(a1.rpc.host, b1_id)) == data_id
        # The flow core charges the edge the leg to the data node, as a1 measured it (the
        # measured value, once a1 has an estimate of its link to the data node).
        core, b1_key = a1.flow.node, b1.book.own.peer_id
        while not swarm.training_done.is_set():
            edge = core.peers.get(b1_key)
            if edge is not None and edge.relay_leg_ms is not None:
                seen["leg charged"] = edge.relayed
                break
            await trio.sleep(0.05)
        await swarm.training_done.wait()
        # The data node metered what it relayed: each stage's activations went through it.
        relay = swarm.nodes["data"].relay
        hop = relay.hop if relay is not None else None
        relayed = hop.meter.view() if hop is not None else {}
        seen["metered"] = all(
            relayed.get(n.book.own.peer_id, {}).get(way, 0) > 0
            for n in (a1, b1)
            for way in ("sent", "received")
        )

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(60):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a1": 1, "b1": 2},
                during=during,
                swarm=swarm,
                relay_settings={"reachable": False, "listen": ()},  # nobody can dial them
                data_settings={"relay_service": True},
            )

    results = trio.run(main)
    assert [r.loss for r in results] == pytest.approx(reference_losses(ITERATIONS, BATCH), rel=1e-4)
    assert seen == dict.fromkeys(
        ("advertised", "relayed", "through the data node", "leg charged", "metered"), True
    )
