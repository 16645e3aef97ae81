"""Length-prefixed frames over a libp2p stream, bounded in size and time.

A frame is a 4-byte big-endian length followed by that many bytes. The reader enforces the bound
before allocating anything and reads in its own loop (py-libp2p's ``read_exactly`` gives up after
100 partial reads, which large activations reach). ``FrameReader`` reads a stream that carries
many frames: it takes whatever the stream holds in one read (each read of a py-libp2p yamux
stream costs a window update on the wire, so fewer, larger reads are cheaper) and keeps the rest
for the next frame; it loses nothing when a read is cancelled.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

import trio

from gwtf.errors import ProtocolError

_LENGTH = struct.Struct(">I")


class FrameError(ProtocolError):
    """A peer sent a frame that is too large, truncated or otherwise malformed."""


class ByteStream(Protocol):
    """What framing needs of a stream (a libp2p ``INetStream`` satisfies it)."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


def encode_frame(payload: bytes, max_bytes: int) -> bytes:
    """Prefix ``payload`` with its length; refuse to send what the peer would refuse to read."""
    if len(payload) > max_bytes:
        raise FrameError(f"frame of {len(payload)} bytes exceeds the limit of {max_bytes} bytes")
    return _LENGTH.pack(len(payload)) + payload


async def write_frame(stream: ByteStream, payload: bytes, max_bytes: int) -> None:
    await stream.write(encode_frame(payload, max_bytes))


async def read_exact(stream: ByteStream, n: int) -> bytes:
    """Read exactly ``n`` bytes or raise ``FrameError`` if the peer closes first."""
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        try:
            chunk = await stream.read(remaining)
        except EOFError:  # libp2p's StreamEOF: the peer closed its side mid-frame
            chunk = b""
        if not chunk:
            raise FrameError(f"peer closed the stream with {remaining} of {n} bytes unread")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def read_frame(stream: ByteStream, max_bytes: int) -> bytes:
    """Read one frame; a declared length over ``max_bytes`` is refused before reading the body."""
    (length,) = _LENGTH.unpack(await read_exact(stream, _LENGTH.size))
    if length > max_bytes:
        raise FrameError(f"peer announced a frame of {length} bytes, over the limit of {max_bytes}")
    return await read_exact(stream, length) if length else b""


class FrameReader:
    """Reads consecutive frames from one stream through a buffer."""

    def __init__(self, stream: ByteStream, read_bytes: int = 1 << 16) -> None:
        self._stream = stream
        self._read_bytes = read_bytes
        self._buffer = bytearray()

    async def _fill(self, wanted: int) -> bool:
        """Append one read of at least what is wanted; False when the peer closed its side."""
        try:
            chunk = await self._stream.read(max(self._read_bytes, wanted))
        except EOFError:  # libp2p's StreamEOF
            chunk = b""
        if not chunk:
            return False
        self._buffer += chunk  # no checkpoint between the read and here: cancel-safe
        return True

    def has_data(self) -> bool:
        """Whether bytes of a frame are buffered."""
        return bool(self._buffer)

    async def wait_for_data(self) -> bool:
        """Wait (with no deadline) until a frame begins; False if the peer closed instead."""
        return bool(self._buffer) or await self._fill(_LENGTH.size)

    async def next_frame(
        self,
        max_bytes: int,
        body_timeout_s: float,
        stretch_s: Callable[[int], AbstractContextManager[float]] | None = None,
    ) -> bytes | None:
        """The next frame, or None if the peer closed the stream between frames.

        Waiting for a frame to begin has no deadline (an idle stream is normal); once it has
        begun, the rest must come within ``body_timeout_s`` (``trio.TooSlowError`` otherwise),
        plus what ``stretch_s(length)`` yields once its length is read (a slow link's time for
        its size), held until the frame is in.
        """
        if not await self.wait_for_data():
            return None
        with trio.fail_after(body_timeout_s) as scope, ExitStack() as held:
            while len(self._buffer) < _LENGTH.size:
                if not await self._fill(_LENGTH.size - len(self._buffer)):
                    raise FrameError("peer closed the stream in the middle of a frame length")
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > max_bytes:
                raise FrameError(
                    f"peer announced a frame of {length} bytes, over the limit of {max_bytes}"
                )
            if stretch_s is not None:
                scope.deadline += held.enter_context(stretch_s(length))
            end = _LENGTH.size + length
            while len(self._buffer) < end:
                if not await self._fill(end - len(self._buffer)):
                    raise FrameError(
                        f"peer closed the stream with {end - len(self._buffer)} of {length} "
                        "bytes unread"
                    )
        frame = bytes(self._buffer[_LENGTH.size : end])
        del self._buffer[:end]
        return frame
