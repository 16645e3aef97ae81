"""Control requests between live nodes: end an iteration, trace and repair a stalled microbatch.

Small JSON objects, at most ``MAX_BYTES``, checked field by field: an unknown type, a missing or
mistyped field is a ``ProtocolError`` (charged to the sender by the rpc layer).

    {"type": "alive"}                                       -> {"ok": true}
    {"type": "end_iteration", "iteration": int, "attempt": int,
     "replicas": [peer id], "holders": [peer id]}           -> {"ok": bool, "step": int,
                                                                "why": str, "missing": [id]}
    {"type": "resend", "iteration": int, "microbatch": int,
     "to": peer id, "attempt": int}                         -> {"ok": bool, "why": str}
    {"type": "resume", ... the fields of resend}            -> {"ok": bool, "why": str}
    {"type": "trace", "iteration": int, "microbatch": int}  -> {"ok": true, "state": str,
                                                                "next": peer id or ""}
    {"type": "trace_back", ... the fields of trace}         -> the same, of the backward
    {"type": "resume_back", "iteration": int,
     "microbatch": int, "dead": peer id}                    -> {"ok": bool, "why": str}
    {"type": "holds", "iteration": int, "first": int,
     "count": int}                                          -> {"ok": true, "stage": int,
                                                                "step": int, "held": [int]}
    {"type": "expect_redo", "iteration": int,
     "microbatch": int, "sender": peer id}                  -> {"ok": bool, "why": str}
    {"type": "redo_back", ... the fields of resend}         -> {"ok": bool, "why": str}
    {"type": "loads"}                                       -> {"ok": true, "loads": [[peer id,
                                                                address, stage, capacity,
                                                                spare], ...]}
    {"type": "shard"}                                       -> {"ok": true, "shard": int,
                                                                "shards": int}
    {"type": "batch_done", "iteration": int,
     "holders": [peer id]}                                  -> {"ok": true}
    {"type": "redo_lost", "iteration": int, "stages": int}  -> {"ok": bool, "holders": [peer id]}
    {"type": "iteration_ended", "iteration": int,
     "relays_stepped": int, "members": [peer id]}           -> {"ok": true}
    {"type": "rejoin"}                                      -> {"ok": true}
    {"type": "current_try", "iteration": int,
     "microbatch": int}                                     -> {"ok": bool, "attempt": int,
                                                                "issued": int, "why": str}

``loads`` lists the asking node's view of the run: itself and the live peers its flow protocol
knows (at most ``MAX_LOADS``, taken stage by stage in turn), for a relay choosing its stage.
``shard``, ``batch_done``, ``redo_lost``, ``iteration_ended`` and ``rejoin`` pass between the data
nodes of a run (``data_peers.py``): which shard of each iteration the asked one starts, of how
many; every microbatch of the sender's share of the iteration is done, and which relays hold its
gradients; redo the lost gradients of your share at these stages (``stages``: bit s set for
stage s; a round missed a holder) and name your holders now; the relays have stepped, and which
data nodes train the next iteration; take the sender (back) into the run.
``current_try`` asks a microbatch's origin for the first attempt of the microbatch's try in
progress (or done) and the first attempt it has not handed out (``issued``): a relay holding the
microbatch's forward from another input lets a second forward replace it only when that one is
of the latest try and the held one of an earlier try or under a number nobody handed out
(``roles/held_forward.py``).
A trace's ``state`` is one of ``TRACE_STATES`` (``TRACE_BACK_STATES`` for ``trace_back``): what
the asked node knows of the microbatch's forward (backward); ``next`` names whom it delivered it
to when ``sent``.
``end_iteration`` averages only if every one of ``holders`` (the replicas whose gradient holds a
microbatch of the iteration) is in the round: a round that misses one (it died while averaging)
answers ``why: "incomplete"`` with the ``missing`` holders and does not step, so the data node
can redo what they held and ask again (``attempt`` 1, 2, ...). The last of ``MAX_END_ATTEMPTS``
steps with what it has.
``holds`` and ``redo_back`` save the gradients a dead replica held (``gradient_redo.py``): which
of the microbatches ``first .. first + count - 1`` (at most ``MAX_HOLDS``) the asked relay's
accumulated gradient holds (``held``: offsets from ``first``); accept a redone gradient of a
microbatch you hold the forward of from ``sender``; send the gradient you keep of a microbatch
to ``to``, to be accumulated there and kept, not sent on. Only a microbatch's origin may ask the
last two.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

from libp2p.peer.id import ID

from gwtf.coordinator_free.wire import MAX_ITEMS
from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits

log = logging.getLogger(__name__)

PROTOCOL_ID = "/gwtf/control/6.0.0"
MAX_BYTES = 8192
MAX_LOADS = 24
#: A loads entry's compute time per microbatch is at most this (ms): about three hours.
MAX_COMPUTE_MS = 1e7


MAX_REPLICAS = 64
#: Microbatches one ``holds`` request may ask about: its reply stays within ``MAX_BYTES``.
MAX_HOLDS = 1024
#: Tries at ending an iteration whose averaging missed a replica holding gradients: the last
#: steps anyway, with what it has.
MAX_END_ATTEMPTS = 3


@dataclass(frozen=True)
class CurrentTry:
    """(To a microbatch's origin.) The first attempt of this microbatch's latest try?"""

    iteration: int
    microbatch: int


@dataclass(frozen=True)
class Alive:
    """Are you there? Asked before ending an iteration, with a short deadline."""


@dataclass(frozen=True)
class Loads:
    """Which nodes of the run do you know, at which stage, with what capacity and spare?"""


@dataclass(frozen=True)
class LoadEntry:
    peer_id: str
    address: str
    stage: int
    capacity: int
    spare: int
    #: Compute time per microbatch (ms), as the node measures or declares it: placement weighs
    #: capacity by speed.
    compute_ms: float


#: The address a data node gives, in its loads answer, for a relay it told the loads to and
#: that does not serve yet: a reservation of the stage it will take (not a place to dial).
JOINING_ADDRESS = "joining"


@dataclass(frozen=True)
class EndIteration:
    """Average with exactly ``replicas`` (the live replicas of your stage) and step, unless the
    round misses one of ``holders`` and this is not the last ``attempt``."""

    iteration: int
    replicas: tuple[str, ...]
    holders: tuple[str, ...] = ()
    attempt: int = 0

    @property
    def final(self) -> bool:
        return is_last_attempt(self.attempt)


def is_last_attempt(attempt: int) -> bool:
    """The attempt at ending an iteration that steps whatever its round missed."""
    return attempt + 1 >= MAX_END_ATTEMPTS


@dataclass(frozen=True)
class Resend:
    """Re-send your buffered forward output of a microbatch to ``to``, flagged as a repair."""

    iteration: int
    microbatch: int
    to: str
    attempt: int


@dataclass(frozen=True)
class Resume(Resend):
    """Re-send your buffered forward output of a microbatch to ``to``, to be computed and sent
    on like any forward: the hop after you was lost (a forward repair)."""


@dataclass(frozen=True)
class Trace:
    """What do you know of this microbatch's forward? Asked along a stalled forward's path."""

    iteration: int
    microbatch: int


@dataclass(frozen=True)
class TraceBack(Trace):
    """What do you know of this microbatch's backward? Asked along a stalled gradient's path."""


@dataclass(frozen=True)
class ResumeBack:
    """You delivered this microbatch's gradient to ``dead``, which died holding it: send it
    again, around the dead hop, to another replica of its stage (a backward repair)."""

    iteration: int
    microbatch: int
    dead: str


@dataclass(frozen=True)
class Holds:
    """Which of the microbatches ``first .. first + count - 1`` of ``iteration`` does your
    accumulated gradient hold? Asked of every relay before an iteration ends."""

    iteration: int
    first: int
    count: int


@dataclass(frozen=True)
class ExpectRedo:
    """Accept one redone gradient of this microbatch from ``sender`` (``RedoBack``): a dead
    replica of your stage held it. You hold its forward (re-sent to you just before)."""

    iteration: int
    microbatch: int
    sender: str


@dataclass(frozen=True)
class RedoBack:
    """Send the gradient you keep of a microbatch to ``to``, flagged as a redo: ``to`` holds
    the forward (re-sent to it just before) and accumulates the gradient a dead replica of its
    stage held; it keeps the gradient for its input and sends nothing on."""

    iteration: int
    microbatch: int
    to: str
    attempt: int


@dataclass(frozen=True)
class Forget:
    """The origin of ``iteration``'s microbatches restarted from its resume point and trains
    the iteration again from its start: drop the gradients and kept forwards you hold of it
    (all of them its own), so none counts twice. Answered with your step."""

    iteration: int


@dataclass(frozen=True)
class Discard:
    """Your accumulated gradient of ``iteration`` holds a microbatch that another replica of
    your stage holds too (a backward computed twice around a peer that looked dead), so it
    would count twice in the stage's average: drop the whole sum, which is one tensor (all of
    it the asker's microbatches); the asker redoes the rest. Answered with your step."""

    iteration: int


@dataclass(frozen=True)
class Shard:
    """(Between data nodes.) Which shard of each iteration's microbatches do you start?"""


@dataclass(frozen=True)
class BatchDone:
    """(Between data nodes.) Every microbatch of my share of ``iteration`` is done; these
    relays hold its gradients (the end must hear from each)."""

    iteration: int
    holders: tuple[str, ...] = ()


@dataclass(frozen=True)
class RedoLost:
    """(Between data nodes.) A round of these stages (bit s for stage s) missed a holder: redo
    the gradients of your share no live replica holds, and name your holders now."""

    iteration: int
    stages: int

    def stage_set(self, stages: int) -> frozenset[int]:
        return frozenset(s for s in range(1, stages + 1) if self.stages >> s & 1)


@dataclass(frozen=True)
class IterationEnded:
    """(Between data nodes.) The relays averaged and stepped ``iteration`` (that many did);
    ``members`` are the data nodes of the next iteration."""

    iteration: int
    relays_stepped: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Rejoin:
    """(Between data nodes.) Take me (back) into the run from the next iteration."""


#: absent: never received (or lost); queued: waiting for or in compute; sending: computed, its
#: output on the way to the next hop; sent: delivered to ``next``; stuck: computed, but no next
#: hop took it; held: computed and kept for a repair or the loss (nothing more to send).
TRACE_STATES = ("absent", "queued", "sending", "sent", "stuck", "held")
#: The same words for a backward: queued, then sending the gradient on, then sent to ``next``
#: (stuck: computed, but no node before it took the gradient).
TRACE_BACK_STATES = ("absent", "queued", "sending", "sent", "stuck")

ControlRequest = (
    Alive
    | Loads
    | EndIteration
    | Resend
    | Resume
    | Trace
    | TraceBack
    | ResumeBack
    | Holds
    | ExpectRedo
    | RedoBack
    | Forget
    | Discard
    | Shard
    | BatchDone
    | RedoLost
    | IterationEnded
    | Rejoin
    | CurrentTry
)
_TYPES: dict[str, type[Any]] = {
    "alive": Alive,
    "loads": Loads,
    "end_iteration": EndIteration,
    "resend": Resend,
    "resume": Resume,
    "trace": Trace,
    "trace_back": TraceBack,
    "resume_back": ResumeBack,
    "holds": Holds,
    "expect_redo": ExpectRedo,
    "redo_back": RedoBack,
    "forget": Forget,
    "discard": Discard,
    "shard": Shard,
    "batch_done": BatchDone,
    "redo_lost": RedoLost,
    "iteration_ended": IterationEnded,
    "rejoin": Rejoin,
    "current_try": CurrentTry,
}
_RESEND_FIELDS = {"iteration": int, "microbatch": int, "to": str, "attempt": int}
_FIELDS: dict[type[Any], dict[str, type]] = {
    Alive: {},
    Loads: {},
    EndIteration: {"iteration": int, "replicas": list, "holders": list, "attempt": int},
    Resend: _RESEND_FIELDS,
    Resume: _RESEND_FIELDS,
    Trace: {"iteration": int, "microbatch": int},
    TraceBack: {"iteration": int, "microbatch": int},
    ResumeBack: {"iteration": int, "microbatch": int, "dead": str},
    Holds: {"iteration": int, "first": int, "count": int},
    ExpectRedo: {"iteration": int, "microbatch": int, "sender": str},
    RedoBack: _RESEND_FIELDS,
    Forget: {"iteration": int},
    Discard: {"iteration": int},
    Shard: {},
    BatchDone: {"iteration": int, "holders": list},
    RedoLost: {"iteration": int, "stages": int},
    IterationEnded: {"iteration": int, "relays_stepped": int, "members": list},
    Rejoin: {},
    CurrentTry: {"iteration": int, "microbatch": int},
}


async def ask(
    rpc: RequestResponse, peer: str | ID, request: ControlRequest, timeout_s: float
) -> bytes:
    """Send ``request`` to ``peer`` and return its raw reply (a ``PeerUnavailable`` on failure)."""
    peer_id = ID.from_base58(peer) if isinstance(peer, str) else peer
    limits = RpcLimits(MAX_BYTES, MAX_BYTES, timeout_s)
    return await rpc.request(peer_id, PROTOCOL_ID, encode_request(request), limits)


Request = TypeVar("Request", bound=ControlRequest)
_Asked = TypeVar("_Asked", contravariant=True)


class AnswerHere(Protocol[_Asked]):
    """This node's own answer to a control request it would otherwise send a peer: the reply
    encoded as a peer's (``encode_reply``). May wait on other peers (a re-send waits for its
    ack); says a refusal in the reply, and a ``ProtocolError`` it raises counts as one."""

    async def __call__(self, request: _Asked, /) -> bytes: ...


class AskDeadline(Protocol):
    """How long to wait now for a peer's answer to a control request, in seconds: it follows
    the run's liveness deadlines, so it is read at each ask. Does not block or raise."""

    def __call__(self) -> float: ...


async def ask_to_send(
    rpc: RequestResponse,
    node_id: str,
    node: str,
    request: Request,
    ack_deadline_s: float,
    here: AnswerHere[Request] | None,
    doing: str,
) -> bool:
    """Ask ``node`` (this node, ``node_id``: ``here`` answers) to send a hop for a repair or a
    redo (``doing``, for the log); True when it did. The asked node may ask another before it
    sends and waits for its ack: allow for both."""
    microbatch = getattr(request, "microbatch", None)
    try:
        if node == node_id:
            assert here is not None, "this node cannot answer that itself"
            reply = await here(request)
        else:
            reply = await ask(rpc, node, request, 4 * ack_deadline_s)
        answer = decode_reply(reply)
    except ProtocolError as exc:
        log.warning("%s microbatch %s: %s failed: %s", doing, microbatch, node, exc)
        return False
    if not answer["ok"]:
        log.info("%s microbatch %s: %s said %s", doing, microbatch, node, answer.get("why"))
    return bool(answer["ok"])


def encode_request(request: ControlRequest) -> bytes:
    kind = next(name for name, cls in _TYPES.items() if type(request) is cls)
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
    if cls is EndIteration and raw["attempt"] >= MAX_END_ATTEMPTS:
        raise ProtocolError(f"an iteration is ended in at most {MAX_END_ATTEMPTS} attempts")
    if cls is Holds and not 0 < raw["count"] <= MAX_HOLDS:
        raise ProtocolError(f"a holds request asks about 1..{MAX_HOLDS} microbatches")
    request: ControlRequest = cls(**raw)
    return request


def encode_reply(ok: bool, **extra: Any) -> bytes:
    return json.dumps({"ok": ok, **extra}).encode()


def encode_trace(state: str, next_hop: str = "") -> bytes:
    return encode_reply(True, state=state, next=next_hop)


def decode_trace(data: bytes, states: tuple[str, ...] = TRACE_STATES) -> tuple[str, str]:
    """A trace reply's state (one of ``states``) and next hop; anything malformed is a
    ``ProtocolError``."""
    raw = decode_reply(data)
    state, next_hop = raw.get("state"), raw.get("next")
    if state not in states or not isinstance(next_hop, str) or len(next_hop) > 96:
        raise ProtocolError("trace reply without a known state and a next hop")
    if (state == "sent") != bool(next_hop):
        raise ProtocolError("trace reply names a next hop exactly when the forward was sent")
    return state, next_hop


def encode_loads(entries: list[LoadEntry]) -> bytes:
    """At most ``MAX_LOADS`` entries, taken stage by stage in turn so every stage is seen."""
    by_stage: dict[int, list[LoadEntry]] = {}
    # Serving nodes before relays still joining: a reservation never crowds a replica out.
    for entry in sorted(entries, key=lambda e: (e.stage, e.address == JOINING_ADDRESS, e.peer_id)):
        by_stage.setdefault(entry.stage, []).append(entry)
    chosen: list[LoadEntry] = []
    while len(chosen) < MAX_LOADS and any(by_stage.values()):
        for queue in by_stage.values():
            if queue and len(chosen) < MAX_LOADS:
                chosen.append(queue.pop(0))
    rows = [[e.peer_id, e.address, e.stage, e.capacity, e.spare, e.compute_ms] for e in chosen]
    return encode_reply(True, loads=rows)


def decode_loads(data: bytes) -> list[LoadEntry]:
    """A loads reply's entries; anything malformed is a ``ProtocolError``."""
    rows = decode_reply(data).get("loads")
    if not isinstance(rows, list) or len(rows) > MAX_LOADS:
        raise ProtocolError(f"loads reply without a list of at most {MAX_LOADS} entries")
    entries = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 6):
            raise ProtocolError(
                "a loads entry must be [peer, address, stage, capacity, spare, compute_ms]"
            )
        peer_id, address, stage, capacity, spare, compute_ms = row
        if not all(isinstance(v, str) and 0 < len(v) <= 256 for v in (peer_id, address)):
            raise ProtocolError("a loads entry needs a peer id and an address")
        if not all(type(v) is int and 0 <= v <= MAX_ITEMS for v in (stage, capacity)) or not (
            type(spare) is int and -MAX_ITEMS <= spare <= MAX_ITEMS
        ):
            raise ProtocolError(
                f"a loads entry's stage, capacity and spare must be ints within {MAX_ITEMS}"
            )
        if not (type(compute_ms) in (int, float) and 0 < compute_ms <= MAX_COMPUTE_MS):
            raise ProtocolError(f"a loads entry's compute_ms must be in (0, {MAX_COMPUTE_MS}]")
        entries.append(LoadEntry(peer_id, address, stage, capacity, spare, float(compute_ms)))
    return entries


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
