"""Circuit relay v2 between real libp2p hosts on 127.0.0.1: slots, circuits and a relay's limits."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import multiaddr
import pytest
import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2 import resources
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, StopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID as STOP
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import write_delimited_msg

from gwtf.node.p2p.host import full_address, full_addresses, peer_info, point_at, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.keepalive import ALIVE_PROTOCOL, NeighbourKeeper
from gwtf.node.p2p.relay import (
    CircuitDialer,
    RelayRefused,
    RelaySlots,
    connect_through,
    is_circuit,
    is_relayed,
    read_relay_message,
    reserve,
)
from gwtf.node.p2p.relay_service import CircuitRelay, RelayLimits, circuit_relay
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=1 << 20, max_response_bytes=1 << 20, timeout_s=5.0)


async def echo(_peer: str, request: bytes) -> bytes:
    return request


@dataclass
class Node:
    host: IHost
    relay: CircuitRelay
    rpc: RequestResponse
    dialer: CircuitDialer
    reservations: RelaySlots | None = None
    #: Peers' addresses as their own records give them (an address book's part).
    records: dict[ID, list[str]] = field(default_factory=dict)
    #: Relays this node dials through, and where (a run's data nodes, in a live node).
    trusted: dict[ID, list[multiaddr.Multiaddr]] = field(default_factory=dict)


@asynccontextmanager
async def node(
    stack: AsyncExitStack,
    serve: bool = False,
    limits: RelayLimits | None = None,
    relays: tuple[str, ...] = (),
    banned: frozenset[str] = frozenset(),
    trusts: Sequence[Node] = (),
    announce: tuple[str, ...] = (),
    admit_delay_s: float = 0.0,
    max_inbound_circuits: int = 32,
    check_s: float = 0.2,
) -> AsyncIterator[Node]:
    """A host that relays (``serve``), holds slots at ``relays`` and takes circuits from them,
    and dials through ``trusts`` (and ``relays``)."""
    held: list[RelaySlots] = []

    async def admit(peer: str) -> bool:
        await trio.sleep(admit_delay_s)  # a chain lookup, when not cached
        return peer not in banned

    def holds_slot_at(relay: ID) -> bool:
        return bool(held) and held[0].holds_slot_at(relay)

    host = await stack.enter_async_context(
        running_host(
            new_identity(),
            announce=announce,
            circuits=lambda: held[0].addresses() if held else [],
        )
    )
    circuits_from = holds_slot_at if relays else None
    relay = await stack.enter_async_context(
        circuit_relay(host, serve, limits, admit, circuits_from, max_inbound_circuits)
    )
    records: dict[ID, list[str]] = {}
    trusted = {n.host.get_id(): [peer_info(full_address(n.host)).addrs[0]] for n in trusts}

    async def relay_addresses(relay: ID) -> list[multiaddr.Multiaddr]:
        return trusted.get(relay) or (await held[0].relay_addresses(relay) if held else [])

    dialer = CircuitDialer(host, lambda peer: records.get(peer, []), relay_addresses, 5.0)
    rpc = RequestResponse(host, circuits=dialer)
    rpc.serve(ECHO, echo, LIMITS)
    async with trio.open_nursery() as nursery:
        reservations = None
        if relays:
            reservations = RelaySlots(host, relays, check_s=check_s)
            held.append(reservations)
            nursery.start_soon(reservations.run)
            with trio.fail_after(5):
                while not reservations.held:
                    await trio.sleep(0.05)
        yield Node(host, relay, rpc, dialer, reservations, records, trusted)
        nursery.cancel_scope.cancel()


def learn(node: Node, other: IHost, addresses: list[str] | None = None) -> None:
    """``node`` knows ``other`` by the addresses its record gives (or those given), in order."""
    chosen = addresses if addresses is not None else full_addresses(other)
    node.records[other.get_id()] = list(chosen)
    addrs = [addr for address in chosen for addr in peer_info(address).addrs]
    point_at(node.host, other.get_id(), addrs)


def test_two_hosts_that_do_not_dial_each_other_exchange_requests_through_a_relay() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            advertised = full_addresses(home.host)
            # The home advertises the circuit first (its own id last), then its direct address.
            circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home.host.get_id()}"
            assert advertised[0] == circuit and not is_circuit(advertised[1]), advertised
            learn(other, home.host)
            with trio.fail_after(10):
                reply = await other.rpc.request(home.host.get_id(), ECHO, b"x" * 100_000, LIMITS)
            assert reply == b"x" * 100_000
            assert is_relayed(other.host, home.host.get_id())
            # The home answers over the circuit the other opened: it dials nothing either.
            with trio.fail_after(10):
                back = await home.rpc.request(other.host.get_id(), ECHO, b"back", LIMITS)
            assert back == b"back" and is_relayed(home.host, other.host.get_id())
            assert relay.relay.hop is not None and relay.relay.hop.refused == 0

    trio.run(main)


def test_a_failed_direct_dial_falls_back_to_the_relay() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            home_id = home.host.get_id()
            # A direct address first that nobody listens on (a router that forwards nothing).
            dead = f"/ip4/127.0.0.1/tcp/9/p2p/{home_id}"
            circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home_id}"
            learn(other, home.host, [dead, circuit])
            dialer = other.dialer
            assert not dialer.prefers_relay(home_id)
            with trio.fail_after(15):
                assert await other.rpc.request(home_id, ECHO, b"hi", LIMITS) == b"hi"
            assert is_relayed(other.host, home_id) and dialer.relayed == 1

    trio.run(main)


def test_a_home_takes_its_slot_again_when_its_connection_to_the_relay_drops() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            assert home.reservations is not None
            taken = home.reservations.taken
            network = home.host.get_network()
            await network.close_peer(relay.host.get_id())
            with trio.fail_after(5):
                while home.reservations.taken == taken or not network.connections.get(
                    relay.host.get_id()
                ):
                    await trio.sleep(0.05)
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            learn(other, home.host)
            with trio.fail_after(10):
                assert await other.rpc.request(home.host.get_id(), ECHO, b"hi", LIMITS) == b"hi"

    trio.run(main)


def test_a_circuit_refused_while_the_home_dials_its_relay_again_is_asked_once_more() -> None:
    """A relay honours a slot only while it holds a connection to the slot's holder: a circuit
    asked for in the moment that connection is down (the home dials it again ``check_s`` later)
    is refused NO_RESERVATION, and the dialer asks once more after ``SLOT_GAP_S``."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(
                node(stack, relays=(full_address(relay.host),), check_s=0.5)
            )
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            home_id, relay_id = home.host.get_id(), relay.host.get_id()
            learn(other, home.host, [f"{full_address(relay.host)}/p2p-circuit/p2p/{home_id}"])
            await home.host.get_network().close_peer(relay_id)
            with trio.fail_after(5):
                while relay.host.get_network().connections.get(home_id):
                    await trio.sleep(0.01)
            with trio.fail_after(15):
                assert await other.rpc.request(home_id, ECHO, b"hi", LIMITS) == b"hi"
            assert is_relayed(other.host, home_id) and other.dialer.failures == 0

    trio.run(main)


