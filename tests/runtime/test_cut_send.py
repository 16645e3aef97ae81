"""A hop send or a trace that fails on a stream cut under a live peer (its connection closed
mid-request, as when the circuit it ran on closes) does not make the peer dead to the flow
core: it answers a probe, so the flows through it stand (a trace is asked once more). A peer
that is gone misses the probe too and is declared dead; so is one that refuses the hop, though
it answers a probe. Real libp2p hosts on loopback, real data planes
(``dataplane/sender.py``, ``dataplane/stall_repair.py``)."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from typing import Any

import trio
from eth_utils.crypto import keccak
from libp2p.peer.id import ID

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.wire import CostAdvert, Hello
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane, HopRejected, Kept
from gwtf.node.runtime.dataplane.hop import FORWARD, HopHeader
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats, peer_answers
from gwtf.node.runtime.dataplane.stall_repair import StallRepair
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN, sign_try
from gwtf.node.runtime.flow.service import FlowService

NAMES = ("data", "a", "s0", "s1")
KEYS = {name: keccak(text=f"cut send test {name}") for name in NAMES}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}


def relay_a_with_two_replicas() -> FlowNode:
    """Relay ``a``'s flow core (stage 1 of 2) knowing both stage-2 replicas, ``s0`` the cheaper."""
    node = FlowNode(
        NodeSpec(PEER["a"], "relay", 1, 2, 20.0),
        FlowConfig(stages=2, activation_bytes=1e6),
        random.Random(0),
    )
    for name, cost in (("s0", 10.0), ("s1", 30.0)):
        node.handle(PEER[name], Hello("relay", 2, 2, 2, 2, 0, 20.0, 0, True), 0.0)
        node.handle(PEER[name], CostAdvert(cost, 2), 0.0)
    return node


def send_with_s0(
    cut: bool, refuse: bool = False, wrong_ack: bool = False
) -> tuple[str, FlowNode, HopStats]:
    """Relay ``a`` (stage 1 of 2) sends a forward to ``s0``, the cheaper of two stage-2
    replicas. ``cut``: ``s0`` closes its connection to ``a`` as the hop arrives, and stays up;
    ``refuse``: ``s0`` refuses the hop (its compute fails), and stays up; ``wrong_ack``: ``s0``
    answers the hop with what is no ack, and stays up; else ``s0``'s host is closed before the
    send. Returns who took the forward, ``a``'s flow
    core and its sender's counters."""
    node = relay_a_with_two_replicas()
    stats = HopStats()
    taken: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = {
                name: await stack.enter_async_context(running_host(identity_from_key(KEYS[name])))
                for name in ("a", "s0", "s1")
            }
            nursery = await stack.enter_async_context(trio.open_nursery())
            for name in ("s0", "s1"):
                await hosts["a"].connect(peer_info(full_address(hosts[name])))
                rpc = RequestResponse(hosts[name])
                plane = DataPlane(rpc, PEER[name], 1, 2, 5.0, 1 << 20)

                async def admit(header: HopHeader, frame: bytes, me: str = name, rpc=rpc) -> None:
                    if me == "s0" and refuse:
                        raise HopRejected("the compute failed on this input")
                    if me == "s0":  # the connection the hop came on closes under it
                        await rpc.drop_peer(ID.from_base58(PEER["a"]))
                        await trio.sleep_forever()
                    taken.append(me)

                async def compute(header: HopHeader, frame: bytes) -> Kept | None:
                    return None

                async def alive(peer: str, request: bytes) -> bytes:
                    assert isinstance(control.decode_request(request), control.Alive)
                    return control.encode_reply(True)

                plane.admit, plane.compute = admit, compute  # type: ignore[method-assign]
                if wrong_ack and name == "s0":

                    async def no_ack(peer: str, request: bytes) -> bytes:
                        return b"no ack"

                    plane._handle = no_ack  # type: ignore[method-assign]
                plane.serve(nursery)
                limits = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 5.0)
                rpc.serve(control.PROTOCOL_ID, alive, limits)
            if not (cut or refuse or wrong_ack):
                await hosts["s0"].close()
            plane = DataPlane(RequestResponse(hosts["a"]), PEER["a"], 1, 2, 5.0, 1 << 20)
            sender = HopSender(plane, FlowService(None, node, tick_s=1.0), stats, None)  # type: ignore[arg-type]
            assert sender.next_hop(2, None) == PEER["s0"]
            header = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, PEER["data"],
                               (PEER["data"], PEER["a"]))  # fmt: skip
            header = sign_try(header, KEYS["data"], NO_CHAIN_TRY_DOMAIN)
            with trio.fail_after(30):
                delivered = await sender.send_forward(header, b"activation", PEER["s0"], b"in")
            taken.insert(0, delivered)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert taken[1:] == ["s1"], taken
    return taken[0], node, stats


