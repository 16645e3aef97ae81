"""Where a relay serves: joining goes to the bottleneck stage, leaving releases its flows.

A new relay raises the swarm's throughput most at the stage whose load is highest relative to its
capacity (flow / capacity): that stage caps the number of microbatches every iteration can carry
(DESIGN.md §2, after the GWTF paper). Loads come from what peers announce in their introductions
(``Hello.flows`` and ``Hello.capacity``); before any flow is routed, a stage's load is the data
nodes' demand, so the stage with the least capacity is chosen. Leaving is
``FlowNode.leave``: it pushes its flows back upstream and cancels them downstream.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coordinator_free.flow_errors import PlacementError


@dataclass(frozen=True, slots=True)
class StageLoad:
    """What a stage carries (microbatches in flight, or demand) against what it can hold."""

    stage: int
    flows: int
    capacity: int

    @property
    def pressure(self) -> float:
        """flow / capacity; an empty stage is infinitely pressed (nothing passes it)."""
        if self.capacity <= 0:
            return math.inf
        return self.flows / self.capacity


@dataclass(frozen=True, slots=True)
class JoinDecision:
    """The stage a joining relay takes and why (the node announces it in its introduction)."""

    stage: int
    pressure: float
    reason: str


def choose_stage(loads: Sequence[StageLoad]) -> JoinDecision:
    """The bottleneck: highest flow/capacity; ties go to less capacity, then the lower stage."""
    if not loads:
        raise PlacementError("no stage loads to choose from; introduce the node to peers first")
    best = min(loads, key=lambda load: (-load.pressure, load.capacity, load.stage))
    reason = f"stage {best.stage} is the bottleneck: {best.flows} flows on capacity {best.capacity}"
    return JoinDecision(best.stage, best.pressure, reason)


def stage_loads(
    stages: int, replicas: Iterable[tuple[int, int, int]], demand: int
) -> list[StageLoad]:
    """Per-stage loads from (stage, flows, capacity) of live replicas; demand fills idle stages.

    ``demand`` is the microbatches the data nodes want per round (their summed capacity); a stage
    that carries no flows yet is charged that demand, so placement works before routing starts.
    """
    flows = dict.fromkeys(range(1, stages + 1), 0)
    capacity = dict.fromkeys(range(1, stages + 1), 0)
    for stage, stage_flows, stage_capacity in replicas:
        if stage in flows:
            flows[stage] += stage_flows
            capacity[stage] += stage_capacity
    routed = any(flows.values())
    return [
        StageLoad(stage, flows[stage] if routed else demand, capacity[stage])
        for stage in range(1, stages + 1)
    ]


def place_relays(
    stages: int,
    placed: Iterable[tuple[int, int, int]],
    newcomers: Sequence[tuple[str, int]],
    demand: int,
) -> dict[str, int]:
    """Stages for relays that start unplaced: each in turn goes to the current bottleneck.

    ``newcomers`` is (node id, capacity) in the order they decide (largest capacity first gives
    the most even result, but the caller chooses). Deterministic: no randomness is needed.
    """
    replicas = list(placed)
    chosen: dict[str, int] = {}
    for node_id, capacity in newcomers:
        decision = choose_stage(stage_loads(stages, replicas, demand))
        chosen[node_id] = decision.stage
        replicas.append((decision.stage, 0, capacity))
    return chosen
