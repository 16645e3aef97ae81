"""Length-prefixed frames over a libp2p stream, bounded in size and time.

A frame is a 4-byte big-endian length followed by that many bytes. The reader enforces the bound
before allocating anything and reads in its own loop (py-libp2p's ``read_exactly`` gives up after
100 partial reads, which large activations reach).
"""

from __future__ import annotations

import struct
from typing import Protocol

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
