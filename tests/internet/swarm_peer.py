"""One live node of a swarm on the test bed, as ``tests/runtime/swarm_harness.py`` configures
it (gpt-tiny in 2 stages), listening on every interface at port 4001, with ``p2p.reachable``
left on ``auto``: each node finds out for itself whether peers can dial it.

    python -m tests.internet.swarm_peer data ITERATIONS BATCH KEY_HEX
    python -m tests.internet.swarm_peer relay STAGE DATA_ADDRESS

``data`` (its node key KEY_HEX, so that its address is known before it starts) relays circuits
for nodes behind NAT (as a data node does by default), prints ``address A``, then ``loss I L``
for each of the first ITERATIONS it trains and ``done``; it trains and relays on until killed.
``relay`` joins stage STAGE through the data node (dialling it until it answers) and prints
``address A``, each reachability verdict as ``reach True|False|None LINE`` (``LINE`` what
``gwtf-node start`` prints), ``relayed S`` once a connection to a relay of stage S runs
through a relay, and ``down T`` / ``up T`` (wall clock) when the data node stops or starts
answering again; it serves until killed.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch
import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.host import peer_info
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.keepalive import ALIVE_PROTOCOL
from gwtf.node.p2p.reachability import Reachability
from gwtf.node.p2p.relay import is_relayed
from gwtf.node.p2p.rpc import PeerUnavailable, RpcLimits
from gwtf.node.runtime.live_node import LiveNode, run_live_node
from gwtf.node.runtime.roles.data import DataRole
from tests.runtime.swarm_harness import node_config

EVERY_INTERFACE = ("/ip4/0.0.0.0/tcp/4001",)


def say(*words: object) -> None:
    print(*words, flush=True)


def on_reachability(result: Reachability, line: str) -> None:
    say("reach", result.reachable, line)


async def data(iterations: int, batch: int, key: bytes) -> None:
    # It trains on after ``iterations`` (0: until stopped), so that the relays keep their
    # circuits through it while the test reads what they print.
    config = node_config(
        Path("."), "data", "data", 0, iterations=0, batch=batch, identity=identity_from_key(key),
        listen=EVERY_INTERFACE, reachable=None, relay_service=True,
        on_reachability=on_reachability,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:

        def started(node: LiveNode) -> None:
            say("address", node.address)
            nursery.start_soon(report_losses, node, iterations)

        await run_live_node(config, started)


async def report_losses(node: LiveNode, iterations: int) -> None:
    assert isinstance(node.role, DataRole)
    for iteration in range(iterations):
        while len(node.role.results) <= iteration:
            await trio.sleep(0.05)
        say("loss", iteration, repr(node.role.results[iteration].loss))
    say("done")


async def relay(stage: int, data_address: str) -> None:
    config = node_config(
        Path("."), f"relay-{stage}", "relay", stage, bootstrap=(data_address,),
        listen=EVERY_INTERFACE, reachable=None, on_reachability=on_reachability,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:

        def started(node: LiveNode) -> None:
            say("address", node.address)
            nursery.start_soon(report_circuits, node)
            nursery.start_soon(report_link, node, peer_info(data_address).peer_id)

        await run_live_node(config, started)


async def report_circuits(node: LiveNode) -> None:
    """Say once for each other relay stage that a connection to it runs through a relay."""
    said: set[int] = set()
    while True:
        for peer, record in list(node.book.peers.items()):
            other = record.stage not in (None, 0, node.config.stage, *said)
            if other and is_relayed(node.rpc.host, ID.from_base58(peer)):
                said.add(record.stage)
                say("relayed", record.stage)
        await trio.sleep(0.2)


async def report_link(node: LiveNode, data_node: ID) -> None:
    """Ask the data node every 0.2 s whether it is there; say ``down T`` at the first
    unanswered question and ``up T`` at the first answer after that (wall clock)."""
    down = False
    while True:
        try:
            await node.rpc.request(data_node, ALIVE_PROTOCOL, b"", RpcLimits(0, 0, 1.0))
        except PeerUnavailable:
            if not down:
                down = True
                say("down", time.time())
        else:
            if down:
                down = False
                say("up", time.time())
        await trio.sleep(0.2)


def main() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)6d %(name)s: %(message)s")
    for name in ("gwtf.node.runtime", "gwtf.node.p2p.reachability", "gwtf.node.p2p.relay"):
        logging.getLogger(name).setLevel(logging.INFO)
    if sys.argv[1] == "data":
        trio.run(data, int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4]))
    else:
        trio.run(relay, int(sys.argv[2]), sys.argv[3])


if __name__ == "__main__":
    main()
