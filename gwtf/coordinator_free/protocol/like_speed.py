"""Pipelines of like GPUs: the speed-gap terms of choosing a next hop and of judging a move.

A flow carries one microbatch at a time, so its rate is one over its path's time, and the swarm's
rate is the sum of its flows' rates. That sum is convex in the path times: two flows through a
fast and a slow GPU per stage, paired fast with fast and slow with slow, carry more than the same
GPUs paired across (1/1200 + 1/3428 > 2/2314 microbatches per ms with GPUs of 600 and 1714 ms),
and the data nodes give the fast flows more microbatches. The annealing's own objective (the
slowest path, ``annealing.move_gain_ms``) does the opposite: it spreads slow GPUs over every flow.

So an edge from node i to node j counts ``k x |c_i - c_j|`` ms more (c: compute ms per microbatch,
from each peer's ``Hello``), when a node picks a next hop (``hop_penalties_ms``) and when a move is
judged (``swap_speed_gain_ms``, ``take_over_speed_gain_ms``). A path's sum of these gaps is at least
its spread (slowest minus fastest GPU), and each node sees the gaps of its own edges, so no new
message is needed. The terms never enter advertised or reported costs, which stay what a flow
takes. With equal compute times every term is exactly 0, so equal GPUs route as before.

The weight is ``FlowConfig.like_speed_weight``, 0 (off) by default: the argument above holds
while flows are fewer than the microbatches an iteration sends, so each flow carries several.
Where flows outnumber them each carries about one, the slowest path sets the iteration, and the
annealing's min-max is the right objective: there pipelines of like GPUs made the simulator's
swarms 21-32 % slower (bench/README.md, sim_compare, measures both regimes).
"""

from __future__ import annotations

from collections.abc import Iterable


def speed_gap_ms(compute_a_ms: float, compute_b_ms: float) -> float:
    """How unlike two GPUs are: the difference of their compute times per microbatch."""
    return abs(compute_a_ms - compute_b_ms)


def hop_penalties_ms(
    my_compute_ms: float, peers: Iterable[tuple[str, float]], weight: float
) -> dict[str, float]:
    """What each candidate next hop costs more for its speed gap: ``weight x (gap - least gap)``.

    ``peers`` is (peer id, compute ms). The best matched peer costs 0 more, so among peers as
    unlike this node as each other (all of a stage alike: the data nodes' next hops in a swarm of
    equal relays) nothing changes, not even by rounding. Empty when ``weight`` is 0.
    """
    if weight <= 0:
        return {}
    gaps = {peer_id: speed_gap_ms(my_compute_ms, ms) for peer_id, ms in peers}
    least = min(gaps.values(), default=0.0)
    return {peer_id: weight * (gap - least) for peer_id, gap in gaps.items() if gap != least}


def swap_speed_gain_ms(
    mine_ms: float, theirs_ms: float, my_next_ms: float, their_next_ms: float, weight: float
) -> float:
    """The drop of the two flows' speed gaps when two same-stage nodes swap next hops."""
    before = speed_gap_ms(mine_ms, my_next_ms) + speed_gap_ms(theirs_ms, their_next_ms)
    after = speed_gap_ms(mine_ms, their_next_ms) + speed_gap_ms(theirs_ms, my_next_ms)
    return _weighted_drop(before, after, weight)


def take_over_speed_gain_ms(
    upstream_ms: float, theirs_ms: float, mine_ms: float, next_ms: float, weight: float
) -> float:
    """The drop of a flow's speed gaps when this node carries it instead of a same-stage peer."""
    before = speed_gap_ms(upstream_ms, theirs_ms) + speed_gap_ms(theirs_ms, next_ms)
    after = speed_gap_ms(upstream_ms, mine_ms) + speed_gap_ms(mine_ms, next_ms)
    return _weighted_drop(before, after, weight)


def _weighted_drop(before_ms: float, after_ms: float, weight: float) -> float:
    """``weight x (before - after)``; exactly 0 when off or when nothing changed."""
    return weight * (before_ms - after_ms) if weight > 0 and before_ms != after_ms else 0.0
