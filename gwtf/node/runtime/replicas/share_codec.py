"""Wire encoding of gradient shares: a replica id, a microbatch count and named tensors.

    shares   = count u16 | share*
    share    = id_len u16 | id utf-8 | microbatch_count u32 | n_tensors u16 | tensor*
    tensor   = name_len u16 | name utf-8 | frame_len u64 | tensor frame (gwtf.node.training.codec)

    average  = count u16 | (id_len u16 | id utf-8)* | shares (exactly one: the combined share)

An ``average`` is a gatherer's answer: the replicas whose shares it combined, and their
combination (gradient sums added in replica-id order, microbatch counts added).

Everything is bounded: ids and names at most 256 bytes, the whole message at most the codec
limit, and every tensor frame is checked by the tensor codec. Bad bytes raise ``TensorCodecError``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from gwtf.node.training import codec
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.errors import TensorCodecError
from gwtf.node.training.trainer import GradientShare

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
MAX_NAME_BYTES = 256
MAX_SHARES = 64
MAX_TENSORS = 4096


def _text(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > MAX_NAME_BYTES:
        raise TensorCodecError(f"name {value[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")
    return _U16.pack(len(raw)) + raw


def encode_shares(shares: Sequence[GradientShare], limits: CodecLimits) -> bytes:
    parts = [_U16.pack(len(shares))]
    for share in shares:
        parts += [_text(share.replica_id), _U32.pack(share.microbatch_count)]
        parts.append(_U16.pack(len(share.gradients)))
        for name in sorted(share.gradients):
            frame = codec.encode(0, share.gradients[name], limits)
            parts += [_text(name), _U64.pack(len(frame)), frame]
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes, limits: CodecLimits) -> None:
        if len(data) > limits.max_bytes:
            raise TensorCodecError(f"gradient message of {len(data)} bytes is over the limit")
        self.data = memoryview(data)
        self.pos = 0
        self.limits = limits

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise TensorCodecError("gradient message is truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def number(self, fmt: struct.Struct) -> int:
        value: int = fmt.unpack(self.take(fmt.size))[0]
        return value

    def text(self) -> str:
        length = self.number(_U16)
        if length > MAX_NAME_BYTES:
            raise TensorCodecError(f"name of {length} bytes in a gradient message")
        try:
            return bytes(self.take(length)).decode()
        except UnicodeDecodeError as exc:
            raise TensorCodecError("a name in a gradient message is not UTF-8") from exc


def encode_average(
    contributors: Sequence[str], combined: GradientShare, limits: CodecLimits
) -> bytes:
    if len(contributors) > MAX_SHARES:
        raise TensorCodecError(f"{len(contributors)} contributors, limit {MAX_SHARES}")
    ids = b"".join(_text(replica_id) for replica_id in contributors)
    return _U16.pack(len(contributors)) + ids + encode_shares([combined], limits)


def decode_average(data: bytes, limits: CodecLimits) -> tuple[tuple[str, ...], GradientShare]:
    """The contributors and the combined share of a gatherer's answer."""
    reader = _Reader(data, limits)
    count = reader.number(_U16)
    if count > MAX_SHARES:
        raise TensorCodecError(f"{count} contributors in one average, limit {MAX_SHARES}")
    contributors = tuple(reader.text() for _ in range(count))
    if len(set(contributors)) != len(contributors):
        raise TensorCodecError("an average names a contributor twice")
    shares = _read_shares(reader)
    if len(shares) != 1:
        raise TensorCodecError(f"an average carries {len(shares)} shares instead of one")
    return contributors, shares[0]


def decode_shares(data: bytes, limits: CodecLimits) -> list[GradientShare]:
    return _read_shares(_Reader(data, limits))


def _read_shares(reader: _Reader) -> list[GradientShare]:
    limits = reader.limits
    count = reader.number(_U16)
    if count > MAX_SHARES:
        raise TensorCodecError(f"{count} gradient shares in one message, limit {MAX_SHARES}")
    shares = []
    for _ in range(count):
        replica_id = reader.text()
        microbatch_count = reader.number(_U32)
        n_tensors = reader.number(_U16)
        if n_tensors > MAX_TENSORS:
            raise TensorCodecError(f"{n_tensors} tensors in one share, limit {MAX_TENSORS}")
        gradients = {}
        for _ in range(n_tensors):
            name = reader.text()
            frame = reader.take(reader.number(_U64))
            gradients[name] = codec.decode(bytes(frame), limits).tensor
        shares.append(GradientShare(replica_id, microbatch_count, gradients))
    if reader.pos != len(reader.data):
        raise TensorCodecError("trailing bytes after the gradient shares")
    return shares
