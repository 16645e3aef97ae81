"""A relay's forwards off any flow spread over the next stage's replicas by what it has in
flight to each (``HopSender.detours``, ranked by ``decisions.next_hop``): real libp2p hosts on
loopback, real data planes. The receivers hold every hop until all of them arrived, so every
detour is still in flight when the next one is decided."""

from __future__ import annotations

import random
from collections import Counter
from contextlib import AsyncExitStack

import trio
from eth_utils.crypto import keccak

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.wire import CostAdvert, Hello
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.dataplane.exchange import DataPlane, Kept
from gwtf.node.runtime.dataplane.hop import FORWARD, HopHeader
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN, sign_try
from gwtf.node.runtime.flow.service import FlowService

NAMES = ("data", "a", "s0", "s1", "s2")
KEYS = {name: keccak(text=f"detour spread test {name}") for name in NAMES}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}
RECEIVERS = ("s0", "s1", "s2")


def spread_forwards(forwards: int, dead: frozenset[str] = frozenset()) -> tuple[Counter[str], int]:
    """Relay ``a`` (stage 1 of 2) sends ``forwards`` forwards off any flow, one task each as
    its relay role does, to three equal stage-2 replicas (no room, equal costs), the ``dead``
    ones' hosts closed. Returns the forwards each live replica computed and the detours still
    counted in flight at the end."""
    node = FlowNode(
        NodeSpec(PEER["a"], "relay", 1, 2, 20.0),
        FlowConfig(stages=2, activation_bytes=1e6),
        random.Random(0),
    )
    for name in RECEIVERS:
        node.handle(PEER[name], Hello("relay", 2, 2, 2, 0, 0, 20.0, 0, True), 0.0)
        node.handle(PEER[name], CostAdvert(30.0, 0), 0.0)
    computed: Counter[str] = Counter()
    all_in = trio.Event()
    left: dict[str, int] = {}

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = {
                name: await stack.enter_async_context(running_host(identity_from_key(KEYS[name])))
                for name in ("a", *RECEIVERS)
            }
            nursery = await stack.enter_async_context(trio.open_nursery())
            for name in RECEIVERS:
                await hosts["a"].connect(peer_info(full_address(hosts[name])))
                if name in dead:
                    await hosts[name].close()
                    continue
                plane = DataPlane(RequestResponse(hosts[name]), PEER[name], 1, 2, 10.0, 1 << 20)

                async def hold(header: HopHeader, frame: bytes, me: str = name) -> None:
                    computed[me] += 1  # held in the request's task, before the compute queue
                    if sum(computed.values()) == forwards:
                        all_in.set()
                    await all_in.wait()

                async def compute(header: HopHeader, frame: bytes) -> Kept | None:
                    return None

                plane.admit, plane.compute = hold, compute
                plane.serve(nursery)
            plane = DataPlane(RequestResponse(hosts["a"]), PEER["a"], 1, 2, 10.0, 1 << 20)
            sender = HopSender(plane, FlowService(None, node, tick_s=1.0), HopStats(), None)  # type: ignore[arg-type]

            async def relay_forward(microbatch: int) -> None:
                # As ``RelayRole._send_forward``: decide, then send, no checkpoint between.
                to = sender.next_hop(2, None)
                assert to is not None
                header = HopHeader(1, 0, microbatch, 0, FORWARD, 2, 0, 0, PEER["data"],
                                   (PEER["data"], PEER["a"]))  # fmt: skip
                header = sign_try(header, KEYS["data"], NO_CHAIN_TRY_DOMAIN)
                await sender.send_forward(header, b"activation", to, b"input")

            with trio.fail_after(30):
                async with trio.open_nursery() as senders:
                    for microbatch in range(forwards):
                        senders.start_soon(relay_forward, microbatch)
            left["in flight"] = len(sender.detours)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return computed, left["in flight"]


def test_forwards_off_any_flow_spread_evenly_over_equal_replicas() -> None:
    computed, in_flight = spread_forwards(9)
    assert computed == Counter({"s0": 3, "s1": 3, "s2": 3})
    assert in_flight == 0  # every acknowledged detour ended


def test_re_sends_around_a_dead_replica_spread_over_the_live_ones() -> None:
    computed, in_flight = spread_forwards(8, dead=frozenset({"s2"}))
    assert computed == Counter({"s0": 4, "s1": 4})
    assert in_flight == 0  # the failed sends ended too
