"""Control requests between live nodes: end an iteration, re-send a buffered forward for a repair.

Small JSON objects, at most ``MAX_BYTES``, checked field by field: an unknown type, a missing or
mistyped field is a ``ProtocolError`` (charged to the sender by the rpc layer).

    {"type": "alive"}                                       -> {"ok": true}
    {"type": "end_iteration", "iteration": int,
     "replicas": [peer id]}                                 -> {"ok": bool, "step": int}
    {"type": "resend", "iteration": int, "microbatch": int,
     "to": peer id, "attempt": int}                         -> {"ok": bool, "why": str}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from gwtf.errors import ProtocolError

PROTOCOL_ID = "/gwtf/control/1.0.0"
MAX_BYTES = 4096


MAX_REPLICAS = 64


@dataclass(frozen=True)
class Alive:
    """Are you there? Asked before ending an iteration, with a short deadline."""


@dataclass(frozen=True)
class EndIteration:
    """Average with exactly ``replicas`` (the live replicas of your stage) and step."""

    iteration: int
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class Resend:
    """Re-send your buffered forward output of a microbatch to ``to``, flagged as a repair."""

    iteration: int
    microbatch: int
    to: str
    attempt: int


ControlRequest = Alive | EndIteration | Resend
_TYPES: dict[str, type[Alive] | type[EndIteration] | type[Resend]] = {
    "alive": Alive,
    "end_iteration": EndIteration,
    "resend": Resend,
}
_FIELDS: dict[type[Any], dict[str, type]] = {
    Alive: {},
    EndIteration: {"iteration": int, "replicas": list},
    Resend: {"iteration": int, "microbatch": int, "to": str, "attempt": int},
}


def encode_request(request: ControlRequest) -> bytes:
    kind = next(name for name, cls in _TYPES.items() if isinstance(request, cls))
    return json.dumps({"type": kind, **asdict(request)}).encode()


def decode_request(data: bytes) -> ControlRequest:
    raw = _load(data)
    cls = _TYPES.get(str(raw.pop("type", "")))
    if cls is None:
        raise ProtocolError("control request of an unknown type")
    fields = _FIELDS[cls]
    if set(raw) != set(fields):
        raise ProtocolError(f"control request {cls.__name__} needs exactly {sorted(fields)}")
    for name, kind in fields.items():
        value = raw[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ProtocolError(f"control field {name} must be {kind.__name__}")
        if isinstance(value, int) and not 0 <= value < 2**63:
            raise ProtocolError(f"control field {name} out of range")
        if isinstance(value, str) and not 0 < len(value) <= 96:
            raise ProtocolError(f"control field {name} has a bad length")
        if isinstance(value, list):
            if len(value) > MAX_REPLICAS or not all(
                isinstance(item, str) and 0 < len(item) <= 96 for item in value
            ):
                raise ProtocolError(f"control field {name} must be a short list of peer ids")
            raw[name] = tuple(value)
    return cls(**raw)


def encode_reply(ok: bool, **extra: int | str) -> bytes:
    return json.dumps({"ok": ok, **extra}).encode()


def decode_reply(data: bytes) -> dict[str, Any]:
    raw = _load(data)
    if not isinstance(raw.get("ok"), bool):
        raise ProtocolError("control reply without a boolean 'ok'")
    return raw


def _load(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_BYTES:
        raise ProtocolError(f"control message of {len(data)} bytes, limit {MAX_BYTES}")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("control message is not JSON") from exc
    if not isinstance(raw, dict):
        raise ProtocolError("control message is not a JSON object")
    return raw