def test_a_send_cut_under_a_live_peer_leaves_it_alive() -> None:
    delivered, node, stats = send_with_s0(cut=True)
    assert delivered == PEER["s1"]  # the hop went on to the other replica
    assert node.peers[PEER["s0"]].alive and stats.cut_sends == 1


def test_a_peer_that_refuses_a_hop_is_dead_though_it_answers_a_probe() -> None:
    delivered, node, stats = send_with_s0(cut=False, refuse=True)
    assert delivered == PEER["s1"]
    assert not node.peers[PEER["s0"]].alive and stats.cut_sends == 0


def test_a_peer_that_answers_a_hop_with_no_ack_is_dead_though_it_answers_a_probe() -> None:
    delivered, node, stats = send_with_s0(cut=False, wrong_ack=True)
    assert delivered == PEER["s1"]
    assert not node.peers[PEER["s0"]].alive and stats.cut_sends == 0


def test_a_send_to_a_peer_that_is_gone_declares_it_dead() -> None:
    delivered, node, stats = send_with_s0(cut=False)
    assert delivered == PEER["s1"]
    assert not node.peers[PEER["s0"]].alive and stats.cut_sends == 0


def trace_s0(cut: bool) -> tuple[tuple[str, str], FlowNode]:
    """The data node traces a microbatch at relay ``s0``. ``cut``: ``s0`` closes its
    connection to the data node as the first trace arrives, stays up and answers the next;
    else its host is closed first. Returns the trace's answer and the data node's flow core."""
    node = FlowNode(
        NodeSpec(PEER["data"], "data", 0, 2, 20.0),
        FlowConfig(stages=2, activation_bytes=1e6),
        random.Random(0),
    )
    node.handle(PEER["s0"], Hello("relay", 1, 2, 2, 2, 0, 20.0, 0, True), 0.0)
    traced: dict[str, tuple[str, str]] = {}

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = {
                name: await stack.enter_async_context(running_host(identity_from_key(KEYS[name])))
                for name in ("data", "s0")
            }
            await hosts["data"].connect(peer_info(full_address(hosts["s0"])))
            rpc = RequestResponse(hosts["s0"])

            traces: list[str] = []

            async def answer(peer: str, request: bytes) -> bytes:
                if isinstance(control.decode_request(request), control.Trace):
                    traces.append(peer)
                    if len(traces) == 1:
                        await rpc.drop_peer(ID.from_base58(PEER["data"]))
                        await trio.sleep_forever()
                    return control.encode_trace("queued")
                return control.encode_reply(True)

            rpc.serve(control.PROTOCOL_ID, answer, RpcLimits(1024, 1024, 5.0))
            if not cut:
                await hosts["s0"].close()
            plane = DataPlane(RequestResponse(hosts["data"]), PEER["data"], 1, 2, 5.0, 1 << 20)
            flow = FlowService(None, node, tick_s=1.0)  # type: ignore[arg-type]
            stats = HopStats()
            unused: Any = None  # only the trace is asked
            repair = StallRepair(
                plane, flow, HopSender(plane, flow, stats, None), stats, unused, unused, unused,
                lambda: 5.0, unused,
            )  # fmt: skip
            with trio.fail_after(30):
                traced["s0"] = await repair._trace(PEER["s0"], control.Trace(0, 7))

    trio.run(main)
    return traced["s0"], node


def test_a_trace_cut_under_a_live_relay_leaves_it_alive() -> None:
    state, node = trace_s0(cut=True)
    assert state == ("queued", "")  # asked once more: not repaired around
    assert node.peers[PEER["s0"]].alive


def test_a_trace_of_a_relay_that_is_gone_declares_it_dead() -> None:
    state, node = trace_s0(cut=False)
    assert state == ("dead", "") and not node.peers[PEER["s0"]].alive


