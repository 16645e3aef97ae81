"""The two local moves between same-stage peers and the simulated-annealing acceptance rule.

A move changes at most two flows. Its gain Δ (milliseconds, the unit of the cost model; positive
is better) is the drop in the larger of the affected flows' path costs, plus a quarter of the drop
in their sum so that moves that cheapen one flow without touching the slowest still count. A move
with Δ > 0 is taken; a worse move is taken with probability exp(Δ/T), and T is multiplied by
``cooling`` after each accepted move (GWTF prototype: T = 1.7 relays / 2.0 data nodes, cooling
0.95). In milliseconds these temperatures let a node accept a move a few ms worse early on, and
make it greedy later; in seconds they would accept almost any move for hundreds of rounds.
Path costs use the prefix (source to the node) and suffix (next hop to a sink) costs each node
keeps per flow.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from coordinator_free.wire import TableEntry

_SUM_WEIGHT = 0.25


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


@dataclass(frozen=True, slots=True)
class SwapMove:
    mine: FlowView
    theirs: TableEntry
    gain_ms: float


@dataclass(frozen=True, slots=True)
class TakeOverMove:
    theirs: TableEntry
    edge_in_ms: float  # upstream -> me
    edge_out_ms: float  # me -> their next hop
    gain_ms: float


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
    before = [
        mine.path_cost_ms,
        their_prefix + theirs.edge_out_ms + theirs.suffix_cost_ms,
    ]
    after = [
        mine.prefix_cost_ms + my_edge_to_their_next_ms + theirs.suffix_cost_ms,
        their_prefix + their_edge_to_my_next_ms + mine.suffix_cost_ms,
    ]
    return move_gain_ms(before, after)


def take_over_gain_ms(theirs: TableEntry, my_edge_in_ms: float, my_edge_out_ms: float) -> float:
    """Gain of carrying a peer's flow myself, between the same upstream and next hop."""
    upstream_prefix = theirs.prefix_cost_ms - theirs.edge_in_ms
    before = theirs.prefix_cost_ms + theirs.edge_out_ms + theirs.suffix_cost_ms
    after = upstream_prefix + my_edge_in_ms + my_edge_out_ms + theirs.suffix_cost_ms
    return move_gain_ms([before], [after])


def is_accepted(gain_ms: float, temperature: float, rng: random.Random) -> bool:
    """Annealing: better moves always; worse ones with probability exp(Δ/T); no-ops never."""
    if not math.isfinite(gain_ms) or gain_ms == 0:
        return False
    if gain_ms > 0:
        return True
    return rng.random() < math.exp(gain_ms / temperature)
