"""Cards and hints: what is accepted from the network, and every way a bad one is refused."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from gwtf.errors import ConfigError, ProtocolError
from gwtf.node.p2p.dht import CardValidator
from gwtf.node.p2p.discovery_records import (
    MAX_CARD_BYTES,
    Hint,
    PeerCard,
    card_key,
    decode_hint,
    encode_hint,
    newest_card_index,
    open_card,
    run_key,
    sign_card,
    stage_key,
)


def _keys(seed: int) -> KeyPair:
    return create_new_key_pair(bytes([seed]) * 32)


def _card(keys: KeyPair, run_id: int = 1, stage: int = 2, issued_ms: int = 1000) -> PeerCard:
    peer = str(ID.from_pubkey(keys.public_key))
    address = f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}"
    return PeerCard(peer, run_id, stage, "relay", "tokyo", address, issued_ms)


def test_a_signed_card_opens_to_itself() -> None:
    keys = _keys(1)
    card = _card(keys)
    assert open_card(card_key(card.peer_id), sign_card(card, keys.private_key)) == card


def test_a_card_carries_the_nodes_last_reachability_verdict() -> None:
    keys = _keys(1)
    for reachable in (True, False):
        card = replace(_card(keys), reachable=reachable, reach_checked_ms=1_700_000_000_000)
        value = sign_card(card, keys.private_key)
        assert open_card(card_key(card.peer_id), value) == card
        assert len(value) <= MAX_CARD_BYTES
    assert b"reach" not in sign_card(_card(keys), keys.private_key)  # not checked yet


@pytest.mark.parametrize(
    "fields", [{"reach": 1, "reach_ms": 5}, {"reach": True}, {"reach_ms": 5}, {"reach": "yes"}]
)
def test_a_malformed_reachability_verdict_is_refused(fields: dict[str, object]) -> None:
    keys = _keys(1)
    good = sign_card(_card(keys), keys.private_key)
    payload = {**json.loads(good[2 : 2 + struct.unpack(">H", good[:2])[0]]), **fields}
    raw = json.dumps(payload).encode()
    value = struct.pack(">H", len(raw)) + raw + keys.private_key.sign(b"gwtf/card/1\x00" + raw)
    with pytest.raises(ProtocolError, match="reach"):
        open_card(card_key(_card(keys).peer_id), value)


def test_a_card_says_whether_its_node_relays_for_others() -> None:
    keys = _keys(1)
    card = replace(_card(keys), reachable=True, reach_checked_ms=5, relays=True)
    value = sign_card(card, keys.private_key)
    assert open_card(card_key(card.peer_id), value) == card
    assert len(value) <= MAX_CARD_BYTES
    assert b'"relay":' not in sign_card(_card(keys), keys.private_key)  # absent when it does not


@pytest.mark.parametrize("flag", [False, 1, "yes", None])
def test_a_relay_flag_other_than_true_is_refused(flag: object) -> None:
    keys = _keys(1)
    good = sign_card(_card(keys), keys.private_key)
    payload = {**json.loads(good[2 : 2 + struct.unpack(">H", good[:2])[0]]), "relay": flag}
    raw = json.dumps(payload).encode()
    value = struct.pack(">H", len(raw)) + raw + keys.private_key.sign(b"gwtf/card/1\x00" + raw)
    with pytest.raises(ProtocolError, match="relay"):
        open_card(card_key(_card(keys).peer_id), value)


def test_keys_separate_runs_and_stages() -> None:
    assert len({run_key(1), run_key(2), stage_key(1, 1), stage_key(1, 2), stage_key(2, 1)}) == 5
    assert run_key(7) == run_key(7) and run_key(7)[:2] == b"\x12\x20"
    with pytest.raises(ConfigError):
        stage_key(1, 5000)
    with pytest.raises(ConfigError):
        run_key(-1)


def test_a_card_signed_by_another_key_is_refused() -> None:
    card = _card(_keys(1))
    forged = sign_card(card, _keys(2).private_key)
    with pytest.raises(ProtocolError, match="bad signature"):
        open_card(card_key(card.peer_id), forged)


def test_a_tampered_card_is_refused() -> None:
    keys = _keys(1)
    card = _card(keys)
    value = bytearray(sign_card(card, keys.private_key))
    value[value.index(b"tokyo")] = ord("T")  # still a valid region, no longer what was signed
    with pytest.raises(ProtocolError, match="bad signature"):
        open_card(card_key(card.peer_id), bytes(value))


def test_a_card_under_another_peers_key_is_refused() -> None:
    keys = _keys(1)
    card = _card(keys)
    other = str(ID.from_pubkey(_keys(3).public_key))
    with pytest.raises(ProtocolError, match="another key"):
        open_card(card_key(other), sign_card(card, keys.private_key))


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\x00",
        b"\xff" * (MAX_CARD_BYTES + 1),
        struct.pack(">H", 500) + b"{}",  # shorter than its length prefix
        struct.pack(">H", 4) + b"\xff\xfe{}",  # not UTF-8
        struct.pack(">H", 2) + b"[]",  # not an object
        struct.pack(">H", 2) + b"{}",  # no fields
    ],
)
def test_malformed_card_bytes_are_refused(value: bytes) -> None:
    with pytest.raises(ProtocolError):
        open_card(card_key(str(ID.from_pubkey(_keys(1).public_key))), value)


@pytest.mark.parametrize(
    ("field", "bad"),
    [("run", -1), ("stage", 99999), ("stage", True), ("role", "king"), ("region", "no such"),
     ("addr", "/ip4/1.2.3.4"), ("issued_ms", "soon"), ("peer", 7)],
)  # fmt: skip
def test_cards_with_bad_fields_are_refused(field: str, bad: object) -> None:
    keys = _keys(1)
    good = sign_card(_card(keys), keys.private_key)
    payload = json.loads(good[2 : 2 + struct.unpack(">H", good[:2])[0]])
    payload[field] = bad
    raw = json.dumps(payload).encode()
    value = struct.pack(">H", len(raw)) + raw + keys.private_key.sign(raw)
    with pytest.raises(ProtocolError):
        open_card(card_key(_card(keys).peer_id), value)


def test_a_card_naming_another_peers_address_is_refused() -> None:
    keys = _keys(1)
    other = str(ID.from_pubkey(_keys(2).public_key))
    with pytest.raises(ProtocolError, match="another peer"):
        PeerCard(
            str(ID.from_pubkey(keys.public_key)), 1, 1, "relay", "oregon",
            f"/ip4/127.0.0.1/tcp/1/p2p/{other}", 0,
        )  # fmt: skip


def test_the_dht_validator_keeps_the_newest_valid_card() -> None:
    keys = _keys(1)
    old, new = (sign_card(_card(keys, issued_ms=t), keys.private_key) for t in (1000, 2000))
    key = card_key(_card(keys).peer_id)
    assert newest_card_index(key, [old, new]) == 1
    assert newest_card_index(key, [new, old]) == 0
    assert newest_card_index(key, [b"junk", old]) == 1
    CardValidator().validate(key, new)
    with pytest.raises(ProtocolError):
        CardValidator().validate(key, b"junk")


def _hint(keys: KeyPair, kind: str = "joined", run_id: int = 1, spare: int = 0) -> Hint:
    card = _card(keys)
    return Hint(kind, run_id, card.stage, card.region, card.address, spare)


def test_a_hint_from_its_author_on_its_run_is_accepted() -> None:
    keys = _keys(1)
    hint = _hint(keys, "spare", spare=3)
    assert decode_hint(encode_hint(hint), hint.peer_id, 1) == hint


def test_hints_about_someone_else_or_another_run_are_refused() -> None:
    keys = _keys(1)
    hint = _hint(keys)
    impostor = str(ID.from_pubkey(_keys(2).public_key))
    with pytest.raises(ProtocolError, match="another peer"):
        decode_hint(encode_hint(hint), impostor, 1)
    with pytest.raises(ProtocolError, match="run 1 on the topic of run 2"):
        decode_hint(encode_hint(hint), hint.peer_id, 2)


@pytest.mark.parametrize(
    "data",
    [b"\xff", b"[1]", b"{}", b"x" * 600,
     b'{"kind":"shout","run":1,"stage":1,"region":"a","addr":"x","spare":0}'],
)  # fmt: skip
def test_malformed_hints_are_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_hint(data, str(ID.from_pubkey(_keys(1).public_key)), 1)
