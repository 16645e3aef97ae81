"""Hole punching's checks on a peer's word (``gwtf.node.p2p.holepunch``), between real libp2p
hosts on 127.0.0.1 (a punch itself needs routers: ``tests/internet/test_holepunch_bed.py``)."""

from __future__ import annotations

import contextlib
from contextlib import AsyncExitStack

import multiaddr
import pytest
import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch
from libp2p.relay.circuit_v2.utils import write_delimited_msg

from gwtf.node.p2p.addresses import MAX_ADDRESSES
from gwtf.node.p2p.holepunch import (
    PROTOCOL_ID,
    HolePuncher,
    direct_connections,
    listen_ports,
    peer_addresses,
    punchable,
)
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import new_identity, peer_id_of
from gwtf.node.p2p.relay import is_relayed
from tests.p2p.test_relay import ECHO, LIMITS, Node, learn, node


async def relay_home_and_peer(stack: AsyncExitStack) -> tuple[Node, Node, Node]:
    """A relay, a home holding a slot at it, and a peer that trusts the relay and knows the home
    by its circuit address."""
    relay = await stack.enter_async_context(node(stack, serve=True))
    home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
    other = await stack.enter_async_context(node(stack, trusts=[relay]))
    learn(other, home.host)
    return relay, home, other


SLOW = "/gwtf/test-slow/1.0.0"


def every_listener(host: IHost) -> list[tuple[str, int]]:
    """Each (IP, port) ``host`` listens on, loopback included."""
    return [
        (a.value_for_protocol("ip4"), int(a.value_for_protocol("tcp")))
        for listener in host.get_network().listeners.values()
        for a in listener.get_addrs()
    ]


def own_addresses(host: IHost) -> list[bytes]:
    return [
        multiaddr.Multiaddr(f"/ip4/{ip}/tcp/{port}").to_bytes() for ip, port in every_listener(host)
    ]


