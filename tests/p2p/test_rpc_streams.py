"""Many requests on one kept-open stream per (peer, protocol), between real hosts on 127.0.0.1."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol

from gwtf.errors import ProtocolError
from gwtf.node.p2p.framing import FrameReader, encode_frame, read_frame, write_frame
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PeerTimeout, PeerUnavailable, PublicRate, RequestResponse, RpcLimits
from gwtf.node.p2p.scoring import Offence

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=1 << 20, max_response_bytes=1 << 20, timeout_s=30.0)


async def delayed_echo(_peer: str, request: bytes) -> bytes:
    """Answers after as many milliseconds as the request's first byte says: out of order."""
    await trio.sleep(request[0] / 1000.0)
    if request[1:2] == b"H":
        await trio.sleep_forever()
    return request[::-1]


@asynccontextmanager
async def host(tmp_path: Path, name: str) -> AsyncIterator[IHost]:
    async with running_host(new_identity()) as started:
        yield started


def test_many_concurrent_requests_share_one_stream_and_get_their_own_replies(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with host(tmp_path, "server") as server_host, host(tmp_path, "client") as client_host:
            RequestResponse(server_host).serve(ECHO, delayed_echo, LIMITS)
            client = RequestResponse(client_host)
            await client_host.connect(peer_info(full_address(server_host)))
            replies: dict[int, bytes] = {}

            async def ask(i: int) -> None:
                # Later requests answer sooner; a 64 KiB body makes the frames span many reads.
                request = bytes([(50 - i) % 50, i]) + bytes([i]) * (64 << 10 if i % 7 == 0 else 9)
                replies[i] = await client.request(server_host.get_id(), ECHO, request, LIMITS)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(50):
                        nursery.start_soon(ask, i)
            for i, reply in replies.items():
                request = bytes([(50 - i) % 50, i]) + bytes([i]) * (64 << 10 if i % 7 == 0 else 9)
                assert reply == request[::-1]
            assert len(replies) == 50
            assert client.streams_opened == 1

    trio.run(main)


def test_a_slow_request_does_not_hold_back_the_ones_behind_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with host(tmp_path, "server") as server_host, host(tmp_path, "client") as client_host:
            RequestResponse(server_host).serve(ECHO, delayed_echo, LIMITS)
            client = RequestResponse(client_host)
            await client_host.connect(peer_info(full_address(server_host)))
            target = server_host.get_id()
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    hung = RpcLimits(timeout_s=15.0)
                    nursery.start_soon(client.request, target, ECHO, b"\x00H", hung)
                    await trio.sleep(0.1)
                    # Answered while the first is still in the handler, on the same stream.
                    assert await client.request(target, ECHO, b"\x00ab", LIMITS) == b"ba\x00"
                    assert client.streams_opened == 1
                    nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_request_past_its_deadline_times_out_alone(tmp_path: Path) -> None:
    async def main() -> None:
        async with host(tmp_path, "server") as server_host, host(tmp_path, "client") as client_host:
            RequestResponse(server_host).serve(ECHO, delayed_echo, LIMITS)
            client = RequestResponse(client_host)
            await client_host.connect(peer_info(full_address(server_host)))
            target = server_host.get_id()
            with trio.fail_after(20):
                with pytest.raises(PeerTimeout):
                    # Answered after 0.2 s, but its deadline is 0.05 s: the late reply is dropped.
                    await client.request(target, ECHO, b"\xc8x", RpcLimits(timeout_s=0.05))
                await trio.sleep(0.3)
                assert await client.request(target, ECHO, b"\x00yz", LIMITS) == b"zy\x00"
            assert client.streams_opened == 1

    trio.run(main)


def test_a_peer_that_dies_mid_stream_fails_its_waiters_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with host(tmp_path, "client") as client_host:
            client = RequestResponse(client_host)
            failures: list[Exception] = []
            server_alive = trio.CancelScope()
            started = trio.Event()
            target: list[object] = []

            async def doomed_server() -> None:
                with server_alive:
                    async with host(tmp_path, "server") as server_host:
                        RequestResponse(server_host).serve(ECHO, delayed_echo, LIMITS)
                        await client_host.connect(peer_info(full_address(server_host)))
                        target.append(server_host.get_id())
                        started.set()
                        await trio.sleep_forever()

            async def waiting_request() -> None:
                try:
                    await client.request(target[0], ECHO, b"\x00H", LIMITS)  # type: ignore[arg-type]
                except PeerUnavailable as exc:
                    failures.append(exc)

            with trio.fail_after(20):  # the requests' own deadline is 30 s: it must not be that
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(doomed_server)
                    await started.wait()
                    for _ in range(5):
                        nursery.start_soon(waiting_request)
                    await trio.sleep(0.5)  # all five are in the server's handler now
                    server_alive.cancel()  # the server host goes away, connection and all
            assert len(failures) == 5
            assert not any(isinstance(exc, PeerTimeout) for exc in failures)
            assert client.streams_opened == 1

    trio.run(main)


async def _rogue_replies(stream: INetStream) -> None:
    """A server that answers each request with what the request asks for, framed by hand."""
    reader = FrameReader(stream)
    while (body := await reader.next_frame(1 << 20, 5.0)) is not None:
        request_id, command = body[:4], body[4:]
        if command == b"garbage":
            await stream.write(encode_frame(b"\x01", 16))  # shorter than a reply header
        elif command == b"big":
            await stream.write(encode_frame(request_id + b"\x00" + b"x" * 2048, 4096))
        else:
            await stream.write(encode_frame(request_id + b"\x00" + command[::-1], 4096))


def test_garbage_and_oversized_replies_are_scored_and_the_stream_reopened(tmp_path: Path) -> None:
    async def main() -> None:
        async with host(tmp_path, "server") as server_host, host(tmp_path, "client") as client_host:
            server_host.set_stream_handler(TProtocol(ECHO), _rogue_replies)
            client = RequestResponse(client_host)
            await client_host.connect(peer_info(full_address(server_host)))
            target, rogue = server_host.get_id(), str(server_host.get_id())
            small = RpcLimits(max_response_bytes=1024, timeout_s=10.0)
            with trio.fail_after(20):
                assert await client.request(target, ECHO, b"ok", LIMITS) == b"ko"
                # Within what the stream allows (1 MiB, above) but too large for this request:
                # that request fails, the stream stays.
                with pytest.raises(PeerUnavailable):
                    await client.request(target, ECHO, b"big", small)
                assert await client.request(target, ECHO, b"ab", small) == b"ba"
                assert client.streams_opened == 1
                # Not a reply frame at all: the stream is broken, and the next request reopens.
                with pytest.raises(PeerUnavailable):
                    await client.request(target, ECHO, b"garbage", small)
                assert await client.request(target, ECHO, b"again", small) == b"niaga"
                assert client.streams_opened == 2
            assert client.scores.offences[rogue] == [
                Offence.OVERSIZED_FRAME,
                Offence.MALFORMED_MESSAGE,
            ]

    trio.run(main)


def test_a_peer_that_stops_reading_replies_is_charged_and_cut_off(tmp_path: Path) -> None:
    big_reply = RpcLimits(max_request_bytes=64, max_response_bytes=4 << 20, timeout_s=1.0)

    async def flood(_peer: str, _request: bytes) -> bytes:
        return b"z" * (4 << 20)  # far beyond the stream's flow-control window

    async def main() -> None:
        async with host(tmp_path, "server") as server_host, host(tmp_path, "client") as client_host:
            server = RequestResponse(server_host)
            server.serve(ECHO, flood, big_reply)
            await client_host.connect(peer_info(full_address(server_host)))
            stream = await client_host.new_stream(server_host.get_id(), [TProtocol(ECHO)])
            await write_frame(stream, struct.pack(">I", 7) + b"gimme", 64)
            client = str(client_host.get_id())
            with trio.fail_after(20):
                while Offence.TIMEOUT not in server.scores.offences.get(client, []):
                    await trio.sleep(0.1)
                with pytest.raises(Exception):  # noqa: B017 - reset: any stream error is right
                    while True:
                        await read_frame(stream, 8 << 20)

    trio.run(main)


def test_a_refusal_reaches_the_sender_even_where_answers_are_tiny(tmp_path: Path) -> None:
    # A verdict protocol answers in a few bytes, but a refusal carries its reason; the reason
    # must neither break the stream nor be charged to anyone.
    verdicts = RpcLimits(max_request_bytes=64, max_response_bytes=2, timeout_s=10.0)

    async def strict(_peer: str, request: bytes) -> bytes:
        if request != b"ok":
            raise ProtocolError("this request is not one this protocol knows; send ok")
        return b"y"

    async def main() -> None:
        async with host(tmp_path, "server") as server_host, host(tmp_path, "client") as client_host:
            server = RequestResponse(server_host)
            server.serve(ECHO, strict, verdicts)
            client = RequestResponse(client_host)
            await client_host.connect(peer_info(full_address(server_host)))
            target = server_host.get_id()
            with trio.fail_after(20):
                with pytest.raises(PeerUnavailable, match="not one this protocol knows"):
                    await client.request(target, ECHO, b"bad", verdicts)
                assert await client.request(target, ECHO, b"ok", verdicts) == b"y"
            assert client.streams_opened == 1
            assert client.scores.score(str(target), trio.current_time()) == 0

    trio.run(main)


def test_outsiders_streams_are_capped_and_closed_when_idle(tmp_path: Path) -> None:
    """Peers outside the run share a cap on open streams, and an idle one is closed, so that
    keeping streams open costs an outsider nothing but the server no task either."""

    async def refuse(_peer: str) -> bool:
        return False

    async def main() -> None:
        public = PublicRate(max_streams=1, idle_s=0.5)
        async with (
            host(tmp_path, "server") as server_host,
            host(tmp_path, "first") as first_host,
            host(tmp_path, "second") as second_host,
        ):
            RequestResponse(server_host, admit=refuse).serve(ECHO, delayed_echo, LIMITS, public)
            first, second = RequestResponse(first_host), RequestResponse(second_host)
            for client in (first_host, second_host):
                await client.connect(peer_info(full_address(server_host)))
            with trio.fail_after(20):
                assert await first.request(server_host.get_id(), ECHO, b"\0ab", LIMITS) == b"ba\0"
                assert public.streams == 1, "the first outsider's stream stays open"
                with pytest.raises(PeerUnavailable):
                    await second.request(server_host.get_id(), ECHO, b"\0cd", LIMITS)
                while public.streams:  # the idle stream is closed by the server
                    await trio.sleep(0.05)
                assert await second.request(server_host.get_id(), ECHO, b"\0cd", LIMITS) == b"dc\0"

    trio.run(main)


def test_a_seated_peer_has_its_own_rate_and_streams_beside_the_outsiders(
    tmp_path: Path,
) -> None:
    """A peer the ``Seats`` hold (a seated juror, read from the chain in the node) is answered
    when the outsiders have spent their shared rate and filled their streams, within a rate of
    its own: it cannot flood either."""

    async def refuse(_peer: str) -> bool:
        return False

    async def main() -> None:
        async with (
            host(tmp_path, "server") as server_host,
            host(tmp_path, "outsider") as outsider_host,
            host(tmp_path, "juror") as juror_host,
        ):
            juror_id = str(juror_host.get_id())

            class Held:
                async def holds(self, peer: str) -> bool:
                    return peer == juror_id

            public = PublicRate(
                per_s=1e-3, burst=1.0, max_streams=1, seats=Held(), seat_per_s=1e-3,
                seat_burst=2.0,
            )  # fmt: skip
            RequestResponse(server_host, admit=refuse).serve(ECHO, delayed_echo, LIMITS, public)
            outsider, juror = RequestResponse(outsider_host), RequestResponse(juror_host)
            for client in (outsider_host, juror_host):
                await client.connect(peer_info(full_address(server_host)))
            target = server_host.get_id()
            with trio.fail_after(20):
                assert await outsider.request(target, ECHO, b"\0ab", LIMITS) == b"ba\0"
                with pytest.raises(PeerUnavailable, match="busy: peers outside the run"):
                    await outsider.request(target, ECHO, b"\0ab", LIMITS)
                assert public.streams == 1  # the outsiders' one stream is taken
                for _ in range(2):
                    assert await juror.request(target, ECHO, b"\0cd", LIMITS) == b"dc\0"
                with pytest.raises(PeerUnavailable, match="busy: a seated juror"):
                    await juror.request(target, ECHO, b"\0cd", LIMITS)
                assert public.streams == 1, "the juror's stream is not an outsider's"

    trio.run(main)
