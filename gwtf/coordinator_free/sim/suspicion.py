"""Peers suspected dead after a missed deadline, forgiven after a while.

A node cannot tell a dead peer from a slow one; a suspicion expires after ``expiry_s`` so that a
live peer wrongly suspected (say, one whose queue made an ack late) is tried again, as it would be
once its next announcement reached the sender. A peer that comes back is cleared at once.
"""

from __future__ import annotations

#: How long a suspicion lasts when nothing clears it (our choice, about two announcement periods).
SUSPICION_EXPIRY_S = 60.0


class Suspicions:
    """Suspected peers with the time each suspicion ends."""

    def __init__(self, expiry_s: float = SUSPICION_EXPIRY_S) -> None:
        self._expiry_s = expiry_s
        self._until: dict[str, float] = {}

    def mark(self, peer: str, now: float) -> None:
        self._until[peer] = now + self._expiry_s

    def clear(self, peer: str) -> None:
        self._until.pop(peer, None)

    def is_empty(self) -> bool:
        """Whether nobody is suspected (then no peer needs checking one by one)."""
        return not self._until

    def is_suspected(self, peer: str, now: float) -> bool:
        until = self._until.get(peer)
        if until is None:
            return False
        if now >= until:
            del self._until[peer]
            return False
        return True
