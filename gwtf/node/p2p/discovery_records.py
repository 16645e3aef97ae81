"""What nodes publish to find each other: DHT keys, signed peer cards and pubsub hints.

Pure encoding and validation, no I/O. A node's *card* says which run and stage it serves, from
which region and at which addresses (``addr``, the one to dial first, and ``addrs``, the others,
absent when there are none), and whether peers could dial it back when it last checked
(``reach``, true or false, and ``reach_ms``, when; both absent before its first check:
``gwtf.node.p2p.reachability``), and ``relay: true`` when it relays circuits for the run's nodes
behind NAT (absent otherwise); it is signed with the node's libp2p key, so a card stored in the
DHT under ``/gwtf/card/<peer id>`` can only come from that peer (Ed25519 peer ids embed the
public key). *Hints* travel on a run's gossipsub topic; pubsub already signs each message with
its sender's key, so a hint is accepted only when its address names the sender.

Everything read from the network is untrusted: sizes are bounded before parsing, every field is
checked for type and range, and a bad record raises ``ProtocolError`` for the caller to drop.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any, TypeVar

from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from gwtf.errors import ConfigError, ProtocolError
from gwtf.node.p2p.addresses import MAX_ADDRESS_CHARS, MAX_ADDRESSES, check_peer_addresses
from gwtf.node.p2p.host import peer_info

CARD_NAMESPACE = "gwtf"
CARD_PREFIX = f"/{CARD_NAMESPACE}/card/"
#: A card with one address takes ~450 bytes; each more address at most ~200; reachability ~40,
#: the relay flag 13.
MAX_CARD_BYTES = 690 + (MAX_ADDRESSES - 1) * 210
MAX_HINT_BYTES = 512
MAX_STAGE = 1024
MAX_REGION_CHARS = 32
MAX_SPARE = 1 << 16
ROLES = ("data", "relay")
HINT_KINDS = ("joined", "stage", "spare", "leaving")
_SIGNATURE_DOMAIN = b"gwtf/card/1\x00"
_LENGTH = struct.Struct(">H")
_T = TypeVar("_T")


def run_key(run_id: int) -> bytes:
    """DHT provider key of every peer of a run (a sha2-256 multihash, as DHT keys are)."""
    return _multihash(f"gwtf/run/{_checked_run(run_id)}")


def stage_key(run_id: int, stage: int) -> bytes:
    """DHT provider key of the peers serving ``stage`` of a run (0 = the data nodes)."""
    if not 0 <= stage <= MAX_STAGE:
        raise ConfigError(f"stage {stage} is outside 0..{MAX_STAGE}")
    return _multihash(f"gwtf/run/{_checked_run(run_id)}/stage/{stage}")


def card_key(peer_id: str) -> str:
    """DHT value key of a peer's card."""
    return f"{CARD_PREFIX}{peer_id}"


def hint_topic(run_id: int) -> str:
    return f"/gwtf/run/{_checked_run(run_id)}/hints/1"


@dataclass(frozen=True)
class PeerCard:
    """A peer's own statement of what it serves; ``issued_ms`` orders two cards of one peer."""

    peer_id: str
    run_id: int
    stage: int
    role: str
    region: str
    address: str
    issued_ms: int
    #: More addresses the peer advertises, tried after ``address``.
    other_addresses: tuple[str, ...] = ()
    #: Whether peers could dial it back at its last check (None: not checked yet), and when.
    reachable: bool | None = None
    reach_checked_ms: int = 0
    #: It relays circuits for the run's nodes behind NAT (``p2p.relay_service``, reachable).
    relays: bool = False

    def __post_init__(self) -> None:
        _check_fields(self.run_id, self.stage, self.region, self.address)
        if not 0 <= self.reach_checked_ms < 1 << 53:
            raise ProtocolError(f"reachability time {self.reach_checked_ms} is out of range")
        if self.role not in ROLES:
            raise ProtocolError(f"role {self.role[:20]!r} is not one of {ROLES}")
        if peer_id_of_address(self.address) != self.peer_id:
            raise ProtocolError("card address names another peer than the card")
        check_peer_addresses([self.address, *self.other_addresses], self.peer_id)
        if not 0 <= self.issued_ms < 1 << 53:
            raise ProtocolError(f"card time {self.issued_ms} is out of range")


