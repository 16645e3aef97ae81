"""The hop header's codec (``gwtf/node/runtime/dataplane/hop.py``): round trips, and bad bytes raise
only ``HopFormatError``."""

from __future__ import annotations

import contextlib

import pytest
from eth_utils.crypto import keccak
from hypothesis import given
from hypothesis import strategies as st

from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.runtime.dataplane.hop import (
    BACKWARD,
    FLAG_LENT,
    FLAG_RECEIPTED,
    FLAG_REPAIR,
    FLAG_TRIED,
    FORWARD,
    HopFormatError,
    HopHeader,
    ReceiptInput,
    decode_hop,
    decode_hop_request,
    encode_hop,
)

DATA_B = str(peer_id_of(identity_from_key(keccak(text="hop codec test data-b"))))
FIRST_HOP = HopHeader(7, 3, 41, 256, FORWARD, 1, 2, 0, DATA_B, (DATA_B,))
FLAGS_AT = 41  # the flags byte, after the fixed fields before it
RECEIPTED = ReceiptInput(bytes(range(32)))
TRIED = FIRST_HOP.onward(try_start=256, try_signature=bytes(range(1, 66)))


@pytest.mark.parametrize(
    "header",
    [
        FIRST_HOP,
        FIRST_HOP.onward(lender="data-a"),  # on a flow data-a lent to data-b
        FIRST_HOP.onward(flags=FLAG_REPAIR, lender="data-a"),
        FIRST_HOP.onward(epoch=2**40),
        TRIED,
        TRIED.onward(lender="data-a", attempt=300),
        HopHeader(7, 3, 41, 257, BACKWARD, 0, 0, 0, DATA_B, (DATA_B, "r1", "r2", DATA_B)),
    ],
)
def test_a_header_and_its_frame_round_trip(header: HopHeader) -> None:
    assert decode_hop(encode_hop(header, b"frame")) == (header, b"frame")


def test_the_lent_flag_follows_the_lender_and_is_not_kept_as_a_flag() -> None:
    lent = encode_hop(FIRST_HOP.onward(lender="data-a"), b"")
    own = encode_hop(FIRST_HOP.onward(flags=FLAG_LENT), b"")  # a flag without a lender: dropped
    assert decode_hop(own)[0] == FIRST_HOP
    assert decode_hop(lent)[0].flags == 0 and len(lent) == len(own) + 1 + len("data-a")


def test_a_lent_flag_without_its_lender_is_malformed() -> None:
    data = bytearray(encode_hop(FIRST_HOP, b""))
    data[FLAGS_AT] |= FLAG_LENT
    with pytest.raises(HopFormatError):
        decode_hop(bytes(data))


def test_a_receipts_input_digest_travels_after_the_header_before_the_frame_unsigned() -> None:
    header = FIRST_HOP.onward(lender="data-a", epoch=3)
    data = encode_hop(header, b"frame", RECEIPTED)
    assert decode_hop_request(data) == (header, RECEIPTED, b"frame")
    assert decode_hop_request(encode_hop(header, b"frame")) == (header, None, b"frame")
    assert len(data) == len(encode_hop(header, b"frame")) + 32  # no signature: batches sign


def test_a_receipted_flag_without_its_digest_is_malformed() -> None:
    data = bytearray(encode_hop(FIRST_HOP, b""))
    data[FLAGS_AT] |= FLAG_RECEIPTED
    with pytest.raises(HopFormatError):
        decode_hop_request(bytes(data))
    with pytest.raises(HopFormatError):
        encode_hop(FIRST_HOP, b"", ReceiptInput(b"short"))
    cut = encode_hop(FIRST_HOP, b"", RECEIPTED)[:-1]  # one byte short of its digest
    with pytest.raises(HopFormatError):
        decode_hop_request(cut)


def test_a_try_token_travels_after_the_lender_before_the_receipt() -> None:
    header = TRIED.onward(lender="data-a")
    data = encode_hop(header, b"frame", RECEIPTED)
    assert decode_hop_request(data) == (header, RECEIPTED, b"frame")
    assert len(data) == len(encode_hop(header.onward(try_signature=b""), b"frame", RECEIPTED)) + 67


def test_a_tried_flag_without_its_token_or_a_bad_token_is_malformed() -> None:
    data = bytearray(encode_hop(FIRST_HOP, b""))
    data[FLAGS_AT] |= FLAG_TRIED
    with pytest.raises(HopFormatError, match="inside its try token"):
        decode_hop(bytes(data))
    assert decode_hop(encode_hop(FIRST_HOP.onward(flags=FLAG_TRIED), b""))[0] == FIRST_HOP
    for bad in (TRIED.onward(try_signature=b"short"), TRIED.onward(try_start=1 << 16)):
        with pytest.raises(HopFormatError, match="try token"):
            encode_hop(bad, b"")


def test_an_origin_that_is_no_peer_id_is_a_format_error() -> None:
    with pytest.raises(HopFormatError, match="origin is not a peer id"):
        decode_hop(encode_hop(FIRST_HOP.onward(origin="data-0OIl"), b""))


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_a_format_error(data: bytes) -> None:
    with contextlib.suppress(HopFormatError):  # anything else fails the test
        decode_hop(data)


@given(st.integers(min_value=0, max_value=160))
def test_truncated_headers_raise_only_a_format_error(cut: int) -> None:
    data = encode_hop(TRIED.onward(lender="data-a"), b"")
    if cut >= len(data):
        return
    with pytest.raises(HopFormatError):
        decode_hop(data[:cut])
