"""FrameReader over a scripted stream: frames split across reads, many per read, cancelled reads.

The scripted stream stands in for a libp2p stream only in what ``read`` returns; the same reader
runs on real hosts in ``test_rpc_streams.py``.
"""

from __future__ import annotations

import pytest
import trio

from gwtf.node.p2p.framing import FrameError, FrameReader, encode_frame


class ScriptedStream:
    """Returns the scripted chunks, one per read; waits forever when the script runs out."""

    def __init__(self, chunks: list[bytes], then_eof: bool = True) -> None:
        self.chunks = chunks
        self.then_eof = then_eof
        self.reads = 0

    async def read(self, n: int | None = None) -> bytes:
        await trio.sleep(0)
        self.reads += 1
        if self.chunks:
            return self.chunks.pop(0)
        if self.then_eof:
            return b""
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def write(self, data: bytes) -> None:
        raise AssertionError("the reader never writes")


def frames(*payloads: bytes) -> bytes:
    return b"".join(encode_frame(p, 1 << 20) for p in payloads)


def read_all(stream: ScriptedStream, max_bytes: int = 1 << 20) -> list[bytes | None]:
    async def main() -> list[bytes | None]:
        reader = FrameReader(stream)
        out: list[bytes | None] = []
        while True:
            frame = await reader.next_frame(max_bytes, 5.0)
            out.append(frame)
            if frame is None:
                return out

    return trio.run(main)


def test_many_frames_in_one_read_come_out_one_by_one() -> None:
    stream = ScriptedStream([frames(b"a", b"", b"bcd")])
    assert read_all(stream) == [b"a", b"", b"bcd", None]
    assert stream.reads == 2  # one read for all three, one that sees the end


def test_frames_split_anywhere_are_joined() -> None:
    data = frames(b"hello", b"world" * 100)
    chunks = [data[i : i + 3] for i in range(0, len(data), 3)]
    assert read_all(ScriptedStream(chunks)) == [b"hello", b"world" * 100, None]


def test_oversized_and_truncated_frames_are_refused() -> None:
    with pytest.raises(FrameError, match="over the limit"):
        read_all(ScriptedStream([frames(b"x" * 100)]), max_bytes=99)
    with pytest.raises(FrameError, match="unread"):
        read_all(ScriptedStream([frames(b"x" * 100)[:50]]))


def test_a_stalled_frame_times_out_and_an_idle_stream_does_not() -> None:
    async def main() -> None:
        stalled = FrameReader(ScriptedStream([frames(b"x" * 10)[:6]], then_eof=False))
        with pytest.raises(trio.TooSlowError):
            await stalled.next_frame(1 << 20, 0.05)
        idle = FrameReader(ScriptedStream([], then_eof=False))
        with trio.move_on_after(0.2) as waited:
            await idle.next_frame(1 << 20, 0.05)  # no deadline before a frame begins
        assert waited.cancelled_caught

    trio.run(main)


def test_a_cancelled_read_loses_nothing() -> None:
    async def main() -> None:
        data = frames(b"first", b"second")
        stream = ScriptedStream([data[:7]], then_eof=False)
        reader = FrameReader(stream)
        with trio.move_on_after(0.05):
            await reader.next_frame(1 << 20, 5.0)  # cancelled with part of a frame buffered
        stream.chunks.append(data[7:])
        stream.then_eof = True
        assert await reader.next_frame(1 << 20, 5.0) == b"first"
        assert await reader.next_frame(1 << 20, 5.0) == b"second"
        assert await reader.next_frame(1 << 20, 5.0) is None

    trio.run(main)