def refused_status(exc: pytest.ExceptionInfo[RelayRefused]) -> StatusCode:
    return StatusCode(exc.value.status)


def test_a_relay_refuses_beyond_its_limits() -> None:
    limits = RelayLimits(reservations=1, hop_streams_per_peer=1, circuit_bytes=64 * 1024)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            outsider_key = new_identity()
            outsider_host = await stack.enter_async_context(running_host(outsider_key))
            banned = frozenset({str(outsider_host.get_id())})
            relay = await stack.enter_async_context(
                node(stack, serve=True, limits=limits, banned=banned)
            )
            relay_info = peer_info(full_address(relay.host))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            # The one slot is taken: a second home is refused one.
            second = await stack.enter_async_context(node(stack, trusts=[relay]))
            with pytest.raises(RelayRefused) as full:
                await reserve(second.host, relay_info, 5.0)
            assert refused_status(full) == StatusCode.RESOURCE_LIMIT_EXCEEDED
            # A peer the run does not admit may not use the relay at all.
            with pytest.raises(RelayRefused) as outsider:
                await reserve(outsider_host, relay_info, 5.0)
            assert refused_status(outsider) == StatusCode.PERMISSION_DENIED
            guard = relay.relay.hop
            assert guard is not None
            with trio.fail_after(5):  # the slot's own hop stream closes (py-libp2p: 0.5 s late)
                while guard.open_streams:
                    await trio.sleep(0.05)
            # Nobody is relayed to a peer that holds no slot.
            with pytest.raises(RelayRefused) as no_slot:
                await connect_through(home.host, relay_info, second.host.get_id(), 5.0)
            assert refused_status(no_slot) == StatusCode.NO_RESERVATION, no_slot.value
            # One circuit per peer at a time (hop_streams_per_peer=1): a second is refused.
            learn(second, home.host)
            home_id = home.host.get_id()
            assert await second.rpc.request(home_id, ECHO, b"hi", LIMITS) == b"hi"
            with pytest.raises(RelayRefused) as busy:
                await connect_through(second.host, relay_info, home_id, 5.0)
            assert refused_status(busy) == StatusCode.RESOURCE_LIMIT_EXCEEDED
            assert guard.refused == 2  # the outsider and the second circuit (slots: py-libp2p)
            # A circuit ends at its byte limit (both directions counted); the next request
            # dials a fresh one.
            with pytest.raises(PeerUnavailable):
                await second.rpc.request(home_id, ECHO, b"y" * 50_000, LIMITS)
            with trio.fail_after(10):
                while second.host.get_network().connections.get(home_id):
                    await trio.sleep(0.05)
            assert await second.rpc.request(home_id, ECHO, b"again", LIMITS) == b"again"

    trio.run(main)


