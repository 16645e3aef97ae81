"""Libp2p hosts for the test bed's relay test: a public relay, and homes that only it links.

    python -m tests.internet.relay_peer relay
    python -m tests.internet.relay_peer home RELAY_ADDRESS [ANNOUNCE]
    python -m tests.internet.relay_peer dial RELAY_ADDRESS HOME_ADDRESS...
    python -m tests.internet.relay_peer redial RELAY_ADDRESS HOME_ADDRESS...

The relay listens on every interface, answers echo requests and prints ``address A`` for each
address it advertises.
A home holds a slot at the relay, prints ``address A`` for each address it advertises (the
circuit first, then its LAN address or, when given, ``ANNOUNCE``) and answers echo requests
until killed. A dialing home (itself holding a slot,
as a home does) is told the other home's addresses, sends it echo requests, and prints
``reply R relayed=True|False rtt_ms=M direct_rtt_ms=D``: ``M`` the median round trip to the home
through the relay, ``D`` the median round trip to the relay itself.
A redialing peer (public, holding no slot) sends the home a request, drops its connection to
it, sends another, and prints ``redial R relayed=True|False circuits=N``: ``N`` the circuits it
dialled (2 when the second request went through the relay again).
"""

from __future__ import annotations

import statistics
import sys

import multiaddr
import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.addresses import LOOPBACK
from gwtf.node.p2p.host import full_addresses, peer_info, point_at, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.relay import CircuitDialer, RelaySlots, is_relayed
from gwtf.node.p2p.relay_service import circuit_relay
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=1 << 16, max_response_bytes=1 << 16, timeout_s=10.0)
EVERY_INTERFACE = ("/ip4/0.0.0.0/tcp/4001",)
DEADLINE_S = 30.0
ROUNDS = 20


async def echo(_peer: str, request: bytes) -> bytes:
    return request


async def relay() -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host, circuit_relay(host, True):
        RequestResponse(host).serve(ECHO, echo, LIMITS)
        for address in full_addresses(host):
            print("address", address, flush=True)
        await trio.sleep_forever()


async def home(
    relay_address: str, others: list[str] | None = None, announce: tuple[str, ...] = ()
) -> None:
    held: list[RelaySlots] = []
    key = new_identity()
    # With ``announce``, the home advertises that address after its circuit, not its LAN one.
    listen = (LOOPBACK,) if announce else EVERY_INTERFACE
    async with (
        running_host(
            key, listen, announce, circuits=lambda: held[0].addresses() if held else []
        ) as host,
        circuit_relay(host, circuits_from=lambda relay: held[0].holds_slot_at(relay)),
        trio.open_nursery() as nursery,
    ):
        slots = RelaySlots(host, [relay_address], check_s=0.5)
        held.append(slots)
        nursery.start_soon(slots.run)
        with trio.fail_after(DEADLINE_S):
            await slots.asked.wait()
        # The other home's addresses as its record gives them; the relay is the one it trusts.
        record = tuple(others or ())
        other = peer_info(record[0]).peer_id if record else None
        dialer = CircuitDialer(host, lambda peer: record if peer == other else (),
                               slots.relay_addresses)  # fmt: skip
        rpc = RequestResponse(host, circuits=dialer)
        rpc.serve(ECHO, echo, LIMITS)
        for address in full_addresses(host):
            print("address", address, flush=True)
        if others is None:
            await trio.sleep_forever()
        await dial(rpc, relay_address, others)
        nursery.cancel_scope.cancel()


async def dial(rpc: RequestResponse, relay_address: str, addresses: list[str]) -> None:
    peer = peer_info(addresses[0]).peer_id
    point_at(rpc.host, peer, [a for address in addresses for a in peer_info(address).addrs])
    with trio.fail_after(DEADLINE_S):
        reply = await rpc.request(peer, ECHO, b"hello", LIMITS)
        relayed = await _median_rtt_ms(rpc, peer)
        direct = await _median_rtt_ms(rpc, peer_info(relay_address).peer_id)
    print(
        "reply", reply.decode(), f"relayed={is_relayed(rpc.host, peer)}",
        f"rtt_ms={relayed:.2f}", f"direct_rtt_ms={direct:.2f}", flush=True,
    )  # fmt: skip


async def _median_rtt_ms(rpc: RequestResponse, peer: ID) -> float:
    times = []
    for _ in range(ROUNDS):
        started = trio.current_time()
        await rpc.request(peer, ECHO, b"x" * 64, LIMITS)
        times.append((trio.current_time() - started) * 1000.0)
    return statistics.median(times)


async def redial(relay_address: str, addresses: list[str]) -> None:
    relay_info = peer_info(relay_address)
    peer = peer_info(addresses[0]).peer_id
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        trusted = {relay_info.peer_id: relay_info.addrs}

        async def relay_addresses(relay: ID) -> list[multiaddr.Multiaddr]:
            return trusted.get(relay, [])

        dialer = CircuitDialer(host, lambda p: addresses if p == peer else (),
                               relay_addresses)  # fmt: skip
        rpc = RequestResponse(host, circuits=dialer)
        point_at(host, peer, [a for address in addresses for a in peer_info(address).addrs])
        with trio.fail_after(DEADLINE_S):
            await rpc.request(peer, ECHO, b"first", LIMITS)
            await trio.sleep(1.0)  # identify has told this peer the home's addresses again
            await rpc.drop_peer(peer)
            reply = await rpc.request(peer, ECHO, b"again", LIMITS)
        relayed = is_relayed(host, peer)
        print("redial", reply.decode(), f"relayed={relayed}", f"circuits={dialer.relayed}",
              flush=True)  # fmt: skip


def main() -> None:
    role, *rest = sys.argv[1:]
    if role == "relay":
        trio.run(relay)
    elif role == "home":
        trio.run(home, rest[0], None, tuple(rest[1:]))
    elif role == "redial":
        trio.run(redial, rest[0], rest[1:])
    else:
        trio.run(home, rest[0], rest[1:])


if __name__ == "__main__":
    main()
