"""The two local moves between same-stage peers and the rule that accepts them.

A move changes at most two flows. Its gain Δ (milliseconds, the unit of the cost model; positive
is better) is the drop in the larger of the affected flows' path costs, plus a quarter of the drop
in their sum so that moves that cheapen one flow without touching the slowest still count. A move
with Δ > 0 is taken. A worse one is taken with probability exp((Δ / C) / T), C the larger of the
affected flows' path costs before the move (``scale_ms``), and T is multiplied by ``cooling``
after each accepted move. So T is a relative tolerance, the same in any unit and on any path
length: T = 0.05 takes a move 5 % worse with probability 1/e; T = 0 is greedy.

The default T = 0.001 makes it greedy local search that also takes near-ties: a move 0.1 % worse
passes with 1/e, 1 % worse with e^-10. Annealing that explores (T 0.01-0.3, cooling 0.5-0.95,
5-40 % of worse moves taken early) measured lower throughput on the simulated grid, and greedy
(T = 0) lower than near-ties (gwtf/coordinator_free/README.md, Moves). The prototype's T = 1.7 / 2.0
divided an absolute Δ in ms, about 3e-4 of a typical path cost: the same near-greedy rule.
Path costs use the prefix (source to the node) and suffix (next hop to a sink) costs each node
keeps per flow.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gwtf.coordinator_free.wire import TableEntry

_SUM_WEIGHT = 0.25
# Ours: a gain within float rounding of the path costs is no move. Sums of the same costs in
# another order leave a swap of like paths a few 1e-16 of a cost better or worse, and without
# this such no-op swaps were taken at any temperature.
_NOISE = 1e-9


@dataclass(frozen=True, slots=True)
class FlowView:
    """One flow at one node: cost up to it, its outgoing edge and the rest to a sink."""

    slot: int
    next_hop: str
    prefix_cost_ms: float
    edge_out_ms: float
    suffix_cost_ms: float

    @property
    def path_cost_ms(self) -> float:
        return self.prefix_cost_ms + self.edge_out_ms + self.suffix_cost_ms


def entry_path_cost_ms(entry: TableEntry) -> float:
    """A peer's flow's path cost, from its table entry."""
    return entry.prefix_cost_ms + entry.edge_out_ms + entry.suffix_cost_ms


@dataclass(frozen=True, slots=True)
class SwapMove:
    mine: FlowView
    theirs: TableEntry
    gain_ms: float

    @property
    def scale_ms(self) -> float:
        """The larger of the two flows' path costs before the move: Δ's scale."""
        return max(self.mine.path_cost_ms, entry_path_cost_ms(self.theirs))


@dataclass(frozen=True, slots=True)
class TakeOverMove:
    theirs: TableEntry
    edge_in_ms: float  # upstream -> me
    edge_out_ms: float  # me -> their next hop
    gain_ms: float

    @property
    def scale_ms(self) -> float:
        """The flow's path cost before the move: Δ's scale."""
        return entry_path_cost_ms(self.theirs)


def move_gain_ms(before_ms: list[float], after_ms: list[float]) -> float:
    """Δ: drop of the max path cost plus a quarter of the drop of the sum."""
    drop_max = max(before_ms) - max(after_ms)
    drop_sum = sum(before_ms) - sum(after_ms)
    return drop_max + _SUM_WEIGHT * drop_sum


def swap_gain_ms(
    mine: FlowView,
    theirs: TableEntry,
    my_edge_to_their_next_ms: float,
    their_edge_to_my_next_ms: float,
) -> float:
    """Gain of exchanging the next hops (and the rest of the paths) of two flows."""
    their_prefix = theirs.prefix_cost_ms
    before = [mine.path_cost_ms, entry_path_cost_ms(theirs)]
    after = [
        mine.prefix_cost_ms + my_edge_to_their_next_ms + theirs.suffix_cost_ms,
        their_prefix + their_edge_to_my_next_ms + mine.suffix_cost_ms,
    ]
    return move_gain_ms(before, after)


def take_over_gain_ms(theirs: TableEntry, my_edge_in_ms: float, my_edge_out_ms: float) -> float:
    """Gain of carrying a peer's flow myself, between the same upstream and next hop."""
    upstream_prefix = theirs.prefix_cost_ms - theirs.edge_in_ms
    before = entry_path_cost_ms(theirs)
    after = upstream_prefix + my_edge_in_ms + my_edge_out_ms + theirs.suffix_cost_ms
    return move_gain_ms([before], [after])


def is_accepted(gain_ms: float, scale_ms: float, temperature: float, rng: random.Random) -> bool:
    """Better moves always; a worse one with probability exp((Δ / scale) / T); no-ops never.

    ``scale_ms`` is the larger affected path cost before the move (``SwapMove.scale_ms``), so T
    is a relative tolerance; T = 0 is greedy: no worse move, and no random number drawn.
    """
    if not math.isfinite(gain_ms) or not math.isfinite(scale_ms) or scale_ms <= 0:
        return False
    relative = gain_ms / scale_ms
    if abs(relative) <= _NOISE:
        return False
    if relative > 0:
        return True
    return temperature > 0 and rng.random() < math.exp(relative / temperature)
