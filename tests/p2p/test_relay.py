"""Circuit relay v2 between real libp2p hosts on 127.0.0.1: slots, circuits and a relay's limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import multiaddr
import pytest
import trio
from libp2p.abc import IHost
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode

from node.p2p.host import full_address, full_addresses, peer_info, point_at, running_host
from node.p2p.identity import new_identity
from node.p2p.relay import (
    CircuitDialer,
    CircuitRelay,
    RelayLimits,
    RelayRefused,
    RelaySlots,
    circuit_relay,
    connect_through,
    is_circuit,
    is_relayed,
    reserve,
)
from node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=1 << 20, max_response_bytes=1 << 20, timeout_s=5.0)


async def echo(_peer: str, request: bytes) -> bytes:
    return request


@dataclass
class Node:
    host: IHost
    relay: CircuitRelay
    rpc: RequestResponse
    reservations: RelaySlots | None = None


@asynccontextmanager
async def node(
    stack: AsyncExitStack,
    serve: bool = False,
    limits: RelayLimits | None = None,
    relays: tuple[str, ...] = (),
    banned: frozenset[str] = frozenset(),
) -> AsyncIterator[Node]:
    """A host that answers circuits (and relays, with ``serve``), holding slots at ``relays``."""
    held: list[RelaySlots] = []

    async def admit(peer: str) -> bool:
        return peer not in banned

    host = await stack.enter_async_context(
        running_host(new_identity(), circuits=lambda: held[0].addresses() if held else [])
    )
    relay = await stack.enter_async_context(circuit_relay(host, serve, limits, admit))
    rpc = RequestResponse(host, circuits=CircuitDialer(host, timeout_s=5.0))
    rpc.serve(ECHO, echo, LIMITS)
    async with trio.open_nursery() as nursery:
        reservations = None
        if relays:
            reservations = RelaySlots(host, relays, check_s=0.2)
            held.append(reservations)
            nursery.start_soon(reservations.run)
            with trio.fail_after(5):
                while not reservations.held:
                    await trio.sleep(0.05)
        yield Node(host, relay, rpc, reservations)
        nursery.cancel_scope.cancel()


def learn(host: IHost, other: IHost, addresses: list[str] | None = None) -> None:
    """``host`` knows ``other`` by the addresses it advertises (or those given), in order."""
    chosen = addresses if addresses is not None else full_addresses(other)
    addrs = [addr for address in chosen for addr in peer_info(address).addrs]
    point_at(host, other.get_id(), addrs)


def test_two_hosts_that_do_not_dial_each_other_exchange_requests_through_a_relay() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack))
            advertised = full_addresses(home.host)
            # The home advertises the circuit first (its own id last), then its direct address.
            circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home.host.get_id()}"
            assert advertised[0] == circuit and not is_circuit(advertised[1]), advertised
            learn(other.host, home.host)
            with trio.fail_after(10):
                reply = await other.rpc.request(home.host.get_id(), ECHO, b"x" * 100_000, LIMITS)
            assert reply == b"x" * 100_000
            assert is_relayed(other.host, home.host.get_id())
            # The home answers over the circuit the other opened: it dials nothing either.
            with trio.fail_after(10):
                back = await home.rpc.request(other.host.get_id(), ECHO, b"back", LIMITS)
            assert back == b"back" and is_relayed(home.host, other.host.get_id())
            assert relay.relay.guard is not None and relay.relay.guard.refused == 0

    trio.run(main)


def test_a_failed_direct_dial_falls_back_to_the_relay() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True))
            home = await stack.enter_async_context(node(stack, relays=(full_address(relay.host),)))
            other = await stack.enter_async_context(node(stack))
            home_id = home.host.get_id()
            # A direct address first that nobody listens on (a router that forwards nothing).
            dead = f"/ip4/127.0.0.1/tcp/9/p2p/{home_id}"
            circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home_id}"
            learn(other.host, home.host, [dead, circuit])
            dialer = other.rpc.circuits
            assert isinstance(dialer, CircuitDialer)
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
            other = await stack.enter_async_context(node(stack))
            learn(other.host, home.host)
            with trio.fail_after(10):
                assert await other.rpc.request(home.host.get_id(), ECHO, b"hi", LIMITS) == b"hi"

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
            second = await stack.enter_async_context(node(stack))
            with pytest.raises(RelayRefused) as full:
                await reserve(second.host, relay_info, 5.0)
            assert refused_status(full) == StatusCode.RESOURCE_LIMIT_EXCEEDED
            # A peer the run does not admit may not use the relay at all.
            with pytest.raises(RelayRefused) as outsider:
                await reserve(outsider_host, relay_info, 5.0)
            assert refused_status(outsider) == StatusCode.PERMISSION_DENIED
            guard = relay.relay.guard
            assert guard is not None
            with trio.fail_after(5):  # the slot's own hop stream closes (py-libp2p: 0.5 s late)
                while guard.open_streams:
                    await trio.sleep(0.05)
            # Nobody is relayed to a peer that holds no slot.
            circuit = multiaddr.Multiaddr(f"{full_address(relay.host)}/p2p-circuit")
            with pytest.raises(RelayRefused) as no_slot:
                await connect_through(home.host, circuit, second.host.get_id(), 5.0)
            assert refused_status(no_slot) == StatusCode.NO_RESERVATION, no_slot.value
            # One circuit per peer at a time (hop_streams_per_peer=1): a second is refused.
            learn(second.host, home.host)
            home_id = home.host.get_id()
            assert await second.rpc.request(home_id, ECHO, b"hi", LIMITS) == b"hi"
            with pytest.raises(RelayRefused) as busy:
                await connect_through(second.host, circuit, home_id, 5.0)
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
