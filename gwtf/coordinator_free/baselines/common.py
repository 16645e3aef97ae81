"""Small helpers the baselines share: throughput-balanced stage placement and weighted choice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gwtf.coordinator_free.placement import place_relays
from gwtf.coordinator_free.sim.policy import WorldView


def balanced_placement(world: WorldView, relays: Sequence[str]) -> dict[str, int]:
    """Assign relays to stages so that every stage gets about the same speed-weighted capacity.

    The one placement greedy of the core (``placement.place_relays``: each relay in turn to the
    stage of least speed-weighted capacity for the same demand), fastest relay first. Relays that
    already have a stage count toward their stage.
    """
    placed = [
        (stage, 0, world.spec(n).capacity, world.compute_ms(n))
        for n in world.known_nodes()
        if world.spec(n).role == "relay"
        and (stage := world.stage_of(n)) is not None
        and n not in relays
    ]
    newcomers = [
        (n, world.spec(n).capacity, world.compute_ms(n))
        for n in sorted(relays, key=lambda n: (-world.spec(n).speed, n))
    ]
    return place_relays(world.stages, placed, newcomers, demand=1)


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