@pytest.fixture
def loopback_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosts here listen on 127.0.0.1 only: let a punch dial from there (a node never
    does: ``test_a_node_on_loopback_only_does_not_punch``)."""
    import gwtf.node.p2p.holepunch as holepunch

    monkeypatch.setattr(holepunch, "listen_ports", every_listener)


def test_only_tcp_addresses_of_public_unicast_hosts_are_punchable() -> None:
    for good in ("/ip4/203.0.113.7/tcp/4001", "/ip4/198.18.3.2/tcp/4001", "/ip6/2001:db8::1/tcp/1"):
        assert punchable(multiaddr.Multiaddr(good)), good
    for bad in (
        "/ip4/127.0.0.1/tcp/4001", "/ip4/10.1.2.3/tcp/4001", "/ip4/192.168.1.2/tcp/4001",
        "/ip4/172.20.0.1/tcp/4001", "/ip4/100.64.0.1/tcp/4001", "/ip4/169.254.1.1/tcp/4001",
        "/ip4/0.0.0.0/tcp/4001", "/ip4/224.0.0.1/tcp/4001", "/ip4/240.0.0.1/tcp/4001",
        "/ip6/::1/tcp/4001", "/ip6/fd00::1/tcp/4001", "/ip6/::ffff:10.0.0.1/tcp/4001",
        "/ip6/fec0::1/tcp/4001", "/ip4/0.1.2.3/tcp/4001", "/ip4/192.0.0.2/tcp/4001",
        "/ip4/203.0.113.7/udp/4001", "/ip4/203.0.113.7/tcp/0",
        "/ip4/203.0.113.7/tcp/4001/p2p/QmcgpsyWgH8Y8ajJz1Cu72KnS5uo2Aa2LpzU7kinSupNKC",
        "/dns4/example.com/tcp/4001",
    ):  # fmt: skip
        assert not punchable(multiaddr.Multiaddr(bad)), bad


def test_a_peers_addresses_are_cut_to_the_punchable_few() -> None:
    many = [multiaddr.Multiaddr(f"/ip4/203.0.113.{i}/tcp/4001").to_bytes() for i in range(20)]
    raw = [b"\xff\xff not an address", multiaddr.Multiaddr("/ip4/10.0.0.1/tcp/1").to_bytes()]
    kept = peer_addresses(raw + many + many)
    assert [str(a) for a in kept] == [f"/ip4/203.0.113.{i}/tcp/4001" for i in range(MAX_ADDRESSES)]


@pytest.mark.usefixtures("loopback_listener")
def test_a_peer_naming_its_loopback_address_is_not_dialled_and_the_circuit_stays() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            _relay, home, other = await relay_home_and_peer(stack)
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(home.host, timeout_s=2.0, check_s=3600.0)
                puncher.serve(nursery)
                with trio.fail_after(10):
                    await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                    assert is_relayed(other.host, home.host.get_id())
                    # ``other`` names the loopback address it listens on: dialling it would work.
                    own = own_addresses(other.host)
                    stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                    await write_delimited_msg(
                        stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=own)
                    )
                    await stream.read(4096)  # the home's CONNECT
                    await write_delimited_msg(stream, HolePunch(type=HolePunch.SYNC))
                    while puncher.failures == 0:
                        await trio.sleep(0.05)
                assert not direct_connections(home.host, other.host.get_id())
                assert is_relayed(home.host, other.host.get_id())
                # A second try at once meets the backoff.
                await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                await trio.sleep(0.2)
                assert puncher.refused == 1 and puncher.attempts == 1
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_punch_is_refused_over_a_direct_connection() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            home = await stack.enter_async_context(node(stack))
            other = await stack.enter_async_context(node(stack))
            learn(other, home.host)
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(home.host, check_s=3600.0)
                puncher.serve(nursery)
                with trio.fail_after(10):
                    stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                    with contextlib.suppress(Exception):  # the home may reset it first
                        await write_delimited_msg(stream, HolePunch(type=HolePunch.CONNECT))
                    while puncher.refused == 0:
                        await trio.sleep(0.05)
                assert puncher.attempts == 0
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_retired_streams_finish_their_requests_and_new_ones_open_a_new_stream() -> None:
    async def slow(_peer: str, request: bytes) -> bytes:
        await trio.sleep(0.5)
        return request

    async def main() -> None:
        async with AsyncExitStack() as stack:
            home = await stack.enter_async_context(node(stack))
            other = await stack.enter_async_context(node(stack))
            home.rpc.serve(SLOW, slow, LIMITS)
            learn(other, home.host)
            peer = home.host.get_id()
            replies: list[bytes] = []

            async def in_flight() -> None:
                replies.append(await other.rpc.request(peer, SLOW, b"slow", LIMITS))

            with trio.fail_after(10):
                await other.rpc.request(peer, ECHO, b"first", LIMITS)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(in_flight)
                    await trio.sleep(0.2)  # the slow request is on its own stream
                    opened = other.rpc.streams_opened
                    await other.rpc.retire(peer)
                    # The next echo opens a new stream; the slow request's stream stays.
                    assert await other.rpc.request(peer, ECHO, b"next", LIMITS) == b"next"
                    assert other.rpc.streams_opened == opened + 1
                    assert not replies
                assert replies == [b"slow"]

    trio.run(main)


@pytest.mark.usefixtures("loopback_listener")
def test_concurrent_punches_from_one_peer_waiting_on_admission_run_one_session() -> None:
    """Admission may wait on the chain: the peer's other streams, opened meanwhile, must meet
    the session it already has (one per peer, at most ``MAX_SESSIONS`` in all), else each
    stream is one more round of dials at addresses the peer names."""

    async def slow_admit(_peer: str) -> bool:
        await trio.sleep(0.3)  # a chain lookup
        return True

    async def main() -> None:
        async with AsyncExitStack() as stack:
            _relay, home, other = await relay_home_and_peer(stack)
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(home.host, admit=slow_admit, timeout_s=2.0, check_s=3600.0)
                puncher.serve(nursery)
                with trio.fail_after(20):
                    await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                    assert is_relayed(other.host, home.host.get_id())

                    async def punch() -> None:
                        with contextlib.suppress(Exception):  # refused ones are reset
                            stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                            await write_delimited_msg(stream, HolePunch(type=HolePunch.CONNECT))
                            await stream.read(4096)
                            await write_delimited_msg(stream, HolePunch(type=HolePunch.SYNC))

                    async with trio.open_nursery() as punches:
                        for _ in range(2 * 4):
                            punches.start_soon(punch)
                    while puncher.attempts + puncher.refused < 8:
                        await trio.sleep(0.05)
                assert puncher.attempts == 1 and puncher.refused == 7
                nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.usefixtures("loopback_listener")
def test_a_peer_whose_punches_succeed_and_drop_still_waits_the_backoff(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A punch that succeeds must not let the peer ask for the next one at once: it could
    drop each direct connection it gets and punch again, with up to ``MAX_ADDRESSES - 1``
    other hosts' addresses beside its own each time (dialled every round trip)."""
    import gwtf.node.p2p.holepunch as holepunch

    monkeypatch.setattr(holepunch, "punchable", lambda _addr: True)  # loopback stands in

    async def main() -> None:
        async with AsyncExitStack() as stack:
            _relay, home, other = await relay_home_and_peer(stack)
            peer = other.host.get_id()
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(home.host, timeout_s=2.0, check_s=3600.0, drain_s=0.0)
                puncher.serve(nursery)
                own = own_addresses(other.host)

                async def punch() -> None:
                    with contextlib.suppress(Exception):  # a refused one is reset
                        stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                        await write_delimited_msg(
                            stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=own)
                        )
                        await stream.read(4096)
                        await write_delimited_msg(stream, HolePunch(type=HolePunch.SYNC))

                with trio.fail_after(20):
                    for _ in range(2):
                        # Over a circuit again, as after dropping the direct connection.
                        await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                        assert is_relayed(home.host, peer)
                        before = puncher.attempts + puncher.refused
                        await punch()
                        while puncher.attempts + puncher.refused == before:
                            await trio.sleep(0.05)
                        while puncher.running(peer):
                            await trio.sleep(0.05)
                        for conn in direct_connections(home.host, peer):
                            await conn.close()
                assert puncher.punched == 1 and puncher.attempts == 1 and puncher.refused == 1
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_stream_being_opened_when_the_circuit_is_retired_is_retired_too() -> None:
    """A stream whose negotiation began before the direct connection was up runs on the circuit
    (several round trips through the relay): retiring the peer must catch it too, or every later
    request of its protocol rides the circuit until the circuit is cut under it."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            home = await stack.enter_async_context(node(stack))
            other = await stack.enter_async_context(node(stack))
            learn(other, home.host)
            peer = home.host.get_id()
            opening = other.rpc._open_stream

            async def slow_open(peer_id, protocol):  # type: ignore[no-untyped-def]
                stream = await opening(peer_id, protocol)
                await trio.sleep(0.3)  # negotiation through a relay
                return stream

            other.rpc._open_stream = slow_open  # type: ignore[method-assign]
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(other.rpc.request, peer, ECHO, b"first", LIMITS)
                    await trio.sleep(0.1)  # the stream is being opened
                    await other.rpc.retire(peer)
                opened = other.rpc.streams_opened
                assert await other.rpc.request(peer, ECHO, b"next", LIMITS) == b"next"
                assert other.rpc.streams_opened == opened + 1

    trio.run(main)


@pytest.mark.usefixtures("loopback_listener")
def test_a_peer_not_admitted_is_not_punched_to() -> None:
    """Anyone may reach a node through its relay with a fresh peer id: the node must not
    start a punch to it (name its public address, dial the addresses it answers with) unless
    it is admitted, as it answers none of its punches."""

    async def nobody(_peer: str) -> bool:
        return False

    async def main() -> None:
        async with AsyncExitStack() as stack:
            _relay, home, other = await relay_home_and_peer(stack)
            asked: list[INetStream] = []

            async def record(stream: INetStream) -> None:
                asked.append(stream)
                await stream.reset()

            other.host.set_stream_handler(PROTOCOL_ID, record)
            puncher = HolePuncher(home.host, admit=nobody, timeout_s=2.0, check_s=3600.0)
            with trio.fail_after(10):
                await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                assert is_relayed(home.host, other.host.get_id())
                assert not await puncher.attempt(other.host.get_id())
                await trio.sleep(0.2)
            assert not asked and puncher.attempts == 0 and puncher.refused == 1
            assert not puncher._after  # nothing kept per peer that is not admitted

    trio.run(main)


@pytest.mark.usefixtures("loopback_listener")
def test_a_request_on_the_circuit_longer_than_the_drain_is_answered(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The circuit a punch replaced is kept while a request on it may still be answered (its
    deadline, or the longest this node's handlers may take), not cut at ``drain_s``: a
    gradient exchange waits on its round up to twice the hop deadline."""
    import gwtf.node.p2p.holepunch as holepunch

    monkeypatch.setattr(holepunch, "punchable", lambda _addr: True)  # loopback stands in

    async def slow(_peer: str, request: bytes) -> bytes:
        await trio.sleep(1.5)
        return request

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            other.rpc.serve(SLOW, slow, LIMITS)
            learn(other, home.host)
            peer = other.host.get_id()
            replies: list[bytes] = []
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(
                    home.host, timeout_s=2.0, check_s=3600.0, drain_s=0.3, on_direct=home.rpc.retire
                )
                puncher.serve(nursery)
                own = own_addresses(other.host)
                with trio.fail_after(20):
                    await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                    assert is_relayed(home.host, peer)

                    async def in_flight() -> None:
                        replies.append(await home.rpc.request(peer, SLOW, b"slow", LIMITS))

                    async with trio.open_nursery() as requests:
                        requests.start_soon(in_flight)
                        await trio.sleep(0.2)  # the request is on the circuit
                        stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                        await write_delimited_msg(
                            stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=own)
                        )
                        await stream.read(4096)
                        await write_delimited_msg(stream, HolePunch(type=HolePunch.SYNC))
                    assert puncher.punched == 1
                assert replies == [b"slow"]
                nursery.cancel_scope.cancel()

    trio.run(main)


