"""The wire format of a tensor (an activation or a gradient) between nodes.

Frame = header + raw little-endian bytes of the tensor in C order; no pickle, so a peer can send
nothing but numbers. The header is fixed-size except for the shape and keeps the payload 8-byte
aligned, so decoding is zero-copy (``torch.frombuffer``) for every dtype:

    offset  size  field
    0       4     magic b"GWTT"
    4       1     version (1)
    5       1     dtype code (DTYPE_CODES)
    6       1     ndim
    7       1     reserved, 0
    8       8     microbatch id (u64)
    16      8     payload length in bytes (u64)
    24      8*n   shape, one u64 per dimension
    24+8n   ...   payload

Encoding hands out a memoryview of the tensor's own memory (through a uint8 view, which also
covers bf16, a dtype numpy lacks); ``bytes(t.untyped_storage())`` is ~1,000x slower.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch

from gwtf.node.training.errors import TensorCodecError
from gwtf.node.training.settings import TrainingSettings

MAGIC = b"GWTT"
VERSION = 1
_FIXED = struct.Struct("<4sBBBBQQ")
_DIM = struct.Struct("<Q")
FIXED_HEADER_BYTES = _FIXED.size  # 24

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float64: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
    torch.int64: 5,
    torch.int32: 6,
    torch.uint8: 7,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
_MAX_U64 = 2**64 - 1


@dataclass(frozen=True)
class CodecLimits:
    """Bounds on what a peer may send; everything beyond them is refused before allocation."""

    max_bytes: int = 256 * 1024 * 1024
    max_ndim: int = 8

    @classmethod
    def from_settings(cls, settings: TrainingSettings) -> CodecLimits:
        return cls(settings.codec_max_bytes, settings.codec_max_ndim)


@dataclass(frozen=True)
class DecodedTensor:
    microbatch_id: int
    tensor: torch.Tensor


def header_bytes(ndim: int) -> int:
    return FIXED_HEADER_BYTES + _DIM.size * ndim


def encode_frames(
    microbatch_id: int, tensor: torch.Tensor, limits: CodecLimits
) -> tuple[bytes, memoryview]:
    """Header and payload as two buffers (for a vectored write); the payload is a view of the
    tensor's memory, no copy unless the tensor is not contiguous."""
    if tensor.device.type != "cpu":
        raise TensorCodecError(f"cannot encode a tensor on {tensor.device}; move it to the host")
    code = DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise TensorCodecError(f"dtype {tensor.dtype} has no wire code; use one of DTYPE_CODES")
    if not 0 <= microbatch_id <= _MAX_U64:
        raise TensorCodecError(f"microbatch id {microbatch_id} does not fit in 64 bits")
    if tensor.dim() > limits.max_ndim:
        raise TensorCodecError(f"tensor has {tensor.dim()} dims, limit is {limits.max_ndim}")
    payload_bytes = tensor.numel() * tensor.element_size()
    if payload_bytes > limits.max_bytes:
        raise TensorCodecError(
            f"tensor of {payload_bytes} bytes exceeds the {limits.max_bytes}-byte limit"
        )
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    payload = flat.numpy().data
    header = _FIXED.pack(MAGIC, VERSION, code, tensor.dim(), 0, microbatch_id, payload_bytes)
    header += b"".join(_DIM.pack(size) for size in tensor.shape)
    return header, payload


def encode(microbatch_id: int, tensor: torch.Tensor, limits: CodecLimits) -> bytes:
    """One frame as a single bytes object (one copy of the payload)."""
    header, payload = encode_frames(microbatch_id, tensor, limits)
    return b"".join((header, payload))


def decode(
    frame: bytes | bytearray | memoryview,
    limits: CodecLimits,
    expect_dtype: torch.dtype | None = None,
    expect_shape: tuple[int, ...] | None = None,
) -> DecodedTensor:
    """Parse and check one frame. Zero-copy for a writable buffer (the tensor then shares its
    memory); a read-only one such as ``bytes`` is copied once, since torch tensors are writable."""
    try:
        view = memoryview(frame).cast("B")
    except (TypeError, ValueError) as exc:
        raise TensorCodecError("tensor frame must be a contiguous byte buffer") from exc
    if len(view) < FIXED_HEADER_BYTES:
        raise TensorCodecError(f"frame of {len(view)} bytes is shorter than a tensor header")
    magic, version, code, ndim, reserved, microbatch_id, payload_bytes = _FIXED.unpack_from(view)
    if magic != MAGIC or reserved != 0:
        raise TensorCodecError("frame does not start with a GWTF tensor header")
    if version != VERSION:
        raise TensorCodecError(f"tensor frame version {version} is not supported (want {VERSION})")
    dtype = CODE_DTYPES.get(code)
    if dtype is None:
        raise TensorCodecError(f"unknown dtype code {code} in tensor frame")
    if ndim > limits.max_ndim:
        raise TensorCodecError(f"tensor frame has {ndim} dims, limit is {limits.max_ndim}")
    offset = header_bytes(ndim)
    if len(view) < offset:
        raise TensorCodecError("tensor frame ends inside its shape")
    shape = tuple(
        _DIM.unpack_from(view, FIXED_HEADER_BYTES + _DIM.size * i)[0] for i in range(ndim)
    )
    if any(size > limits.max_bytes for size in shape):
        raise TensorCodecError(f"tensor frame shape {shape} exceeds the size limit")
    element_size = torch.empty((), dtype=dtype).element_size()
    expected_bytes = math.prod(shape) * element_size
    if expected_bytes > limits.max_bytes:
        raise TensorCodecError(
            f"tensor frame of shape {shape} exceeds the {limits.max_bytes}-byte limit"
        )
    if payload_bytes != expected_bytes or len(view) - offset != payload_bytes:
        raise TensorCodecError(
            f"tensor frame payload is {len(view) - offset} bytes, header says {payload_bytes}, "
            f"shape {shape} of {dtype} needs {expected_bytes}"
        )
    if expect_dtype is not None and dtype != expect_dtype:
        raise TensorCodecError(f"expected a {expect_dtype} tensor, peer sent {dtype}")
    if expect_shape is not None and shape != tuple(expect_shape):
        raise TensorCodecError(f"expected a tensor of shape {expect_shape}, peer sent {shape}")
    if expected_bytes == 0:
        return DecodedTensor(microbatch_id, torch.empty(shape, dtype=dtype))
    if view.readonly:
        view = memoryview(bytearray(view))
    tensor = torch.frombuffer(
        view, dtype=dtype, count=expected_bytes // element_size, offset=offset
    )
    return DecodedTensor(microbatch_id, tensor.reshape(shape))
