"""Whether a relay's per-peer metering breaks circuits busy both ways, against it unmetered.

Node A holds a slot at a relay on 127.0.0.1 (real hosts: Noise + yamux, the relay's own hop
handler) and has N circuits through it: it opens up to 8 to other peers (a peer's circuit cap),
and the rest are opened to it by other peers (a node takes up to 16). For SECONDS, every circuit
is busy both ways: A writes to each counterpart and each counterpart writes to A, as fast as the
circuit takes. A's N circuit ends share its one bucket; each counterpart has one end of its own.
A stream that fails (py-libp2p's yamux resets a write whose window stays shut for 5 s) is a
reset. The relay, A, and the counterparts run in three processes, so the relay's CPU is its own.
Rows, for each N and rate, all in the same run:

1. unmetered: a rate no one reaches (the baseline: what the relay and the CPUs allow);
2. one bucket per peer, no floor: A's rate split between its N ends;
3. one bucket per peer and each circuit end's floor (``RelayLimits``' default).

The burst is BURST (default 1 MiB: metering starts within a second), not the 16 MiB default.
With RTT_MS, the relay's yamux autotune sees that round trip instead of loopback's (what grows
windows on a real link; the relay keeps its legs' windows at ``relay_service.LEG_WINDOW``).

Usage: python bench/relay_metering.py [--seconds 20] [--circuits 3,8,16,24] [--rates-mib 1,2]
       [--burst 1048576] [--rtt-ms 0]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from multiprocessing.connection import Connection

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux.yamux import YamuxStream

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


class Ends:
    """Hosts that take circuits, count what arrives by sender, and push as hard as they can."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self.stack = stack
        self.got: dict[ID, int] = {}
        self.resets = 0
        self.why: list[str] = []  # each reset: at which step, what, when

    async def host(self) -> IHost:
        new = await self.stack.enter_async_context(running_host(new_identity()))
        await self.stack.enter_async_context(circuit_relay(new, circuits_from=lambda _: True))
        new.set_stream_handler(SINK, self.sink)
        return new

    async def sink(self, stream: INetStream) -> None:
        sender = stream.muxed_conn.peer_id
        try:
            while data := await stream.read(64 * 1024):
                self.got[sender] = self.got.get(sender, 0) + len(data)
        except Exception:  # reset when the writer stops
            pass

    async def push(self, src: IHost, dst: ID, seconds: float) -> None:
        start, step = trio.current_time(), "open"
        try:
            stream = await src.new_stream(dst, [SINK])
            step = "write"
            with trio.move_on_after(seconds):
                while True:
                    await stream.write(b"\x01" * CHUNK)
            step = "reset"
            await stream.reset()
        except Exception as exc:  # the stream or its circuit broke (after the time: its end)
            if (at := trio.current_time() - start) < seconds:
                self.resets += 1
                self.why.append(f"{step} {type(exc).__name__} {at:.1f}s")


def serve_relay(rate: float, burst: float, floor: float, rtt_s: float, pipe: Connection) -> None:
    """The relay's process: serve with this meter until the pipe says stop."""
    if rtt_s:
        YamuxStream._effective_rtt = lambda self: rtt_s  # type: ignore[method-assign]

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(running_host(new_identity()))
            served = await stack.enter_async_context(circuit_relay(relay, serve=True))
            assert served.hop is not None
            served.hop.meter = RelayMeter(rate, burst, floor)
            pipe.send(full_address(relay))
            await trio.to_thread.run_sync(pipe.recv)

    trio.run(main)


