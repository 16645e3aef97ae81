"""Libp2p hosts for the test bed's hole-punch test: homes that meet through a public relay's
circuit and then punch a direct connection (``gwtf.node.p2p.holepunch``).

    python -m tests.internet.punch_peer home RELAY_ADDRESS
    python -m tests.internet.punch_peer dial RELAY_ADDRESS HOME_ADDRESS...

(the relay is ``tests.internet.relay_peer relay``). Both homes listen on every interface, port
4001, hold a slot at the relay and answer hole punches; ``home`` prints ``address A`` for each
address it advertises (its circuit first) and answers echo requests until killed. ``dial``
sends the home an echo request (a circuit opens, and the punch starts), waits for the punch
to end, sends ``ROUNDS`` more and prints ``punch direct=True|False relayed=True|False
attempts=N refused=R circuits=C rtt_ms=M`` (``C`` the circuits
still open to the home).
"""

from __future__ import annotations

import statistics
import sys

import trio
from libp2p.abc import IHost, INetConn
from libp2p.peer.id import ID

from gwtf.node.p2p.holepunch import HolePuncher, direct_connections
from gwtf.node.p2p.host import full_addresses, peer_info, point_at, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.relay import CircuitDialer, RelaySlots, is_circuit, is_relayed
from gwtf.node.p2p.relay_service import circuit_relay
from gwtf.node.p2p.rpc import RequestResponse
from tests.internet.relay_peer import DEADLINE_S, ECHO, EVERY_INTERFACE, LIMITS, ROUNDS, echo


async def home(relay_address: str, others: list[str]) -> None:
    held: list[RelaySlots] = []
    async with (
        running_host(
            new_identity(), EVERY_INTERFACE, circuits=lambda: held[0].addresses() if held else []
        ) as host,
        circuit_relay(host, circuits_from=lambda relay: held[0].holds_slot_at(relay)),
        trio.open_nursery() as nursery,
    ):
        slots = RelaySlots(host, [relay_address], check_s=0.5)
        held.append(slots)
        nursery.start_soon(slots.run)
        with trio.fail_after(DEADLINE_S):
            await slots.asked.wait()
        puncher = HolePuncher(host, backoff_s=60.0)
        puncher.serve(nursery)
        record = tuple(others)
        other = peer_info(record[0]).peer_id if record else None
        dialer = CircuitDialer(host, lambda peer: record if peer == other else (),
                               slots.relay_addresses, on_circuit=puncher.schedule)  # fmt: skip
        rpc = RequestResponse(host, circuits=dialer)
        puncher.on_direct = rpc.retire
        rpc.serve(ECHO, echo, LIMITS)
        for address in full_addresses(host):
            print("address", address, flush=True)
        if other is None:
            await trio.sleep_forever()
        assert other is not None
        point_at(host, other, [a for address in others for a in peer_info(address).addrs])
        with trio.fail_after(DEADLINE_S):
            await rpc.request(other, ECHO, b"hello", LIMITS)
            # The punch runs in the background, started by either home (the lower peer id).
            while puncher.attempts + puncher.refused == 0 or puncher.running(other):
                await trio.sleep(0.1)
            # The circuit closes once the streams on it are retired (``drain_s`` or a request's
            # deadline at most).
            while puncher.direct_peers() and circuits(host, other):
                await trio.sleep(0.1)
            times = []
            for _ in range(ROUNDS):
                began = trio.current_time()
                await rpc.request(other, ECHO, b"x" * 64, LIMITS)
                times.append((trio.current_time() - began) * 1000.0)
        print(
            "punch", f"direct={bool(direct_connections(host, other))}",
            f"relayed={is_relayed(host, other)}", f"attempts={puncher.attempts}",
            f"refused={puncher.refused}", f"circuits={len(circuits(host, other))}",
            f"rtt_ms={statistics.median(times):.2f}", flush=True,
        )  # fmt: skip
        nursery.cancel_scope.cancel()


def circuits(host: IHost, peer: ID) -> list[INetConn]:
    return [
        c
        for c in host.get_network().connections.get(peer) or []
        if any(is_circuit(a) for a in c.get_transport_addresses())
    ]


def main() -> None:
    role, relay, *rest = sys.argv[1:]
    trio.run(home, relay, rest if role == "dial" else [])


if __name__ == "__main__":
    main()