def test_relay_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="circuit_bytes must be positive"):
        RelayLimits(circuit_bytes=0)


# ---- what untrusted peers may not do ------------------------------------------------------------


async def hop_request(host: IHost, relay: ID, request: HopMessage) -> tuple[INetStream, HopMessage]:
    stream = await host.new_stream(relay, [HOP])
    await write_delimited_msg(stream, request)
    answer = await read_relay_message(stream, HopMessage, 5.0)
    assert answer is not None
    return stream, answer


def test_a_node_takes_circuits_only_from_relays_it_holds_a_slot_at_and_only_so_many() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            relay_address = full_address(relay.host)
            home = await stack.enter_async_context(
                node(stack, relays=(relay_address,), max_inbound_circuits=1)
            )
            reachable = await stack.enter_async_context(node(stack))
            home_id = home.host.get_id()
            stranger = await stack.enter_async_context(running_host(new_identity()))
            await stranger.connect(peer_info(full_addresses(home.host)[1]))  # its LAN address
            await stranger.connect(peer_info(full_address(reachable.host)))
            before = len(home.host.get_network().connections)
            # A stranger offers circuits under made-up identities: each is refused unread.
            for _ in range(3):
                stream = await stranger.new_stream(home_id, [STOP])
                made_up = ID.from_pubkey(new_identity().public_key)
                offer = StopMessage(
                    type=StopMessage.CONNECT, peer=CircuitPeer(id=made_up.to_bytes())
                )
                await write_delimited_msg(stream, offer)
                answer = await read_relay_message(stream, StopMessage, 5.0)
                assert answer is not None and int(answer.status) == StatusCode.PERMISSION_DENIED
            await trio.sleep(0.2)
            assert len(home.host.get_network().connections) == before
            assert home.relay.stop is not None and home.relay.stop.refused == 3
            # A reachable node takes no circuits at all.
            assert reachable.relay.stop is None
            with pytest.raises(Exception, match="failed to open a stream"):
                await stranger.new_stream(reachable.host.get_id(), [STOP])
            # From its relay: one circuit at a time (max_inbound_circuits=1).
            circuit = f"{relay_address}/p2p-circuit/p2p/{home_id}"
            first = await stack.enter_async_context(node(stack, trusts=[relay]))
            second = await stack.enter_async_context(node(stack, trusts=[relay]))
            learn(first, home.host, [circuit])
            learn(second, home.host, [circuit])
            with trio.fail_after(10):
                assert await first.rpc.request(home_id, ECHO, b"1", LIMITS) == b"1"
                with pytest.raises(PeerUnavailable):
                    await second.rpc.request(home_id, ECHO, b"2", LIMITS)
            assert home.relay.stop.refused == 4 and is_relayed(first.host, home_id)

    trio.run(main)