def counterparts(relay: str, a: str, n: int, seconds: float, pipe: Connection) -> None:
    """The counterparts' process: N hosts, the first 8 reserved (A dials them), the rest
    dialling A; on "go" they push to A, then report (resets, bytes A sent them, why) and close
    once A is done (closing earlier would reset A's last writes)."""

    async def main() -> None:
        info, a_id = peer_info(relay), ID.from_base58(a)
        async with AsyncExitStack() as stack:
            ends = Ends(stack)
            others = [await ends.host() for _ in range(n)]
            for i, other in enumerate(others):
                if i < OPENED:
                    await reserve(other, info, 10.0)
                else:
                    await connect_through(other, info, a_id, 10.0)
            pipe.send([str(o.get_id()) for o in others[:OPENED]])
            await trio.to_thread.run_sync(pipe.recv)
            with trio.fail_after(10):  # A's circuits to the first 8 may still be upgrading here
                for other in others:
                    while not other.get_network().connections.get(a_id):
                        await trio.sleep(0.01)
            async with trio.open_nursery() as nursery:
                for other in others:
                    nursery.start_soon(ends.push, other, a_id, seconds)
            pipe.send((ends.resets, ends.got.get(a_id, 0), ends.why))
            await trio.to_thread.run_sync(pipe.recv)  # A is done too: now the hosts may close

    trio.run(main)


async def busy_circuits(
    meter: tuple[float, float, float], n: int, seconds: float, rtt_s: float = 0.0
) -> Run:
    spawn = multiprocessing.get_context("spawn")
    to_relay, relay_end = spawn.Pipe()
    relay = spawn.Process(target=serve_relay, args=(*meter, rtt_s, relay_end))
    relay.start()
    try:
        address = await trio.to_thread.run_sync(to_relay.recv)
        async with AsyncExitStack() as stack:
            ends = Ends(stack)
            a = await ends.host()
            info = peer_info(address)
            await reserve(a, info, 10.0)
            to_others, others_end = spawn.Pipe()
            args = (address, str(a.get_id()), n, seconds, others_end)
            others = spawn.Process(target=counterparts, args=args)
            others.start()
            opened = [ID.from_base58(p) for p in await trio.to_thread.run_sync(to_others.recv)]
            for peer in opened:
                await connect_through(a, info, peer, 10.0)
            to_a = [c.muxed_conn.peer_id for c in _conns(a) if c.muxed_conn.peer_id != info.peer_id]
            to_others.send("go")
            async with trio.open_nursery() as nursery:
                for peer in set(to_a):
                    nursery.start_soon(ends.push, a, peer, seconds)
            resets, a_sent, why = await trio.to_thread.run_sync(to_others.recv)
            to_others.send("done")
            others.join()
            if ends.why or why:
                print(f"  N={n} {meter[:2]}: resets at A {ends.why}, at the others {why}",
                      file=sys.stderr)  # fmt: skip
            received = sum(ends.got.values()) / seconds / 1e6
            return Run(ends.resets + resets, 2 * n, a_sent / seconds / 1e6, received)
    finally:
        to_relay.send("stop")
        relay.join()


def _conns(host: IHost) -> list:  # type: ignore[type-arg]
    return [c for conns in host.get_network().connections.values() for c in conns]


async def main(
    seconds: float, circuits: list[int], rates: list[int], burst: int, rtt_s: float
) -> None:
    floor = RelayLimits().circuit_floor_bytes_per_s
    never = float(1 << 40)
    print(f"N circuits busy both ways through one relay on 127.0.0.1 for {seconds:g} s, burst")
    print(f"{burst} B, floor {floor} B/s, round trip seen by the relay's yamux {rtt_s * 1e3:g} ms")
    print("(0: loopback's); A sends: ratio to unmetered (same N, same run)")
    print("| N | relay | resets / streams | A sends MB/s | A receives MB/s | A sends ratio |")
    print("|---|---|---|---|---|---|", flush=True)
    for n in circuits:
        base = await busy_circuits((never, never, 0), n, seconds, rtt_s)
        rows = [("unmetered (baseline)", base)]
        for rate in rates:
            mib = f"{rate / (1 << 20):g} MiB/s"
            for name, each in ((f"{mib}, no floor", 0), (f"{mib} + floor", floor)):
                rows.append((name, await busy_circuits((rate, burst, each), n, seconds, rtt_s)))
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
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    args = parser.parse_args()
    counts = [int(n) for n in args.circuits.split(",")]
    rates = [int(float(r) * (1 << 20)) for r in args.rates_mib.split(",")]
    trio.run(main, args.seconds, counts, rates, args.burst, args.rtt_ms / 1e3)
