"""Dialing each address of a peer in turn, and keeping a neighbour connected across a restart
(real libp2p hosts on loopback; the SYN-dropping router is in tests/internet)."""

from __future__ import annotations

import socket

import multiaddr
import pytest
import trio
from libp2p.crypto.keys import KeyPair
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID

from gwtf.node.p2p.dialing import Dialer, DialFailed, dialable
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.keepalive import ALIVE_PROTOCOL, Backoff, NeighbourKeeper, _Neighbour
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from tests.p2p.test_host_stop import ECHO, LIMITS, echo, run_bounded


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_only_tcp_addresses_are_dialled_each_once_in_order() -> None:
    a = multiaddr.Multiaddr("/ip4/198.18.0.2/tcp/4001")
    peer = _id(new_identity())
    b = multiaddr.Multiaddr(f"/ip4/198.19.0.2/tcp/4001/p2p/{peer}")
    circuit = multiaddr.Multiaddr(f"{a}/p2p/{peer}/p2p-circuit")
    assert [str(x) for x in dialable([b, circuit, a, a])] == [str(b), str(a)]


def test_backoff_is_immediate_then_doubles_up_to_its_caps() -> None:
    backoff = Backoff(first_s=0.25, max_s=2.0, max_long_s=30.0, long_gone_s=60.0)
    assert [backoff.delay(n, 1.0) for n in range(6)] == [0.0, 0.25, 0.5, 1.0, 2.0, 2.0]
    assert backoff.delay(12, 61.0) == 30.0


def test_a_peer_is_reached_at_its_second_address_when_the_first_refuses() -> None:
    async def main() -> None:
        async with running_host(new_identity()) as server, running_host(new_identity()) as me:
            RequestResponse(server).serve(ECHO, echo, LIMITS)
            info = peer_info(full_address(server))
            dead = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{free_port()}")
            me.get_peerstore().add_addrs(info.peer_id, [dead, *info.addrs], 60)
            rpc = RequestResponse(me)
            assert await rpc.request(info.peer_id, ECHO, b"hi", LIMITS) == b"hi"
            assert rpc.dialer.dials == 1
            nobody = new_identity()
            with pytest.raises(DialFailed, match="answered at no address"):
                await Dialer(me).connect(_id(nobody), [dead])

    run_bounded(main)


def test_a_neighbour_back_after_a_restart_is_reconnected_at_once() -> None:
    """While it is down, py-libp2p's own dials to it fail and its swarm would refuse to dial
    it for 60 s; the keeper lifts that and dials it again within its backoff."""
    identity, port = new_identity(), free_port()
    listen = (f"/ip4/127.0.0.1/tcp/{port}",)

    async def serve(scope: trio.CancelScope, up: trio.Event) -> None:
        with scope:
            async with running_host(identity, listen) as host:
                RequestResponse(host).serve(ECHO, echo, LIMITS)
                up.set()
                await trio.sleep_forever()

    async def main() -> None:
        peer = _id(identity)
        async with running_host(new_identity()) as me, trio.open_nursery() as nursery:
            rpc = RequestResponse(me)
            me.get_peerstore().add_addrs(peer, [multiaddr.Multiaddr(f"{listen[0]}/p2p/{peer}")], 60)
            keeper = NeighbourKeeper(rpc, lambda: [str(peer)], period_s=0.1)
            keeper.serve()
            first, up = trio.CancelScope(), trio.Event()
            nursery.start_soon(serve, first, up)
            await up.wait()
            nursery.start_soon(keeper.run)
            while not rpc.dialer.connected(peer):
                await trio.sleep(0.05)
            first.cancel()
            while rpc.dialer.connected(peer):
                await trio.sleep(0.05)
            with pytest.raises(SwarmException):
                await me.get_network().dial_peer(peer)
            await trio.sleep(1.0)  # the keeper's dials fail meanwhile; its backoff grows
            back, up = trio.CancelScope(), trio.Event()
            nursery.start_soon(serve, back, up)
            await up.wait()
            returned = trio.current_time()
            while keeper.reconnects == 0:
                await trio.sleep(0.05)
            assert trio.current_time() - returned < 2.5
            assert await rpc.request(peer, ECHO, b"back", LIMITS) == b"back"
            # py-libp2p's own dials (its DHT, pubsub) are not refused for the rest of a minute.
            assert await me.get_network().dial_peer(peer)
            nursery.cancel_scope.cancel()

    run_bounded(main)


def _id(identity: KeyPair) -> ID:
    return ID.from_pubkey(identity.public_key)


