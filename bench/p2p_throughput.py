"""libp2p stream throughput vs raw TCP on loopback, and request rates, same process, same run.

1. Sends PAYLOAD_MB of data over (a) a plain trio TCP socket pair and (b) a libp2p stream with
   Noise + yamux between two hosts on 127.0.0.1, as framed messages of CHUNK_MB each through the
   node's own framing, and prints MB/s of each and their ratio.
2. Request/response rates between the same two hosts, for a small request and for a 64 KiB one
   (a tiny model's activation): a new stream per request (what ``gwtf.node.p2p.rpc`` did before it
   kept streams open: the baseline) against ``RequestResponse`` on one stream per peer, one
   request at a time and eight at once; with the CPU seconds each request costs both ends.

Usage: python bench/p2p_throughput.py [--mb 64] [--requests 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from gwtf.node.p2p.framing import read_frame, write_frame
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits

PROTOCOL = TProtocol("/gwtf/bench-sink/1.0.0")
ECHO = "/gwtf/bench-echo/1.0.0"
CHUNK_BYTES = 4 << 20
LIMITS = RpcLimits(1 << 20, 1 << 20, 30.0)


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

    with tempfile.TemporaryDirectory():
        a_key = new_identity()
        b_key = new_identity()
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


async def _ack(_peer: str, request: bytes) -> bytes:
    return request[:32]  # an acknowledgement-sized reply


async def _new_stream_request(client: RequestResponse, server_id: ID, payload: bytes) -> None:
    """One request on a stream of its own: open, negotiate, write, read the reply, close."""
    stream = await client.host.new_stream(server_id, [TProtocol(ECHO + "-oneshot")])
    await write_frame(stream, payload, len(payload))
    await read_frame(stream, 1 << 10)
    await stream.close()


async def request_rates(requests: int) -> list[tuple[str, int, float, float]]:
    """(way, request bytes, requests/s, CPU ms per request) for each way and size."""

    async def oneshot_sink(stream) -> None:  # type: ignore[no-untyped-def]
        request = await read_frame(stream, 1 << 20)
        await write_frame(stream, request[:32], 1 << 10)
        await stream.close()

    rows = []
    with tempfile.TemporaryDirectory():
        a_key = new_identity()
        b_key = new_identity()
        async with running_host(a_key) as a, running_host(b_key) as b:
            server, client = RequestResponse(b), RequestResponse(a)
            server.serve(ECHO, _ack, LIMITS)
            b.set_stream_handler(TProtocol(ECHO + "-oneshot"), oneshot_sink)
            await a.connect(peer_info(full_address(b)))
            for size in (100, 64 << 10):
                payload = b"\x02" * size

                async def oneshot(payload: bytes = payload) -> None:
                    await _new_stream_request(client, b.get_id(), payload)

                async def reused(payload: bytes = payload) -> None:
                    await client.request(b.get_id(), ECHO, payload, LIMITS)

                for way, call, concurrent in (
                    ("new stream per request", oneshot, 1),
                    ("one stream, 1 in flight", reused, 1),
                    ("one stream, 8 in flight", reused, 8),
                ):
                    rate, cpu_ms = await _timed(call, requests, concurrent)
                    rows.append((way, size, rate, cpu_ms))
    return rows


async def _timed(call, requests: int, concurrent: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    for _ in range(5):
        await call()  # warm up: the stream, the peer's buffers
    each = requests // concurrent

    async def worker() -> None:
        for _ in range(each):
            await call()

    start, cpu = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrent):
            nursery.start_soon(worker)
    elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    done = each * concurrent
    return done / elapsed, 1000.0 * cpu_s / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="megabytes to send per transport")
    parser.add_argument("--requests", type=int, default=200, help="requests per row of table 2")
    args = parser.parse_args()
    total = args.mb * (1 << 20)
    tcp = trio.run(raw_tcp_mb_per_s, total)
    p2p = trio.run(libp2p_mb_per_s, total)
    print(f"{'transport':<28}{'MB/s':>10}{'ratio':>10}")
    print(f"{'raw TCP (trio)':<28}{tcp:>10.1f}{1.0:>10.2f}")
    print(f"{'libp2p Noise+yamux+framing':<28}{p2p:>10.1f}{p2p / tcp:>10.2f}")
    rows = trio.run(request_rates, args.requests)
    print(f"\n{'request/response':<28}{'bytes':>8}{'req/s':>10}{'cpu ms':>8}{'ratio':>8}")
    baseline = {size: rate for way, size, rate, _ in rows if way.startswith("new stream")}
    for way, size, rate, cpu_ms in rows:
        print(f"{way:<28}{size:>8}{rate:>10.1f}{cpu_ms:>8.2f}{rate / baseline[size]:>8.2f}")


if __name__ == "__main__":
    main()
