"""How a live node picks the next hop of a microbatch: by the flow protocol, or SWARM's way.

``gwtf`` follows the flow table the coordinator-free protocol built (capacity-aware, cheapest
paths). ``swarm`` is the baseline's wiring as a policy switch in the same live swarm: each hop goes
to a live next-stage peer drawn with probability proportional to its throughput estimate, an
exponential moving average (alpha 0.1, as in SWARM parallelism, Ryabinin et al. 2023) of the
inverse response time of that peer's acknowledged hops; flows and capacities are ignored.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

ROUTINGS = ("gwtf", "swarm")
SWARM_EMA_ALPHA = 0.1


@dataclass
class SwarmWiring:
    rng: random.Random
    alpha: float = SWARM_EMA_ALPHA
    throughput: dict[str, float] = field(default_factory=dict)  # hops per second

    def observe(self, peer: str, response_s: float) -> None:
        """Fold one acknowledged hop's response time into the peer's throughput estimate."""
        rate = 1.0 / max(response_s, 1e-6)
        old = self.throughput.get(peer)
        self.throughput[peer] = rate if old is None else self.alpha * rate + (1 - self.alpha) * old

    def choose(self, candidates: Sequence[str]) -> str | None:
        """A candidate drawn by throughput; unmeasured peers count as the best known one."""
        if not candidates:
            return None
        known = [self.throughput[c] for c in candidates if c in self.throughput]
        optimistic = max(known, default=1.0)  # try new peers, as SWARM's warm-up does
        weights = [self.throughput.get(c, optimistic) for c in candidates]
        return self.rng.choices(list(candidates), weights=weights)[0]