def test_a_peer_reserves_a_slot_for_itself_only_one_request_per_hop_stream() -> None:
    limits = RelayLimits(reservations=2)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            info = peer_info(full_address(relay.host))
            attacker = await stack.enter_async_context(node(stack))
            await attacker.host.connect(info)
            for _ in range(4):  # slots for made-up ids would fill the relay
                made_up = ID.from_pubkey(new_identity().public_key)
                request = HopMessage(
                    type=HopMessage.RESERVE, peer=CircuitPeer(id=made_up.to_bytes())
                )
                stream, answer = await hop_request(attacker.host, info.peer_id, request)
                assert int(answer.status) == StatusCode.PERMISSION_DENIED
            honest = await stack.enter_async_context(node(stack))
            await reserve(honest.host, info, 5.0)
            # One request per hop stream: the relay ends it after its answer, so nobody can
            # hold hop streams open idle.
            own = CircuitPeer(id=attacker.host.get_id().to_bytes())
            stream, answer = await hop_request(
                attacker.host, info.peer_id, HopMessage(type=HopMessage.RESERVE, peer=own)
            )
            assert int(answer.status) == StatusCode.OK
            guard = relay.relay.hop
            assert guard is not None
            with trio.fail_after(5):
                while guard.open_streams:
                    await trio.sleep(0.05)
            assert await read_relay_message(stream, HopMessage, 1.0) is None

    trio.run(main)


def test_a_circuit_ending_leaves_other_circuits_to_the_same_home_open() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            a = await stack.enter_async_context(node(stack, trusts=[relay]))
            b = await stack.enter_async_context(node(stack, trusts=[relay]))
            home_id = home.host.get_id()
            circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home_id}"
            learn(a, home.host, [circuit])
            learn(b, home.host, [circuit])
            with trio.fail_after(10):
                assert await a.rpc.request(home_id, ECHO, b"a", LIMITS) == b"a"
                assert await b.rpc.request(home_id, ECHO, b"b", LIMITS) == b"b"
            b_connections = list(b.host.get_network().connections[home_id])
            await a.host.get_network().close_peer(home_id)  # A's circuit ends
            await trio.sleep(1.0)
            assert b.host.get_network().connections.get(home_id) == b_connections
            with trio.fail_after(10):
                assert await b.rpc.request(home_id, ECHO, b"b2", LIMITS) == b"b2"
            assert b.dialer.relayed == 1  # the first circuit still carries it

    trio.run(main)


def test_a_hop_stream_is_ended_when_the_deadline_for_an_answer_passes() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            mute = await stack.enter_async_context(running_host(new_identity()))
            ended = trio.Event()

            async def never_answers(stream: INetStream) -> None:
                try:
                    while await stream.read(1024):
                        pass
                except Exception:  # a reset: what the client must do
                    pass
                ended.set()

            mute.set_stream_handler(HOP, never_answers)
            home = await stack.enter_async_context(node(stack))
            with pytest.raises(trio.TooSlowError):
                await reserve(home.host, peer_info(full_address(mute)), 0.5)
            with trio.fail_after(3):  # closed, not left open at the relay
                await ended.wait()

    trio.run(main)


def test_a_burst_of_hop_streams_cannot_pass_the_caps_while_admission_is_asked() -> None:
    limits = RelayLimits(hop_streams_per_peer=1)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(
                node(stack, serve=True, limits=limits, admit_delay_s=0.3)
            )
            info = peer_info(full_address(relay.host))
            peer = await stack.enter_async_context(node(stack))
            await peer.host.connect(info)
            own = CircuitPeer(id=peer.host.get_id().to_bytes())
            statuses: list[int] = []

            async def ask() -> None:
                request = HopMessage(type=HopMessage.RESERVE, peer=own)
                _, answer = await hop_request(peer.host, info.peer_id, request)
                statuses.append(answer.status)

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(ask)
            assert sorted(statuses) == [StatusCode.OK] + [StatusCode.RESOURCE_LIMIT_EXCEEDED] * 2

    trio.run(main)


def test_a_slot_is_kept_and_advertised_whatever_the_relays_clock_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class HourBehind:  # the relay's clock: its slots "expire" before the home's now
        @staticmethod
        def time() -> float:
            return time.time() - 3600

    monkeypatch.setattr(resources, "time", HourBehind)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            assert home.reservations is not None
            await trio.sleep(1.0)  # five checks
            assert home.reservations.taken == 1  # not taken again at every check
            assert is_circuit(full_address(home.host))

    trio.run(main)


# ---- whom a node dials through -----------------------------------------------------------------


