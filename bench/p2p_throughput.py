"""libp2p stream throughput vs raw TCP on loopback, same bytes, same process, same run.

Sends PAYLOAD_MB of data over (a) a plain trio TCP socket pair and (b) a libp2p stream with Noise +
yamux between two hosts on 127.0.0.1, as framed messages of CHUNK_MB each through the node's own
framing, and prints MB/s of each and their ratio. Usage: python bench/p2p_throughput.py [--mb 64]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import trio
from libp2p.custom_types import TProtocol

from node.p2p.framing import read_frame, write_frame
from node.p2p.host import full_address, peer_info, running_host
from node.p2p.identity import load_or_create_identity

PROTOCOL = TProtocol("/gwtf/bench-sink/1.0.0")
CHUNK_BYTES = 4 << 20


async def raw_tcp_mb_per_s(total_bytes: int) -> float:
    payload = b"\x01" * CHUNK_BYTES
    received = 0
    done = trio.Event()

    async def sink(stream: trio.SocketStream) -> None:
        nonlocal received
        while received < total_bytes:
            chunk = await stream.receive_some(1 << 20)
            if not chunk:
                break
            received += len(chunk)
        done.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, sink, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        start = time.perf_counter()
        sent = 0
        while sent < total_bytes:
            await client.send_all(payload)
            sent += len(payload)
        await done.wait()
        elapsed = time.perf_counter() - start
        await client.aclose()
        nursery.cancel_scope.cancel()
    return total_bytes / elapsed / 1e6


async def libp2p_mb_per_s(total_bytes: int) -> float:
    payload = b"\x01" * CHUNK_BYTES
    received = 0
    done = trio.Event()

    async def sink(stream) -> None:  # type: ignore[no-untyped-def]
        nonlocal received
        while received < total_bytes:
            received += len(await read_frame(stream, CHUNK_BYTES))
        done.set()

    with tempfile.TemporaryDirectory() as tmp:
        a_key = load_or_create_identity(Path(tmp) / "a.key")
        b_key = load_or_create_identity(Path(tmp) / "b.key")
        async with running_host(a_key) as a, running_host(b_key) as b:
            b.set_stream_handler(PROTOCOL, sink)
            await a.connect(peer_info(full_address(b)))
            stream = await a.new_stream(b.get_id(), [PROTOCOL])
            start = time.perf_counter()
            sent = 0
            while sent < total_bytes:
                await write_frame(stream, payload, CHUNK_BYTES)
                sent += len(payload)
            await done.wait()
            elapsed = time.perf_counter() - start
            await stream.close()
    return total_bytes / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="megabytes to send per transport")
    total = parser.parse_args().mb * (1 << 20)
    tcp = trio.run(raw_tcp_mb_per_s, total)
    p2p = trio.run(libp2p_mb_per_s, total)
    print(f"{'transport':<28}{'MB/s':>10}{'ratio':>10}")
    print(f"{'raw TCP (trio)':<28}{tcp:>10.1f}{1.0:>10.2f}")
    print(f"{'libp2p Noise+yamux+framing':<28}{p2p:>10.1f}{p2p / tcp:>10.2f}")


if __name__ == "__main__":
    main()
