"""SWARM's client-side load balancer, as released (``swarm/pipeline/src/moe/client/balancer.py``).

A trainer keeps one balancer per stage: a min-heap of the peers by the work it has sent each,
measured in expected seconds. Each call pops the least loaded peer, adds the call's expected
time (task size / the peer's throughput) to its load and pushes it back, so faster peers get
proportionally more calls and a queue never builds on one. The throughput is a bias-corrected
exponential moving average of seconds per sample (``src/optim/performance_ema.py``, α 0.1); a
peer never measured is expected to take ``task_size`` seconds (``initial_throughput`` 1.0). A peer
that joins the view starts at the least current load, so it is tried soon (balancer.py:82-86).
A peer whose call failed is banned until it announces itself again (balancer.py:90-98, 57-59).
The view is refreshed from the membership every 30 s, or at once when empty (balancer.py:22).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

EMA_ALPHA = 0.1
INITIAL_SECONDS_PER_TASK = 1.0
REFRESH_PERIOD_S = 30.0


@dataclass
class PerformanceEma:
    """Seconds per sample, averaged with the start-up bias removed."""

    alpha: float = EMA_ALPHA
    ema_seconds_per_sample: float = 0.0
    updates: int = 0

    def update(self, task_size: float, seconds: float) -> None:
        sample = seconds / task_size
        self.ema_seconds_per_sample = (
            self.alpha * sample + (1 - self.alpha) * self.ema_seconds_per_sample
        )
        self.updates += 1

    def expected_s(self, task_size: float) -> float:
        if self.updates == 0:
            return INITIAL_SECONDS_PER_TASK * task_size
        adjusted = self.ema_seconds_per_sample / (1 - (1 - self.alpha) ** self.updates)
        return task_size * adjusted


class Balancer:
    """One trainer's balancer over the peers of one stage."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._heap: list[tuple[float, float, str]] = []
        self._entry: dict[str, tuple[float, float, str]] = {}
        self._ema: dict[str, PerformanceEma] = {}
        self._banned_at: dict[str, float] = {}
        self._refreshed_at: float | None = None

    def pick(
        self,
        task_size: float,
        members: Callable[[], Sequence[str]],
        announced_at: Callable[[str], float],
        now: float,
    ) -> str | None:
        """The least loaded peer, charged with this call's expected time; None if none."""
        stale = self._refreshed_at is None or now - self._refreshed_at >= REFRESH_PERIOD_S
        if stale or not self._entry:
            self._refresh(members(), announced_at, now)
        while self._heap:
            entry = heapq.heappop(self._heap)
            load, _, peer = entry
            if self._entry.get(peer) != entry:
                continue  # banned or gone since it was pushed
            expected = self._ema[peer].expected_s(task_size)
            self._push(peer, load + expected)
            return peer
        return None

    def observe(self, peer: str, task_size: float, seconds: float) -> None:
        ema = self._ema.get(peer)
        if ema is not None:
            ema.update(task_size, max(seconds, 1e-9))

    def ban(self, peer: str, now: float) -> None:
        self._banned_at[peer] = now
        self._entry.pop(peer, None)
        self._ema.pop(peer, None)

    def is_banned(self, peer: str, announced_at: Callable[[str], float]) -> bool:
        banned_at = self._banned_at.get(peer)
        return banned_at is not None and announced_at(peer) <= banned_at

    def _refresh(
        self, members: Sequence[str], announced_at: Callable[[str], float], now: float
    ) -> None:
        self._refreshed_at = now
        present = set(members)
        for peer in [p for p in self._entry if p not in present]:  # expired from the view
            del self._entry[peer]
            self._ema.pop(peer, None)
        base = self._heap[0][0] if self._heap else 0.0
        for peer in members:
            if peer in self._entry or self.is_banned(peer, announced_at):
                continue
            self._banned_at.pop(peer, None)
            self._ema[peer] = PerformanceEma()
            self._push(peer, base)

    def _push(self, peer: str, load: float) -> None:
        entry = (load, self._rng.random(), peer)
        heapq.heappush(self._heap, entry)
        self._entry[peer] = entry
