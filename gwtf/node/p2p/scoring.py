"""Peer scores: every misbehaviour costs points, points recover with time, a low score bans.

Pure and deterministic (``now`` is an input). Peers are untrusted: a node counts garbage frames,
oversized frames, unknown protocols and failed handlers against the sender and stops talking to a
peer whose score falls under the ban threshold until it has recovered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Offence(Enum):
    """What a peer did wrong, with its cost in points (``cost``).

    Each member is its own value, whatever its cost: with the cost as the value, two offences of
    equal cost would be one member, and the second would be recorded under the first's name.
    """

    cost: float

    def __new__(cls, cost: float) -> Offence:
        member = object.__new__(cls)
        member._value_ = len(cls.__members__)
        member.cost = cost
        return member

    MALFORMED_MESSAGE = 10.0
    OVERSIZED_FRAME = 20.0
    TIMEOUT = 5.0
    HANDLER_FAILURE = 5.0
    NOT_ADMITTED = 100.0
    BAD_RECEIPT = 25.0  # a signature that does not check, a receipt of another's hop
    WINDOW_OVERRUN = 80.0  # sent past a yamux receive window: out to fill our memory


@dataclass(frozen=True)
class ScoringConfig:
    ban_below: float = -50.0
    recovery_per_s: float = 1.0  # points regained per second of good behaviour, up to 0


@dataclass
class PeerScores:
    """Score per peer id; 0 is neutral, negative is suspicious."""

    config: ScoringConfig = field(default_factory=ScoringConfig)
    _score: dict[str, float] = field(default_factory=dict)
    _updated_at: dict[str, float] = field(default_factory=dict)
    offences: dict[str, list[Offence]] = field(default_factory=dict)

    def score(self, peer: str, now: float) -> float:
        last = self._updated_at.get(peer, now)
        recovered = self._score.get(peer, 0.0) + (now - last) * self.config.recovery_per_s
        return min(0.0, recovered)

    def penalise(self, peer: str, offence: Offence, now: float) -> float:
        """Charge ``offence`` to ``peer`` and return its new score."""
        new_score = self.score(peer, now) - offence.cost
        self._score[peer] = new_score
        self._updated_at[peer] = now
        self.offences.setdefault(peer, []).append(offence)
        return new_score

    def is_banned(self, peer: str, now: float) -> bool:
        return self.score(peer, now) < self.config.ban_below
