"""What a relay's per-peer metering costs and bounds: bytes through one circuit, same run.

A peer pushes to a home through a relay on 127.0.0.1 (real hosts: Noise + yamux, the relay's
own hop handler) for SECONDS, and the home counts what arrives. Rows:

1. unmetered: the relay's charge replaced by a no-op (the relay as it was; the baseline);
2. metered at a rate it never reaches: what the buckets' bookkeeping costs;
3. metered at the default rate (``RelayLimits``: 2 MiB/s, bursts of 16 MiB);
4. two peers, each through its own circuit to its own home, at the default rate: each is held
   to its own share.

Each metered row shows its bound, ``(burst + rate * seconds) / seconds``: the default burst,
16 MiB, passes unslowed, so the rate shows only over runs of many seconds.

Usage: python bench/relay_metering.py [--seconds 20]
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

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


async def through_relay(limits: RelayLimits, pushers: int, seconds: float) -> list[float]:
    """MB/s each of ``pushers`` peers got through one relay to its own home."""
    async with AsyncExitStack() as stack:
        relay = await stack.enter_async_context(running_host(new_identity()))
        await stack.enter_async_context(circuit_relay(relay, serve=True, limits=limits))
        info = peer_info(full_address(relay))
        got: dict[ID, int] = {}

        async def sink(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id
            try:
                while data := await stream.read(64 * 1024):
                    got[peer] = got.get(peer, 0) + len(data)
            except Exception:  # reset when the pusher stops
                pass

        pairs: list[tuple[IHost, ID]] = []
        for _ in range(pushers):
            home = await stack.enter_async_context(running_host(new_identity()))
            await stack.enter_async_context(circuit_relay(home, circuits_from=lambda _: True))
            home.set_stream_handler(SINK, sink)
            await reserve(home, info, 10.0)
            peer = await stack.enter_async_context(running_host(new_identity()))
            await connect_through(peer, info, home.get_id(), 10.0)
            pairs.append((peer, home.get_id()))

        async def push(peer: IHost, home: ID) -> None:
            stream = await peer.new_stream(home, [SINK])
            with trio.move_on_after(seconds):
                while True:
                    await stream.write(b"\x01" * CHUNK)
            await stream.reset()

        async with trio.open_nursery() as nursery:
            for peer, home in pairs:
                nursery.start_soon(push, peer, home)
        return [got.get(peer.get_id(), 0) / seconds / 1e6 for peer, _ in pairs]


async def unmetered(run: Callable[[], Awaitable[list[float]]]) -> list[float]:
    async def free(_self: RelayMeter, _sender: str, _receiver: str, _count: int) -> None:
        return None

    charge = RelayMeter.charge
    RelayMeter.charge = free  # type: ignore[method-assign]
    try:
        return await run()
    finally:
        RelayMeter.charge = charge  # type: ignore[method-assign]


async def main(seconds: float) -> None:
    default = RelayLimits()
    never = RelayLimits(peer_bytes_per_s=1 << 40, peer_burst_bytes=1 << 40)
    await through_relay(never, 1, 1.0)  # warm-up: the first hosts of a process start slower
    bound = (default.peer_burst_bytes + default.peer_bytes_per_s * seconds) / seconds / 1e6
    rows = [
        ("unmetered (baseline)", await unmetered(lambda: through_relay(never, 1, seconds)), ""),
        ("metered, rate never reached", await through_relay(never, 1, seconds), ""),
        ("metered, 2 MiB/s (default)", await through_relay(default, 1, seconds), bound),
        ("two peers, 2 MiB/s each", await through_relay(default, 2, seconds), bound),
    ]
    base = rows[0][1][0]
    print(f"peers pushing through a relay on 127.0.0.1 for {seconds:g} s; ratio to unmetered")
    print("| relay | MB/s per peer | bound MB/s | ratio |")
    print("|---|---|---|---|")
    for name, rates, most in rows:
        shown = " / ".join(f"{r:.2f}" for r in rates)
        ratios = " / ".join(f"{r / base:.2f}" for r in rates)
        limit = f"{most:.2f}" if most else "-"
        print(f"| {name} | {shown} | {limit} | {ratios} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    trio.run(main, parser.parse_args().seconds)
