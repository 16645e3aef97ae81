"""The bound's run, iteration by iteration, over the relays' lives (``bound_lives.py``).

Iteration k starts at ``s`` (the previous averaging's end; 0 for the first) and reaches its
barrier at ``e``. With ``b_j`` / ``a_j`` the parts of a counted microbatch's chain before its
stage-j forward and after its stage-j backward (``bound.py``), every stage-j task of the
iteration lies in the window ``W_j = [s + b_j, e - a_j]``, the windows nest (``W_1 ⊇ W_2 …``),
and a relay computes only while up. So ``e`` must meet, besides ``e - s ≥ least_s`` (the terms
that do not depend on who is up):

* **nested**: stages j..S carry ``(S-j+1)·work`` (``work = B·c`` at speed 1) inside ``W_j``:
  ``(S-j+1)·work ≤ Σ_lives speed · |life ∩ W_j|``.
* **split**: a relay keeps its stage for a whole life within an iteration (``MoveStage`` acts
  between iterations; a relay brought up again is placed anew, as a new life). Exact lives that
  span ``W_1`` ("full", summed speed ``F``) serve one stage each, a share ``σ_j`` of ``F``; every
  other life is credited to every stage at once (``P_j = Σ speed · |life ∩ W_j|``), which only
  adds capacity. Stage j needs ``σ_j·|W_j| + P_j ≥ work``, so
  ``Σ_j max(0, work - P_j) / |W_j| ≤ F``. Without churn this is the per-stage split of
  ``bound.py`` exactly.

Both conditions only get easier as the windows widen, so whether ``e`` meets them is monotone in
``e`` (bisection finds the least, ``E(s)``) and ``E`` is nondecreasing in ``s`` (a later start's
windows lie inside an earlier start's with the same ``e``). By induction every iteration of a
run starts and ends no earlier than here. Between iterations the averaging takes at least
``data_allreduce_s`` and the pigeonhole term of the relays alive at the barrier: some stage
holds ``⌈n/S⌉`` of the ``n`` relays up then (every live relay is placed), at least the fewest
exact lives up at any time from ``E(s)`` to the horizon ``H`` up to which lives are replayed.
A run that goes past ``H`` takes at least ``H``, so ``min(H, this)`` is a bound whatever happens
after ``H``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gwtf.coordinator_free.sim.bound_lives import Life

#: Bisection steps on an iteration's length: 2^-100 of the bracket, far below a nanosecond.
_BISECTION_STEPS = 100


@dataclass(frozen=True)
class Chain:
    """What one iteration needs whoever is up (seconds; ``work_s`` at speed 1)."""

    before_s: tuple[float, ...]
    after_s: tuple[float, ...]
    work_s: float
    least_s: float
    data_allreduce_s: float
    relay_allreduce_s: Callable[[int], float]


def run_s(chain: Chain, lives: Sequence[Life], iterations: int, horizon_s: float) -> float:
    """The least time ``iterations`` iterations take, or ``horizon_s`` if that is less."""
    sweep = _Sweep(chain, lives, horizon_s)
    start = 0.0
    for _ in range(iterations):
        end = sweep.earliest_end(start)
        if end >= horizon_s:
            return horizon_s
        start = end + max(chain.data_allreduce_s, chain.relay_allreduce_s(sweep.fewest_up(end)))
    return min(start, horizon_s)


class _Sweep:
    def __init__(self, chain: Chain, lives: Sequence[Life], horizon_s: float) -> None:
        self.chain = chain
        self.lives = list(lives)
        self.horizon_s = horizon_s
        self.boundaries = sorted(
            {t for life in lives for t in (life.start_s, life.end_s) if math.isfinite(t)}
        )
        self._length_cache: dict[frozenset[int], float] = {}
        self._fewest = _fewest_up_after([life for life in lives if life.exact], horizon_s)

    def fewest_up(self, when_s: float) -> int:
        times, suffix = self._fewest
        index = bisect.bisect_right(times, when_s) - 1
        return suffix[max(index, 0)]

    def earliest_end(self, start_s: float) -> float:
        """E(start): the least barrier time meeting both conditions (the low end of the
        bisection bracket, never above the true least)."""
        up = frozenset(
            i for i, life in enumerate(self.lives) if life.start_s <= start_s < life.end_s
        )
        index = bisect.bisect_right(self.boundaries, start_s)
        next_change = self.boundaries[index] if index < len(self.boundaries) else math.inf
        cached = self._length_cache.get(up)
        if cached is not None and start_s + cached < next_change:
            return start_s + cached
        low = max(self.chain.least_s, max(self.chain.before_s) + max(self.chain.after_s))
        if self._feasible(start_s, start_s + low):
            length = low
        else:
            high = max(2.0 * low, 1.0)
            while not self._feasible(start_s, start_s + high):
                if start_s + high >= self.horizon_s:
                    return self.horizon_s
                high *= 2.0
            for _ in range(_BISECTION_STEPS):
                middle = (low + high) / 2.0
                if self._feasible(start_s, start_s + middle):
                    high = middle
                else:
                    low = middle
            length = low
        if start_s + length < next_change:
            self._length_cache[up] = length
        return start_s + length

    def _feasible(self, start_s: float, end_s: float) -> bool:
        chain = self.chain
        stages = len(chain.before_s)
        windows = [(start_s + chain.before_s[j], end_s - chain.after_s[j]) for j in range(stages)]
        if any(high <= low for low, high in windows):
            return False
        widest = windows[0]
        full_speed = 0.0
        partial = [0.0] * stages
        nested = [0.0] * stages
        for life in self.lives:
            if life.start_s >= widest[1] or life.end_s <= widest[0]:
                continue
            spans = life.exact and life.start_s <= widest[0] and life.end_s >= widest[1]
            if spans:
                full_speed += life.speed
            for j, (low, high) in enumerate(windows):
                capacity = life.speed * life.overlap_s(low, high)
                nested[j] += capacity
                if not spans:
                    partial[j] += capacity
        for j in range(stages):
            if (stages - j) * chain.work_s > nested[j]:
                return False
        needed = sum(
            max(0.0, chain.work_s - partial[j]) / (high - low)
            for j, (low, high) in enumerate(windows)
        )
        return needed <= full_speed


def _fewest_up_after(lives: Sequence[Life], horizon_s: float) -> tuple[list[float], list[int]]:
    """Breakpoints ``t_i`` and, for each, the fewest lives up at any time in ``[t_i, H)``; at an
    instant where lives end and others start, the count with the ends taken first."""
    starts: dict[float, int] = {0.0: 0}
    ends: dict[float, int] = {}
    for life in lives:
        starts[life.start_s] = starts.get(life.start_s, 0) + 1
        if life.end_s < horizon_s:
            ends[life.end_s] = ends.get(life.end_s, 0) + 1
    times = sorted(t for t in starts.keys() | ends.keys() if t < horizon_s)
    counts, running = [], 0
    for t in times:
        running -= ends.get(t, 0)
        lowest = running
        running += starts.get(t, 0)
        counts.append(min(lowest, running) if t > 0.0 else running)
    for i in range(len(counts) - 2, -1, -1):
        counts[i] = min(counts[i], counts[i + 1])
    return times, counts
