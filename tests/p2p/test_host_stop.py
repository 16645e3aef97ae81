"""A node that stops (Ctrl-C, or a crash in-process) and comes back under the same identity on
another port, between real hosts on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.network.exceptions import SwarmException
from libp2p.network.swarm import Swarm

from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.runtime.discovery.address_book import AddressBook, PeerRecord, own_record

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=64, max_response_bytes=64, timeout_s=5.0)


async def echo(_peer: str, request: bytes) -> bytes:
    return request


async def refuses_tcp(address: str) -> bool:
    port = int(address.split("/tcp/")[1].split("/")[0])
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


_IDENTITIES: dict[tuple[Path, str], KeyPair] = {}


def identity_of(tmp_path: Path, name: str) -> KeyPair:
    """The identity of host ``name`` in this test: the same each time it (re)starts."""
    return _IDENTITIES.setdefault((tmp_path, name), new_identity())


class Server:
    """A host serving ``ECHO`` under ``identity`` (the same on a restart), stopped by
    cancellation."""

    def __init__(self, identity: KeyPair) -> None:
        self.identity = identity
        self.scope = trio.CancelScope()
        self.address = ""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            async with running_host(self.identity) as host:
                RequestResponse(host).serve(ECHO, echo, LIMITS)
                self.address = full_address(host)
                task_status.started()
                await trio.sleep_forever()


def run_bounded(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(30):
            await main()

    trio.run(bounded)


@asynccontextmanager
async def client(tmp_path: Path) -> AsyncIterator[tuple[IHost, RequestResponse]]:
    async with running_host(new_identity()) as host:
        yield host, RequestResponse(host)


def test_a_stopped_host_stops_listening_and_closes_its_connections(tmp_path: Path) -> None:
    async def main() -> None:
        async with client(tmp_path) as (host, rpc), trio.open_nursery() as nursery:
            server = Server(identity_of(tmp_path, "server"))
            await nursery.start(server.run)
            info = peer_info(server.address)
            await host.connect(info)
            assert await rpc.request(info.peer_id, ECHO, b"hi", LIMITS) == b"hi"
            server.scope.cancel()
            await trio.sleep(0.5)
            # py-libp2p alone leaves its listener accepting connections nobody serves.
            assert await refuses_tcp(server.address)
            assert not host.get_network().connections.get(info.peer_id)

    run_bounded(main)


def test_a_peer_back_on_a_new_port_is_reached_there_once_it_says_so(tmp_path: Path) -> None:
    """The client knew the server's old address (and failed to dial it meanwhile); the server's
    own word of its new one, as its signed card or its introduction brings it, is dialled, while
    hearsay about a known peer moves nothing."""

    async def main() -> None:
        async with client(tmp_path) as (_host, rpc), trio.open_nursery() as nursery:
            book = AddressBook(rpc, own_record(rpc, "oregon"), on_new_peer=lambda _record: None)
            server = Server(identity_of(tmp_path, "server"))
            await nursery.start(server.run)
            old = server.address
            peer = peer_info(old).peer_id
            book.learn(PeerRecord(str(peer), old, "oregon", stage=1))
            assert await rpc.request(peer, ECHO, b"one", LIMITS) == b"one"
            server.scope.cancel()
            await trio.sleep(0.5)
            comeback = Server(identity_of(tmp_path, "server"))
            await nursery.start(comeback.run)
            assert comeback.address != old
            book.learn(PeerRecord(str(peer), old.replace("127.0.0.1", "127.0.0.2"), "oregon"))
            assert book.peers[str(peer)].address == old, "hearsay does not move a card's address"
            book.learn(PeerRecord(str(peer), comeback.address, "oregon"), firsthand=True)
            assert book.peers[str(peer)] == PeerRecord(str(peer), comeback.address, "oregon", 1)
            assert await rpc.request(peer, ECHO, b"two", LIMITS) == b"two"
            comeback.scope.cancel()

    run_bounded(main)


def test_dropping_a_peer_closes_what_was_open_and_the_next_request_dials_anew(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with client(tmp_path) as (host, rpc), trio.open_nursery() as nursery:
            server = Server(identity_of(tmp_path, "server"))
            await nursery.start(server.run)
            info = peer_info(server.address)
            host.get_peerstore().add_addrs(info.peer_id, info.addrs, 60)
            assert await rpc.request(info.peer_id, ECHO, b"one", LIMITS) == b"one"
            first = host.get_network().connections[info.peer_id]
            await rpc.drop_peer(info.peer_id)
            assert not host.get_network().connections.get(info.peer_id)
            assert await rpc.request(info.peer_id, ECHO, b"two", LIMITS) == b"two"
            assert host.get_network().connections[info.peer_id] != first
            assert rpc.streams_opened == 2
            server.scope.cancel()

    run_bounded(main)


def test_a_peer_whose_dial_failed_is_dialled_again_at_once(tmp_path: Path) -> None:
    """py-libp2p refuses for a minute to dial a peer whose dial failed (its old process's
    address); the node's dialer lifts that wait, so the peer is reached at once where it is
    now, and after it is dropped as restarted."""

    async def main() -> None:
        async with client(tmp_path) as (host, rpc), trio.open_nursery() as nursery:
            server = Server(identity_of(tmp_path, "server"))
            await nursery.start(server.run)
            info = peer_info(server.address)
            gone = Server(
                identity_of(tmp_path, "gone")
            )  # a free port: nothing listens there after it
            await nursery.start(gone.run)
            dead_address = peer_info(gone.address).addrs
            gone.scope.cancel()
            await trio.sleep(0.2)
            host.get_peerstore().add_addrs(info.peer_id, dead_address, 60)
            with pytest.raises(PeerUnavailable, match="answered at no address"):
                await rpc.request(info.peer_id, ECHO, b"one", LIMITS)
            network = host.get_network()
            assert isinstance(network, Swarm)
            with pytest.raises(SwarmException):  # py-libp2p's own dial (its DHT, pubsub)
                await network.dial_peer(info.peer_id)
            assert network._negative_peer_cache.is_blocked(str(info.peer_id))
            host.get_peerstore().clear_addrs(info.peer_id)
            host.get_peerstore().add_addrs(info.peer_id, info.addrs, 60)
            assert await rpc.request(info.peer_id, ECHO, b"two", LIMITS) == b"two"
            await rpc.drop_peer(info.peer_id)
            assert await rpc.request(info.peer_id, ECHO, b"three", LIMITS) == b"three"
            server.scope.cancel()

    run_bounded(main)