def test_a_neighbour_silent_past_the_deadline_is_cut_and_dialled_anew() -> None:
    """A connection that carries nothing any more (a cut link TCP has not noticed) is closed
    and a fresh one dialled; a refusal is an answer, not silence."""

    async def main() -> None:
        async with running_host(new_identity()) as server, running_host(new_identity()) as me:

            async def silent(_peer: str, _request: bytes) -> bytes:
                await trio.sleep_forever()
                return b""

            rpc = RequestResponse(me)
            peer = server.get_id()
            me.get_peerstore().add_addrs(peer, server.get_addrs(), 60)
            keeper = NeighbourKeeper(rpc, lambda: [str(peer)], period_s=0.1, dead_after_s=1.0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keeper.run)
                # The neighbour does not speak the keep-alive protocol: it refuses, it is alive.
                await trio.sleep(1.5)
                assert keeper.reconnects == 0 and rpc.dialer.dials == 1
                RequestResponse(server).serve(ALIVE_PROTOCOL, silent, RpcLimits(0, 0, 5.0))
                with trio.fail_after(5):
                    while keeper.reconnects == 0:
                        await trio.sleep(0.05)
                assert rpc.dialer.dials == 2
                nursery.cancel_scope.cancel()

    run_bounded(main)


def test_a_neighbour_the_keeper_waits_for_is_probed_and_not_dialled_within_the_grace() -> None:
    """A reachable node leaves the dialing to a neighbour nobody can dial: it keeps probing
    the connection that neighbour opened, and dials nothing once it is gone (within
    ``wait_grace_s``)."""

    async def main() -> None:
        async with running_host(new_identity()) as home, running_host(new_identity()) as me:
            rpc = RequestResponse(me)
            peer = home.get_id()
            me.get_peerstore().add_addrs(peer, home.get_addrs(), 60)
            keeper = NeighbourKeeper(
                rpc,
                lambda: [str(peer)],
                period_s=0.1,
                waits_for=lambda p: p == str(peer),
                wait_grace_s=60.0,
            )
            keeper.serve()
            NeighbourKeeper(RequestResponse(home), lambda: ()).serve()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keeper.run)
                await trio.sleep(0.5)
                assert rpc.dialer.dials == 0 and not rpc.dialer.connected(peer)
                await home.connect(peer_info(full_address(me)))  # the neighbour dials in
                await trio.sleep(0.5)
                assert rpc.dialer.connected(peer)
                await rpc.drop_peer(peer)
                await trio.sleep(0.5)
                assert rpc.dialer.dials == 0 and not rpc.dialer.connected(peer)
                nursery.cancel_scope.cancel()

    run_bounded(main)


def test_a_probe_whose_connection_closed_meanwhile_dials_nothing() -> None:
    """The keeper probes a neighbour it found connected; the connection closes before the
    probe's stream is open (a drop, the neighbour leaving): the probe fails and dials nothing,
    so a neighbour this node waits for is still left to dial in (the tick decides on dialing,
    not a probe racing the close)."""

    async def main() -> None:
        async with running_host(new_identity()) as home, running_host(new_identity()) as me:
            rpc = RequestResponse(me)
            peer = home.get_id()
            me.get_peerstore().add_addrs(peer, home.get_addrs(), 60)
            NeighbourKeeper(RequestResponse(home), lambda: ()).serve()
            keeper = NeighbourKeeper(rpc, lambda: [str(peer)], waits_for=lambda _p: True)
            await home.connect(peer_info(full_address(me)))
            with trio.fail_after(5):
                while not rpc.dialer.connected(peer):
                    await trio.sleep(0.01)
            await rpc.drop_peer(peer)  # gone between the tick's look and the probe
            state = _Neighbour(last_alive=trio.current_time())
            await keeper._probe(peer, state)
            assert rpc.dialer.dials == 0 and not rpc.dialer.connected(peer)
            with pytest.raises(PeerUnavailable, match="not to be dialled"):
                await rpc.request(peer, ALIVE_PROTOCOL, b"", RpcLimits(0, 0, 1.0), dial=False)

    run_bounded(main)


def test_a_neighbour_that_never_dials_in_is_dialled_once_the_grace_is_over() -> None:
    """Leaving the dialing to a neighbour lasts ``wait_grace_s``: one that never dials (it
    cannot reach the relay, or will not, or its card is stale) is dialled anyway, so the
    pair's connection never depends on the other side alone."""

    async def main() -> None:
        async with running_host(new_identity()) as other, running_host(new_identity()) as me:
            rpc = RequestResponse(me)
            peer = other.get_id()
            me.get_peerstore().add_addrs(peer, other.get_addrs(), 60)
            keeper = NeighbourKeeper(
                rpc,
                lambda: [str(peer)],
                period_s=0.1,
                waits_for=lambda p: p == str(peer),
                wait_grace_s=1.0,
            )
            NeighbourKeeper(RequestResponse(other), lambda: ()).serve()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keeper.run)
                await trio.sleep(0.6)
                assert rpc.dialer.dials == 0  # still waiting for it
                with trio.fail_after(5):
                    while not rpc.dialer.connected(peer):
                        await trio.sleep(0.05)
                assert rpc.dialer.dials == 1
                nursery.cancel_scope.cancel()

    run_bounded(main)
