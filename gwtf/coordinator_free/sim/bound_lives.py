"""When each relay is up, read from a scenario's churn schedule alone (for ``bound.py``).

The engine (``membership.py``) draws a relay's random churn from its own stream,
``Random(f"{seed}/churn/{id}")``: on each bring-up the time to its crash
(``expovariate(rate)``), on each crash, with ``rejoin``, the downtime
(``expovariate(1 / mean_downtime_s)``). The draws alternate whatever the policy does, so for a
relay no scenario event touches, replaying the stream gives its lives (up intervals) exactly.
Without random churn, a relay's events alone decide its lives (a join of a live relay and a crash
of a dead one do nothing). A relay with both, or with two events at one instant, is taken as up
from its first possible appearance for ever: more capacity than it has, so still a lower bound.

``exact`` marks a life replayed exactly; only those may be used to say a relay is *up*.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

from gwtf.coordinator_free.sim.scenario import Scenario


@dataclass(frozen=True)
class Life:
    """A relay up from ``start_s`` to ``end_s`` (∞: for the rest of any run)."""

    relay: str
    speed: float
    start_s: float
    end_s: float
    exact: bool

    def overlap_s(self, start_s: float, end_s: float) -> float:
        return max(0.0, min(self.end_s, end_s) - max(self.start_s, start_s))


def relay_lives(scenario: Scenario, horizon_s: float) -> list[Life]:
    """Every relay's lives that begin before ``horizon_s``; a life still up at the horizon is
    cut there only if exact (``end_s`` past the horizon is the drawn crash, or ∞)."""
    churn = scenario.churn
    events_of: dict[str, list[tuple[float, str]]] = {}
    for event in churn.events:
        events_of.setdefault(event.node, []).append((event.t, event.event))
    lives: list[Life] = []
    for entry in scenario.nodes:
        if entry.role != "relay":
            continue
        events = events_of.get(entry.id, [])
        joins_late = any(kind == "join" for _, kind in events)
        if (churn.crash_rate_per_hour > 0 and events) or _same_instant(events):
            first = min((t for t, kind in events if kind == "join"), default=0.0)
            appears_s = first if joins_late else 0.0
            lives.append(Life(entry.id, entry.speed, appears_s, math.inf, exact=False))
        elif churn.crash_rate_per_hour > 0:
            lives += _random_lives(scenario, entry.id, entry.speed, horizon_s)
        else:
            lives += _event_lives(entry.id, entry.speed, events, up=not joins_late)
    return lives


def _same_instant(events: list[tuple[float, str]]) -> bool:
    counts = Counter(t for t, _ in events)
    return any(n > 1 for n in counts.values())


def _random_lives(scenario: Scenario, relay: str, speed: float, horizon_s: float) -> list[Life]:
    """Replays ``MembershipMixin._bring_up`` / ``_on_crash`` for one relay up at time 0."""
    churn = scenario.churn
    rng = random.Random(f"{scenario.seed}/churn/{relay}")
    rate = churn.crash_rate_per_hour / 3600.0
    lives = []
    up_at = 0.0
    while up_at < horizon_s:
        crash_at = up_at + rng.expovariate(rate)
        lives.append(Life(relay, speed, up_at, crash_at, True))
        if not churn.rejoin:
            break
        downtime = churn.mean_downtime_s
        up_at = crash_at + (rng.expovariate(1.0 / downtime) if downtime > 0 else 0.0)
    return lives


def _event_lives(relay: str, speed: float, events: list[tuple[float, str]], up: bool) -> list[Life]:
    lives = []
    since = 0.0
    for t, kind in sorted(events):
        if kind == "crash" and up:
            lives.append(Life(relay, speed, since, t, True))
            up = False
        elif kind == "join" and not up:
            since, up = t, True
    if up:
        lives.append(Life(relay, speed, since, math.inf, True))
    return lives
