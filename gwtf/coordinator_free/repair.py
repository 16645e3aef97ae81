"""Crash handling as data: hop deadlines with attempt numbers, probes, and one-hop repairs.

Every hop (one stage's forward or backward of one microbatch) is acknowledged; the sender keeps
its buffers until then. ``HopTracker`` records each hop sent with a deadline
(``ack_deadline_s``, 20 s in the GWTF prototype) and an ``attempt`` number that grows with each
re-send, so an acknowledgement of an old attempt is told apart from the current one (the hop
receipts of the data plane attach here). On a missed forward acknowledgement the sender re-sends
its buffered output to another replica of the next stage (``plan_forward_resend``). When a
backward stalls, the data node probes the recorded path (``plan_probe``), finds the dead hop, and
``plan_hop_repair`` names the replacement: the previous hop re-sends its buffered output, the next
hop re-sends its buffered gradient, and only the lost hop is recomputed. Gradient averaging in a
stage proceeds with the live replicas (``averaging_group``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gwtf.coordinator_free.wire import BACKWARD, FORWARD, HopAck


@dataclass(frozen=True, slots=True, order=True)
class HopKey:
    """One hop of one microbatch: the stage that computes it and the direction."""

    microbatch_id: str
    stage: int
    direction: int  # FORWARD or BACKWARD


@dataclass(frozen=True, slots=True)
class PendingHop:
    key: HopKey
    peer: str
    attempt: int
    sent_s: float
    deadline_s: float


class HopTracker:
    """A node's outstanding hops: deadlines and attempt numbers; the caller passes ``now``."""

    def __init__(self, ack_deadline_s: float) -> None:
        self.ack_deadline_s = ack_deadline_s
        self._pending: dict[HopKey, PendingHop] = {}
        self._attempts: dict[HopKey, int] = {}

    def sent(self, key: HopKey, peer: str, now: float) -> PendingHop:
        """Record a (re-)send of ``key`` to ``peer``; a re-send is a new attempt."""
        attempt = self._attempts.get(key, -1) + 1
        self._attempts[key] = attempt
        hop = PendingHop(key, peer, attempt, now, now + self.ack_deadline_s)
        self._pending[key] = hop
        return hop

    def acked(self, sender: str, ack: HopAck) -> bool:
        """Settle the hop ``ack`` names if it is the current attempt from the expected peer."""
        key = HopKey(ack.microbatch_id, ack.stage, ack.direction)
        hop = self._pending.get(key)
        if hop is None or hop.peer != sender or hop.attempt != ack.attempt:
            return False  # late ack of an older attempt, or not ours
        del self._pending[key]
        return True

    def expired(self, now: float) -> list[PendingHop]:
        """Hops whose acknowledgement is overdue, in key order; they stop being pending."""
        late = sorted(
            (h for h in self._pending.values() if h.deadline_s < now), key=lambda h: h.key
        )
        for hop in late:
            del self._pending[hop.key]
        return late

    def attempt(self, key: HopKey) -> int:
        return self._attempts.get(key, 0)

    def pending(self) -> list[PendingHop]:
        return sorted(self._pending.values(), key=lambda h: h.key)

    def forget(self, microbatch_id: str) -> None:
        """The microbatch finished: drop its records."""
        for key in [k for k in self._attempts if k.microbatch_id == microbatch_id]:
            self._attempts.pop(key, None)
            self._pending.pop(key, None)


@dataclass(frozen=True, slots=True)
class ForwardResend:
    """Re-send the buffered output of ``key`` to ``to`` as attempt ``attempt``."""

    key: HopKey
    dead: str
    to: str
    attempt: int


def plan_forward_resend(
    missed: PendingHop, choose_other: Callable[[str], str | None]
) -> ForwardResend | None:
    """After a missed forward ack: another replica of the next stage, or None if there is none."""
    if missed.key.direction != FORWARD:
        return None
    other = choose_other(missed.peer)
    if other is None or other == missed.peer:
        return None
    return ForwardResend(missed.key, missed.peer, other, missed.attempt + 1)


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Which nodes of a microbatch's path the data node asks, and until when it waits."""

    microbatch_id: str
    targets: tuple[str, ...]
    deadline_s: float


def plan_probe(microbatch_id: str, path: Sequence[str], now: float, timeout_s: float) -> ProbePlan:
    """Probe every relay on the recorded path (origin and sink excluded), once each."""
    relays = tuple(dict.fromkeys(path[1:-1]))
    return ProbePlan(microbatch_id, relays, now + timeout_s)


def dead_stages(path: Sequence[str], answered: Collection[str]) -> list[int]:
    """Stages (1..S) whose relay on ``path`` did not answer the probe."""
    return [stage for stage in range(1, len(path) - 1) if path[stage] not in answered]


@dataclass(frozen=True, slots=True)
class HopRepair:
    """Recompute stage ``stage`` of a microbatch on ``replacement``.

    ``upstream`` re-sends its buffered output (the lost hop's input) and ``downstream`` its
    buffered gradient; nothing else is recomputed.
    """

    microbatch_id: str
    stage: int
    dead: str
    replacement: str
    upstream: str
    downstream: str
    attempt: int


def plan_hop_repair(
    microbatch_id: str,
    path: Sequence[str],
    stage: int,
    choose_replacement: Callable[[int, str], str | None],
    tracker: HopTracker | None = None,
) -> HopRepair | None:
    """The one-hop repair of ``stage`` on ``path`` (origin, relays 1..S, sink), or None.

    None means no live replacement is known: the caller restarts the microbatch.
    """
    if not 1 <= stage <= len(path) - 2:
        return None
    dead = path[stage]
    replacement = choose_replacement(stage, dead)
    if replacement is None or replacement == dead:
        return None
    key = HopKey(microbatch_id, stage, BACKWARD)
    attempt = 1 if tracker is None else tracker.attempt(key) + 1
    return HopRepair(
        microbatch_id, stage, dead, replacement, path[stage - 1], path[stage + 1], attempt
    )


def averaging_group(replicas: Sequence[str], dead: Collection[str]) -> tuple[str, ...]:
    """The replicas of a stage that take part in gradient averaging: the live ones, in order."""
    return tuple(replica for replica in replicas if replica not in dead)