def sign_card(card: PeerCard, key: PrivateKey) -> bytes:
    """The DHT value of ``card``: length-prefixed JSON followed by the signature over it."""
    fields: dict[str, object] = {
        "peer": card.peer_id,
        "run": card.run_id,
        "stage": card.stage,
        "role": card.role,
        "region": card.region,
        "addr": card.address,
        "issued_ms": card.issued_ms,
    }
    if card.other_addresses:
        fields["addrs"] = list(card.other_addresses)
    if card.reachable is not None:
        fields["reach"] = card.reachable
        fields["reach_ms"] = card.reach_checked_ms
    if card.relays:
        fields["relay"] = True
    payload = json.dumps(
        fields,
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    value = _LENGTH.pack(len(payload)) + payload + key.sign(_SIGNATURE_DOMAIN + payload)
    if len(value) > MAX_CARD_BYTES:
        raise ConfigError(f"peer card is {len(value)} bytes, over {MAX_CARD_BYTES}")
    return value


def open_card(key: str, value: bytes) -> PeerCard:
    """Check a card read from the DHT under ``key``: size, shape, owner and signature."""
    if len(value) > MAX_CARD_BYTES or len(value) < _LENGTH.size:
        raise ProtocolError(f"peer card of {len(value)} bytes is outside 2..{MAX_CARD_BYTES}")
    (length,) = _LENGTH.unpack_from(value)
    payload, signature = value[2 : 2 + length], value[2 + length :]
    if len(payload) != length:
        raise ProtocolError("peer card is shorter than its length prefix")
    fields = _json_object(payload, "peer card")
    card = PeerCard(
        peer_id=_field(fields, "peer", str),
        run_id=_field(fields, "run", int),
        stage=_field(fields, "stage", int),
        role=_field(fields, "role", str),
        region=_field(fields, "region", str),
        address=_field(fields, "addr", str),
        issued_ms=_field(fields, "issued_ms", int),
        other_addresses=_other_addresses(fields),
        **_reachability(fields),
        relays=_relay_flag(fields),
    )
    if key != card_key(card.peer_id):
        raise ProtocolError(f"card of peer {card.peer_id} stored under another key")
    public_key = ID.from_base58(card.peer_id).extract_public_key()
    if public_key is None:
        raise ProtocolError(f"peer id {card.peer_id} does not embed its public key")
    try:
        valid = public_key.verify(_SIGNATURE_DOMAIN + payload, signature)
    except Exception as exc:  # the crypto backends raise assorted types for a malformed signature
        raise ProtocolError(f"peer card signature is malformed: {exc}") from exc
    if not valid:
        raise ProtocolError(f"peer card of {card.peer_id} has a bad signature")
    return card


def newest_card_index(key: str, values: list[bytes]) -> int:
    """Of several values for one card key, the index of the newest valid card (for the DHT)."""
    best_index, best_ms = 0, -1
    for index, value in enumerate(values):
        try:
            issued_ms = open_card(key, value).issued_ms
        except ProtocolError:
            continue
        if issued_ms > best_ms:
            best_index, best_ms = index, issued_ms
    return best_index


@dataclass(frozen=True)
class Hint:
    """A lossy announcement on a run's topic; nothing depends on it arriving."""

    kind: str
    run_id: int
    stage: int
    region: str
    address: str
    spare: int = 0

    def __post_init__(self) -> None:
        if self.kind not in HINT_KINDS:
            raise ProtocolError(f"hint kind {self.kind[:20]!r} is not one of {HINT_KINDS}")
        _check_fields(self.run_id, self.stage, self.region, self.address)
        if not 0 <= self.spare <= MAX_SPARE:
            raise ProtocolError(f"spare capacity {self.spare} is outside 0..{MAX_SPARE}")

    @property
    def peer_id(self) -> str:
        return peer_id_of_address(self.address)


def encode_hint(hint: Hint) -> bytes:
    return json.dumps(
        {
            "kind": hint.kind,
            "run": hint.run_id,
            "stage": hint.stage,
            "region": hint.region,
            "addr": hint.address,
            "spare": hint.spare,
        },
        separators=(",", ":"),
    ).encode()


def decode_hint(data: bytes, sender: str, run_id: int) -> Hint:
    """A hint from ``sender`` (the pubsub-authenticated author) on run ``run_id``'s topic."""
    if len(data) > MAX_HINT_BYTES:
        raise ProtocolError(f"hint of {len(data)} bytes is over {MAX_HINT_BYTES}")
    fields = _json_object(data, "hint")
    hint = Hint(
        kind=_field(fields, "kind", str),
        run_id=_field(fields, "run", int),
        stage=_field(fields, "stage", int),
        region=_field(fields, "region", str),
        address=_field(fields, "addr", str),
        spare=_field(fields, "spare", int),
    )
    if hint.run_id != run_id:
        raise ProtocolError(f"hint for run {hint.run_id} on the topic of run {run_id}")
    if hint.peer_id != sender:
        raise ProtocolError(f"peer {sender} sent a hint about another peer")
    return hint


def peer_id_of_address(address: str) -> str:
    try:
        return str(peer_info(address).peer_id)
    except ConfigError as exc:
        raise ProtocolError(f"bad peer address: {exc}") from exc


def _check_fields(run_id: int, stage: int, region: str, address: str) -> None:
    if not 0 <= run_id < 1 << 64:
        raise ProtocolError(f"run id {run_id} is out of range")
    if not 0 <= stage <= MAX_STAGE:
        raise ProtocolError(f"stage {stage} is outside 0..{MAX_STAGE}")
    if len(region) > MAX_REGION_CHARS or not region.isidentifier():
        raise ProtocolError(f"bad region {region[:20]!r}")
    if len(address) > MAX_ADDRESS_CHARS:
        raise ProtocolError(f"address of {len(address)} characters is over {MAX_ADDRESS_CHARS}")


def _other_addresses(fields: dict[str, Any]) -> tuple[str, ...]:
    others = fields.get("addrs", [])
    if not isinstance(others, list) or not all(isinstance(a, str) for a in others):
        raise ProtocolError("field 'addrs' is not a list of strings")
    if len(others) >= MAX_ADDRESSES:
        raise ProtocolError(f"card has {len(others) + 1} addresses, over {MAX_ADDRESSES}")
    return tuple(others)


def _checked_run(run_id: int) -> int:
    if not 0 <= run_id < 1 << 64:
        raise ConfigError(f"run id {run_id} is outside 0..2^64-1")
    return run_id


def _multihash(text: str) -> bytes:
    return b"\x12\x20" + hashlib.sha256(text.encode()).digest()


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        fields = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"{what} is not UTF-8 JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return fields


def _reachability(fields: dict[str, Any]) -> dict[str, Any]:
    """A card's optional ``reach`` (bool) and ``reach_ms``, both or neither."""
    if "reach" not in fields and "reach_ms" not in fields:
        return {}
    reach = fields.get("reach")
    if not isinstance(reach, bool):
        raise ProtocolError("field 'reach' is not a boolean")
    return {"reachable": reach, "reach_checked_ms": _field(fields, "reach_ms", int)}


def _relay_flag(fields: dict[str, Any]) -> bool:
    """A card's optional ``relay`` flag: true or absent."""
    if "relay" not in fields:
        return False
    if fields["relay"] is not True:
        raise ProtocolError("field 'relay' is not true")
    return True


def _field(fields: dict[str, Any], name: str, kind: type[_T]) -> _T:
    value = fields.get(name)
    # bool is an int subclass; a card never carries one.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"field {name!r} is missing or not {kind.__name__}")
    return value
