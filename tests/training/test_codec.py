"""The tensor wire codec: exact round trips, zero-copy decoding, bounds, and a decoder that meets
arbitrary bytes with nothing but TensorCodecError."""

from __future__ import annotations

import contextlib
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.node.training.codec import (
    DTYPE_CODES,
    FIXED_HEADER_BYTES,
    CodecLimits,
    decode,
    encode,
    encode_frames,
)
from gwtf.node.training.errors import TensorCodecError

LIMITS = CodecLimits(max_bytes=1 << 20, max_ndim=4)


@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
def test_round_trip_is_exact_for_every_dtype(dtype: torch.dtype) -> None:
    source = (torch.randn(3, 5, 7, dtype=torch.float64) * 100).to(dtype)
    decoded = decode(bytearray(encode(42, source, LIMITS)), LIMITS)
    assert decoded.microbatch_id == 42
    assert decoded.tensor.dtype == dtype
    assert torch.equal(decoded.tensor, source)


def test_bf16_bits_survive_exactly() -> None:
    source = torch.randn(64, dtype=torch.float32).to(torch.bfloat16)
    decoded = decode(encode(1, source, LIMITS), LIMITS).tensor
    assert torch.equal(decoded.view(torch.int16), source.view(torch.int16))


def test_non_contiguous_and_scalar_and_empty_tensors_round_trip() -> None:
    transposed = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    for source in (transposed, torch.tensor(2.5), torch.empty(0, 4)):
        decoded = decode(encode(7, source, LIMITS), LIMITS).tensor
        assert decoded.shape == source.shape
        assert torch.equal(decoded, source)


def test_decode_of_a_writable_buffer_shares_its_memory() -> None:
    frame = bytearray(encode(3, torch.zeros(4, dtype=torch.float32), LIMITS))
    tensor = decode(frame, LIMITS).tensor
    struct.pack_into("<f", frame, FIXED_HEADER_BYTES + 8, 9.5)  # shape takes 8 bytes (ndim 1)
    assert tensor.tolist() == [9.5, 0.0, 0.0, 0.0]


def test_encode_frames_views_the_tensor_without_copying() -> None:
    source = torch.zeros(8, dtype=torch.float64)
    header, payload = encode_frames(0, source, LIMITS)
    source[0] = 1.0
    assert struct.unpack_from("<d", payload)[0] == 1.0
    assert len(header) == FIXED_HEADER_BYTES + 8


def test_header_is_small_and_payload_aligned() -> None:
    header, _ = encode_frames(0, torch.zeros(2, 3, 4), LIMITS)
    assert len(header) == 24 + 3 * 8
    assert len(header) % 8 == 0


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (torch.zeros(1 << 19, dtype=torch.float32), "limit"),  # 2 MiB > 1 MiB
        (torch.zeros(1, 1, 1, 1, 1), "dims"),
        (torch.zeros(2, dtype=torch.complex64), "wire code"),
    ],
)
def test_encode_refuses_what_a_peer_may_not_send(tensor: torch.Tensor, message: str) -> None:
    with pytest.raises(TensorCodecError, match=message):
        encode(0, tensor, LIMITS)


def test_decode_checks_expected_dtype_and_shape() -> None:
    frame = encode(5, torch.zeros(2, 3, dtype=torch.float32), LIMITS)
    assert decode(frame, LIMITS, torch.float32, (2, 3)).tensor.shape == (2, 3)
    with pytest.raises(TensorCodecError, match=r"expected a torch\.float64"):
        decode(frame, LIMITS, expect_dtype=torch.float64)
    with pytest.raises(TensorCodecError, match="shape"):
        decode(frame, LIMITS, expect_shape=(3, 2))


def test_decode_rejects_truncated_padded_and_lying_frames() -> None:
    frame = encode(5, torch.ones(2, 3, dtype=torch.float32), LIMITS)
    with pytest.raises(TensorCodecError):
        decode(frame[:-1], LIMITS)
    with pytest.raises(TensorCodecError):
        decode(frame + b"\0", LIMITS)
    lying = bytearray(frame)
    struct.pack_into("<Q", lying, FIXED_HEADER_BYTES, 3)  # first dim 3 instead of 2
    with pytest.raises(TensorCodecError, match="payload"):
        decode(lying, LIMITS)
    huge = bytearray(frame)
    struct.pack_into("<QQ", huge, FIXED_HEADER_BYTES, 2**40, 2**40)
    with pytest.raises(TensorCodecError, match="limit"):
        decode(huge, LIMITS)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_ever_raise_codec_errors(junk: bytes) -> None:
    with contextlib.suppress(TensorCodecError):
        decode(junk, LIMITS)


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(min_value=0, max_value=FIXED_HEADER_BYTES + 16 + 23),
    value=st.integers(min_value=0, max_value=255),
    cut=st.integers(min_value=0, max_value=64),
)
def test_mutated_valid_frames_decode_or_raise_codec_errors(
    position: int, value: int, cut: int
) -> None:
    frame = bytearray(encode(9, torch.arange(6, dtype=torch.float32).reshape(2, 3), LIMITS))
    frame[position % len(frame)] = value
    try:
        decoded = decode(bytes(frame[: len(frame) - cut]), LIMITS)
    except TensorCodecError:
        return
    assert decoded.tensor.numel() * decoded.tensor.element_size() <= LIMITS.max_bytes
