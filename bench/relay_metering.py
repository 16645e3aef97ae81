"""Whether a relay's per-peer metering breaks circuits busy both ways, against it unmetered.

Node A holds a slot at a relay on 127.0.0.1 (real hosts: Noise + yamux, the relay's own hop
handler) and has N circuits through it: it opens up to 8 to homes (a peer's circuit cap), and
the rest are opened to it by other peers (a node takes up to 16). For SECONDS, every circuit is
busy both ways: A writes to each counterpart and each counterpart writes to A, as fast as the
circuit takes. A's N circuit ends share its one bucket; each counterpart has one end of its own.
A stream that fails (py-libp2p's yamux resets a write whose window stays shut for 5 s) is a
reset. Rows, for each N and rate, all in the same run:

1. unmetered: a rate no one reaches (the baseline: what the relay and the CPU allow);
2. one bucket per peer, no floor: A's rate split between its N ends;
3. one bucket per peer and each circuit end's floor (``RelayLimits``' default).

The burst is BURST (default 1 MiB: metering starts within a second), not the 16 MiB default.

Usage: python bench/relay_metering.py [--seconds 20] [--circuits 3,8,16,24] [--rates-mib 1,2]
"""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.relay import connect_through, reserve
from gwtf.node.p2p.relay_metering import RelayMeter
from gwtf.node.p2p.relay_service import RelayLimits, circuit_relay

SINK = TProtocol("/gwtf/bench-relay-sink/1.0.0")
CHUNK = 32 * 1024
#: Circuits A opens itself at most (``RelayLimits.circuits_per_peer``); the rest come to it.
OPENED = 8


@dataclass
class Run:
    resets: int
    streams: int
    a_sent: float  # MB/s A got through to all its counterparts
    a_received: float  # MB/s all counterparts got through to A


async def busy_circuits(meter: RelayMeter, circuits: int, seconds: float) -> Run:
    async with AsyncExitStack() as stack:

        async def host() -> IHost:
            new = await stack.enter_async_context(running_host(new_identity()))
            await stack.enter_async_context(circuit_relay(new, circuits_from=lambda _: True))
            new.set_stream_handler(SINK, sink)
            return new

        relay = await stack.enter_async_context(running_host(new_identity()))
        served = await stack.enter_async_context(circuit_relay(relay, serve=True))
        assert served.hop is not None
        served.hop.meter = meter
        info = peer_info(full_address(relay))
        got: dict[ID, int] = {}  # bytes that arrived, by sender

        async def sink(stream: INetStream) -> None:
            sender = stream.muxed_conn.peer_id
            try:
                while data := await stream.read(64 * 1024):
                    got[sender] = got.get(sender, 0) + len(data)
            except Exception:  # reset when the writer stops
                pass

        a = await host()
        await reserve(a, info, 10.0)
        others = [await host() for _ in range(circuits)]
        for i, other in enumerate(others):
            if i < OPENED:
                await reserve(other, info, 10.0)
                await connect_through(a, info, other.get_id(), 10.0)
            else:
                await connect_through(other, info, a.get_id(), 10.0)
        resets = 0

        async def push(src: IHost, dst: ID) -> None:
            nonlocal resets
            try:
                stream = await src.new_stream(dst, [SINK])
                with trio.move_on_after(seconds):
                    while True:
                        await stream.write(b"\x01" * CHUNK)
                await stream.reset()
            except Exception:  # the stream or its circuit broke
                resets += 1

        async with trio.open_nursery() as nursery:
            for other in others:
                nursery.start_soon(push, a, other.get_id())
                nursery.start_soon(push, other, a.get_id())
        a_id = a.get_id()
        to_a = sum(n for sender, n in got.items() if sender != a_id)
        return Run(resets, 2 * circuits, got.get(a_id, 0) / seconds / 1e6, to_a / seconds / 1e6)


async def main(seconds: float, circuits: list[int], rates: list[int], burst: int) -> None:
    floor = RelayLimits().circuit_floor_bytes_per_s
    never = 1 << 40
    await busy_circuits(RelayMeter(never, never), 1, 1.0)  # warm-up: first hosts start slower
    print(f"N circuits busy both ways through one relay on 127.0.0.1 for {seconds:g} s, burst")
    print(f"{burst} B; A's bytes: ratio to unmetered (same N, same run); floor {floor} B/s")
    print("| N | relay | resets / streams | A sends MB/s | A receives MB/s | A sends ratio |")
    print("|---|---|---|---|---|---|")
    for n in circuits:
        base = await busy_circuits(RelayMeter(never, never), n, seconds)
        rows = [("unmetered (baseline)", base)]
        for rate in rates:
            mib = f"{rate / (1 << 20):g} MiB/s"
            bare = RelayMeter(rate, burst)
            rows.append((f"{mib}, no floor", await busy_circuits(bare, n, seconds)))
            metered = RelayMeter(rate, burst, floor)
            rows.append((f"{mib} + floor", await busy_circuits(metered, n, seconds)))
        for name, run in rows:
            ratio = run.a_sent / base.a_sent if base.a_sent else float("nan")
            print(
                f"| {n} | {name} | {run.resets} / {run.streams} | {run.a_sent:.2f} | "
                f"{run.a_received:.2f} | {ratio:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--circuits", default="3,8,16,24")
    parser.add_argument("--rates-mib", default="1,2")
    parser.add_argument("--burst", type=int, default=1 << 20)
    args = parser.parse_args()
    counts = [int(n) for n in args.circuits.split(",")]
    rates = [int(float(r) * (1 << 20)) for r in args.rates_mib.split(",")]
    trio.run(main, args.seconds, counts, rates, args.burst)