def peer_ids_above(host: IHost, count: int) -> list[ID]:
    """``count`` fresh peer ids above ``host``'s (peers it starts punches to)."""
    found: list[ID] = []
    while len(found) < count:
        peer = peer_id_of(new_identity())
        if str(peer) > str(host.get_id()):
            found.append(peer)
    return found


@pytest.mark.usefixtures("loopback_listener")
def test_a_punch_is_answered_without_waiting_on_the_relay(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The starting side dials half the round trip of its CONNECT after the answer: an answer
    that first asks the relay for this node's public IP delays it by that lookup. It is looked
    up ahead, at the relay of the slot it holds; here the relay stops answering after that."""
    import gwtf.node.p2p.holepunch as holepunch

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay, home, other = await relay_home_and_peer(stack)
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(home.host, timeout_s=2.0, check_s=3600.0, refresh_s=0.1)
                puncher.serve(nursery)
                with trio.fail_after(10):
                    while not puncher._fresh(relay.host.get_id()):
                        await trio.sleep(0.05)

                    async def unanswered(*_args: object) -> str | None:
                        await trio.sleep_forever()
                        return None

                    monkeypatch.setattr(holepunch, "observed_ip", unanswered)
                    await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                    assert is_relayed(other.host, home.host.get_id())
                    stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                    await write_delimited_msg(stream, HolePunch(type=HolePunch.CONNECT))
                    answer = await holepunch._read(stream)
                assert answer is not None and answer.type == HolePunch.CONNECT
                port = every_listener(home.host)[0][1]
                named = [str(multiaddr.Multiaddr(a)) for a in answer.ObsAddrs]
                assert named == [f"/ip4/127.0.0.1/tcp/{port}"]
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_circuit_opened_as_the_node_stops_starts_nothing_and_raises_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``CircuitDialer.on_circuit`` must not raise: a circuit that opens as the node stops (its
    nursery closed) is told to ``schedule`` all the same."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            home = await stack.enter_async_context(node(stack))
            puncher = HolePuncher(home.host, check_s=3600.0)
            async with trio.open_nursery() as nursery:
                puncher.serve(nursery)
                nursery.cancel_scope.cancel()
            monkeypatch.setattr(puncher, "_may_start", lambda _peer: True)  # relayed, due
            puncher.schedule(peer_ids_above(home.host, 1)[0])
            assert puncher.attempts == 0

    trio.run(main)


def test_only_listeners_off_loopback_are_punch_sources() -> None:
    async def main() -> None:
        both = ("/ip4/127.0.0.1/tcp/0", "/ip4/0.0.0.0/tcp/0")
        async with running_host(new_identity(), listen=both) as host:
            assert [ip for ip, _port in listen_ports(host)] == ["0.0.0.0"]
        async with running_host(new_identity()) as host:
            assert listen_ports(host) == []

    trio.run(main)


def test_a_node_on_loopback_only_does_not_punch() -> None:
    """Its punch would leave from 127.0.0.1, which no router sees: it neither starts nor
    answers one (the local swarm and the demo are reachable anyway)."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            _relay, home, other = await relay_home_and_peer(stack)
            async with trio.open_nursery() as nursery:
                puncher = HolePuncher(home.host, timeout_s=2.0, check_s=3600.0)
                puncher.serve(nursery)
                with trio.fail_after(10):
                    await other.rpc.request(home.host.get_id(), ECHO, b"x", LIMITS)
                    assert is_relayed(home.host, other.host.get_id())
                    assert not await puncher.attempt(other.host.get_id())
                    stream = await other.host.new_stream(home.host.get_id(), [PROTOCOL_ID])
                    with contextlib.suppress(Exception):  # the home resets it
                        await write_delimited_msg(stream, HolePunch(type=HolePunch.CONNECT))
                    while puncher.refused == 0:
                        await trio.sleep(0.05)
                assert puncher.attempts == 0
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_backoffs_long_over_are_forgotten_and_at_most_a_cap_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import gwtf.node.p2p.holepunch as holepunch

    async def main() -> None:
        async with AsyncExitStack() as stack:
            home = await stack.enter_async_context(node(stack))
            puncher = HolePuncher(home.host, backoff_s=1.0, max_backoff_s=10.0)
            gone, recent, failed = peer_ids_above(home.host, 3)
            now = trio.current_time()
            puncher._after[gone] = (4, now - 11.0)  # over for longer than the longest backoff
            puncher._after[recent] = (4, now - 5.0)
            puncher._settle(failed, False)
            assert list(puncher._after) == [recent, failed]
            monkeypatch.setattr(holepunch, "MAX_REMEMBERED", 4)
            more = peer_ids_above(home.host, 5)
            for peer in more:
                puncher._settle(peer, False)
            assert list(puncher._after) == more[-4:]  # the least recently settled out
            # Peers punched to are kept, connected directly still or not, up to the cap.
            puncher._punched.update(dict.fromkeys(more))
            puncher._settle(failed, True)
            assert list(puncher._punched) == [*more[-3:], failed]
            assert puncher.punched_peers() == sorted(map(str, [*more[-3:], failed]))
            assert puncher.direct_peers() == []  # none is connected directly here

    trio.run(main)
