"""Small helpers the baselines share: throughput-balanced stage placement and weighted choice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from coordinator_free.sim.policy import WorldView


def balanced_placement(world: WorldView, relays: Sequence[str]) -> dict[str, int]:
    """Assign relays to stages so that every stage gets about the same total speed.

    Longest-processing-time greedy: fastest relay first, each to the stage with the least total
    speed so far (ties: fewest relays, then lowest stage). Relays that already have a stage count
    toward their stage's total.
    """
    totals = {stage: 0.0 for stage in range(1, world.stages + 1)}
    counts = dict.fromkeys(totals, 0)
    for node_id in world.known_nodes():
        stage = world.stage_of(node_id)
        if world.spec(node_id).role == "relay" and stage is not None and node_id not in relays:
            totals[stage] += world.spec(node_id).speed
            counts[stage] += 1
    placement: dict[str, int] = {}
    for node_id in sorted(relays, key=lambda n: (-world.spec(n).speed, n)):
        stage = min(totals, key=lambda s: (totals[s], counts[s], s))
        placement[node_id] = stage
        totals[stage] += world.spec(node_id).speed
        counts[stage] += 1
    return placement


def weakest_stage(world: WorldView, members: Mapping[int, Iterable[str]]) -> int:
    """The stage whose members have the least total speed (ties: lowest stage number)."""
    totals = {
        stage: sum(world.spec(n).speed for n in members.get(stage, ()))
        for stage in range(1, world.stages + 1)
    }
    return min(totals, key=lambda s: (totals[s], s))


def unplaced_relays(world: WorldView) -> list[str]:
    return [
        n
        for n in world.known_nodes()
        if world.spec(n).role == "relay" and world.stage_of(n) is None
    ]