def test_sends_cut_at_once_make_one_probe_and_go_on_without_waiting_for_it() -> None:
    """Four forwards from ``a`` to ``s0`` (the cheaper stage-2 replica) are cut at once (``s0``
    closes the connection they share), and ``s0`` takes 1.5 s to answer the probe. One probe
    is made, the others await its answer; the re-sends reach ``s1`` before that answer; and
    while ``s0`` is probed, a new forward's next hop is ``s1``. ``s0`` then counts alive."""
    node = relay_a_with_two_replicas()
    stats = HopStats()
    taken_at: list[float] = []  # when s1 took each forward
    probes: list[float] = []  # when s0 answered each probe
    chosen_while_probed: list[str | None] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = {
                name: await stack.enter_async_context(running_host(identity_from_key(KEYS[name])))
                for name in ("a", "s0", "s1")
            }
            nursery = await stack.enter_async_context(trio.open_nursery())
            for name in ("s0", "s1"):
                await hosts["a"].connect(peer_info(full_address(hosts[name])))
                rpc = RequestResponse(hosts[name])
                plane = DataPlane(rpc, PEER[name], 1, 2, 5.0, 1 << 20)

                async def admit(header: HopHeader, frame: bytes, me: str = name, rpc=rpc) -> None:
                    if me == "s0":
                        await rpc.drop_peer(ID.from_base58(PEER["a"]))
                        await trio.sleep_forever()
                    taken_at.append(trio.current_time())

                async def compute(header: HopHeader, frame: bytes) -> Kept | None:
                    return None

                async def alive(peer: str, request: bytes, me: str = name) -> bytes:
                    if me == "s0":
                        chosen_while_probed.append(sender.next_hop(2, None))
                        await trio.sleep(1.5)
                        probes.append(trio.current_time())
                    return control.encode_reply(True)

                plane.admit, plane.compute = admit, compute  # type: ignore[method-assign]
                plane.serve(nursery)
                rpc.serve(control.PROTOCOL_ID, alive, RpcLimits(1024, 1024, 5.0))
            plane = DataPlane(RequestResponse(hosts["a"]), PEER["a"], 1, 2, 5.0, 1 << 20)
            sender = HopSender(plane, FlowService(None, node, tick_s=1.0), stats, None)  # type: ignore[arg-type]

            async def send(microbatch: int) -> None:
                header = HopHeader(1, 0, microbatch, 0, FORWARD, 2, 0, 0, PEER["data"],
                                   (PEER["data"], PEER["a"]))  # fmt: skip
                header = sign_try(header, KEYS["data"], NO_CHAIN_TRY_DOMAIN)
                assert await sender.send_forward(header, b"x", PEER["s0"], b"in") == PEER["s1"]

            with trio.fail_after(30):
                async with trio.open_nursery() as sends:
                    for microbatch in range(4):
                        sends.start_soon(send, microbatch)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(probes) == 1, f"{len(probes)} probes of s0"
    assert chosen_while_probed == [PEER["s1"]]
    assert len(taken_at) == 4 and max(taken_at) < probes[0]
    assert node.peers[PEER["s0"]].alive and stats.cut_sends == 4


def probe_as_the_connection_closes(how: str) -> bool:
    """``a`` has a control stream open to ``s0``; the connection under it closes (``how``:
    ``local``, as when the circuit it ran on closes at ``a``'s end; ``remote``: ``s0`` drops
    it) and ``a`` probes ``s0`` at once, before the stream's reader can see the close.
    Returns whether the probe says ``s0`` answers (it stays up throughout)."""
    node = FlowNode(
        NodeSpec(PEER["a"], "relay", 1, 2, 20.0),
        FlowConfig(stages=2, activation_bytes=1e6),
        random.Random(0),
    )
    answered: list[bool] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(running_host(identity_from_key(KEYS["a"])))
            s0 = await stack.enter_async_context(running_host(identity_from_key(KEYS["s0"])))
            await a.connect(peer_info(full_address(s0)))
            served = RequestResponse(s0)

            async def alive(peer: str, request: bytes) -> bytes:
                return control.encode_reply(True)

            served.serve(control.PROTOCOL_ID, alive, RpcLimits(1024, 1024, 5.0))
            plane = DataPlane(RequestResponse(a), PEER["a"], 1, 2, 5.0, 1 << 20)
            flow = FlowService(None, node, tick_s=1.0)  # type: ignore[arg-type]
            with trio.fail_after(30):
                assert await peer_answers(plane, flow, PEER["s0"])  # the stream is open now
                async with trio.open_nursery() as nursery:
                    if how == "local":
                        nursery.start_soon(a.get_network().close_peer, ID.from_base58(PEER["s0"]))
                    else:
                        nursery.start_soon(served.drop_peer, ID.from_base58(PEER["a"]))
                    answered.append(await peer_answers(plane, flow, PEER["s0"]))

    trio.run(main)
    return answered[0]


def test_a_probe_as_the_connection_closes_asks_again_on_a_new_stream() -> None:
    assert probe_as_the_connection_closes("local")
    assert probe_as_the_connection_closes("remote")