def test_only_trusted_relays_are_dialled_at_their_own_addresses_two_circuits_at_most() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            other_relay = await stack.enter_async_context(node(stack, serve=True))
            relay_id, other_id = relay.host.get_id(), other_relay.host.get_id()
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            home_id = home.host.get_id()
            dialer = await stack.enter_async_context(node(stack, trusts=[relay]))
            untrusted = f"{full_address(other_relay.host)}/p2p-circuit/p2p/{home_id}"
            # A rogue's record of the home: the real relay's id at an address nobody serves.
            bogus = f"/ip4/127.0.0.1/tcp/9/p2p/{relay_id}/p2p-circuit/p2p/{home_id}"
            learn(dialer, home.host, [untrusted, untrusted, bogus])
            with pytest.raises(PeerUnavailable):
                await dialer.rpc.request(home_id, ECHO, b"x", LIMITS)
            # Two circuits looked at, neither through a trusted relay; the third not at all.
            assert dialer.dialer.untrusted == 2 and dialer.dialer.failures == 0
            assert not dialer.host.get_network().connections.get(other_id)
            learn(dialer, home.host, [bogus])
            with trio.fail_after(10):
                assert await dialer.rpc.request(home_id, ECHO, b"y", LIMITS) == b"y"
            assert is_relayed(dialer.host, home_id)
            relay_addrs = [str(a) for a in dialer.host.get_peerstore().addrs(relay_id)]
            assert not any("/tcp/9" in a for a in relay_addrs), relay_addrs

    trio.run(main)


def test_a_dropped_circuit_is_dialled_again_through_the_relay_not_the_dead_direct_address() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            # The home's public address as its router would answer it: a port that accepts and
            # then says nothing (a dial there waits out its whole deadline).
            silent = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            dialled: list[trio.SocketStream] = []

            async def hold(conn: trio.SocketStream) -> None:
                dialled.append(conn)
                await trio.sleep_forever()

            nursery.start_soon(trio.serve_listeners, hold, [silent])
            port = silent.socket.getsockname()[1]
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(
                node(
                    stack,
                    relays=(full_address(relay.host),),
                    announce=(f"/ip4/127.0.0.1/tcp/{port}",),
                )
            )
            home_id = home.host.get_id()
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            learn(other, home.host)  # the circuit first, then the silent address
            with trio.fail_after(10):
                assert await other.rpc.request(home_id, ECHO, b"1", LIMITS) == b"1"
            await trio.sleep(0.5)  # identify has told the dialer the home's addresses again
            await other.host.get_network().close_peer(home_id)
            with trio.fail_after(10):
                assert await other.rpc.request(home_id, ECHO, b"2", LIMITS) == b"2"
            assert other.dialer.relayed == 2 and not dialled
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_silent_circuit_is_given_longer_than_a_silent_direct_connection() -> None:
    """A neighbour reached through a relay that stops answering keep-alives is cut only after
    ``relayed_dead_after_s`` (a busy relay, most often), then dialled again through the relay."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            home_id = home.host.get_id()

            async def silent(_peer: str, _request: bytes) -> bytes:
                await trio.sleep_forever()
                return b""

            home.rpc.serve(ALIVE_PROTOCOL, silent, RpcLimits(0, 0, 10.0))
            learn(other, home.host)
            keeper = NeighbourKeeper(
                other.rpc, lambda: [str(home_id)], period_s=0.1, dead_after_s=0.5,
                relayed_dead_after_s=2.5,
            )  # fmt: skip
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keeper.run)
                with trio.fail_after(10):
                    while not is_relayed(other.host, home_id):
                        await trio.sleep(0.05)
                await trio.sleep(1.5)  # three times the direct deadline: still kept
                assert other.dialer.relayed == 1 and is_relayed(other.host, home_id)
                with trio.fail_after(10):
                    while keeper.reconnects == 0:
                        await trio.sleep(0.05)
                assert other.dialer.relayed == 2  # cut, and dialled again through the relay
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_requests_on_several_protocols_at_once_share_one_circuit() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack, trusts=[relay]))
            protocols = [f"/gwtf/test-echo-{n}/1.0.0" for n in range(4)]
            for protocol in protocols:
                home.rpc.serve(protocol, echo, LIMITS)
            learn(other, home.host)
            replies: list[bytes] = []

            async def ask(protocol: str) -> None:
                replies.append(await other.rpc.request(home.host.get_id(), protocol, b"x", LIMITS))

            with trio.fail_after(15):
                async with trio.open_nursery() as nursery:
                    for protocol in protocols:
                        nursery.start_soon(ask, protocol)
            assert replies == [b"x"] * 4
            assert other.dialer.relayed == 1
            assert len(other.host.get_network().connections.get(home.host.get_id()) or []) == 1
            assert other.dialer._locks == {}  # one lock per peer being dialled, not per peer ever

    trio.run(main)
