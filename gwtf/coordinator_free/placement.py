"""Where a relay serves: joining goes to the bottleneck stage, leaving releases its flows.

A new relay raises the swarm's throughput most at the stage that caps the number of microbatches
every iteration can carry (the GWTF paper's joining rule). Capacity is weighted by speed: a node
computes its microbatches one after another, so a slot of a node twice as fast turns over twice
as often, and a stage of slow GPUs is the bottleneck sooner than its slot count says.

A joiner (``choose_bottleneck``) takes the stage with the least live capacity for the flows the
run needs: each stage's live replicas as they describe themselves (capacity, compute time), their
fastest slots counted up to the data nodes' demand (slots no flow can fill add nothing). It does
not read flows carried now: a stage that lost a replica carries fewer flows, not more, so
"flow / capacity" ranks it no higher than a full stage, and momentary loads move with every
iteration's start and end. Initial placement (``place_relays``) adds relays one by one to the
stage of highest demand / speed-weighted capacity (``choose_stage`` on ``stage_loads``, which can
also rank stages by the flows they carry): nothing is routed yet and no stage has lost a replica.
Leaving is ``FlowNode.leave``: it pushes its flows back upstream and cancels them downstream.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gwtf.coordinator_free.flow_errors import PlacementError

#: Speed-weighted capacity counts slots per second of compute time; a node that declares no
#: compute time (0) counts as very fast rather than dividing by zero.
_MS_PER_S = 1000.0
_MIN_COMPUTE_MS = 1e-3


def slots_per_s(capacity: int, compute_ms: float) -> float:
    """A node's capacity weighted by its speed: how often its slots turn over per second."""
    return capacity * _MS_PER_S / max(compute_ms, _MIN_COMPUTE_MS)


#: The most a relay believes a same-stage peer is faster than itself (GPU generations differ by
#: a few times; the grid's fastest and slowest by 2.9).
MAX_SPEED_RATIO = 4.0


def offered_slots(
    capacity: int, compute_ms: float, fastest_compute_ms: float, slot_speed_scale: float
) -> int:
    """How many of its ``capacity`` slots a relay offers, given the fastest same-stage compute
    time it knows: ``min(capacity, max(1, round(capacity x fastest / mine x scale)))``.

    A relay computes its microbatches one after another, so a slot on a slow GPU holds its
    microbatch longer than one on a fast GPU, while a max flow fills every slot offered: with
    every slot offered, relays at speed 0.35 carried as many flows as those at 1.0 and each
    iteration waited for them. A scale of 0 (or no compute time) offers every slot; so does a
    relay as fast as the fastest when the scale is at least 1, so equal GPUs change nothing.
    """
    if slot_speed_scale <= 0 or compute_ms <= 0:
        return capacity
    fastest_ms = min(max(fastest_compute_ms, 0.0), compute_ms) or compute_ms
    # A peer's speed is its own claim: one claiming to be far faster cuts the offer only so far.
    fastest_ms = max(fastest_ms, compute_ms / MAX_SPEED_RATIO)
    return max(1, min(capacity, round(capacity * fastest_ms / compute_ms * slot_speed_scale)))


@dataclass(frozen=True, slots=True)
class StageLoad:
    """What a stage carries (microbatches in flight, or demand) against what it can hold.

    ``capacity`` counts slots; ``slots_per_s`` weights each replica's slots by its speed
    (``slots_per_s()``), which is what the pressure compares.
    """

    stage: int
    flows: int
    capacity: int
    slots_per_s: float

    @property
    def pressure(self) -> float:
        """flow / speed-weighted capacity; an empty stage is infinitely pressed."""
        if self.slots_per_s <= 0:
            return math.inf
        return self.flows / self.slots_per_s


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
    best = min(loads, key=lambda load: (-load.pressure, load.slots_per_s, load.stage))
    reason = (
        f"stage {best.stage} is the bottleneck: {best.flows} flows on capacity {best.capacity} "
        f"({best.slots_per_s:.3g} slots/s)"
    )
    return JoinDecision(best.stage, best.pressure, reason)


#: What a replica announces: (stage, flows it carries, capacity, compute ms per microbatch).
Replica = tuple[int, int, int, float]


def stage_loads(stages: int, replicas: Iterable[Replica], demand: int) -> list[StageLoad]:
    """Per-stage loads from the live replicas' announcements; demand fills idle stages.

    ``demand`` is the microbatches the data nodes want per round (their summed capacity); a stage
    that carries no flows yet is charged that demand, so placement works before routing starts.
    """
    totals = _StageTotals(stages)
    for replica in replicas:
        totals.add(replica)
    return totals.loads(demand)


class _StageTotals:
    """Running per-stage sums of flows, capacity and speed-weighted capacity."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.flows = dict.fromkeys(range(1, stages + 1), 0)
        self.capacity = dict.fromkeys(range(1, stages + 1), 0)
        self.weighted = dict.fromkeys(range(1, stages + 1), 0.0)

    def add(self, replica: Replica) -> None:
        stage, stage_flows, stage_capacity, compute_ms = replica
        if stage in self.flows:
            self.flows[stage] += stage_flows
            self.capacity[stage] += stage_capacity
            self.weighted[stage] += slots_per_s(stage_capacity, compute_ms)

    def loads(self, demand: int) -> list[StageLoad]:
        routed = any(self.flows.values())
        return [
            StageLoad(
                stage,
                self.flows[stage] if routed else demand,
                self.capacity[stage],
                self.weighted[stage],
            )
            for stage in range(1, self.stages + 1)
        ]


def place_relays(
    stages: int,
    placed: Iterable[Replica],
    newcomers: Sequence[tuple[str, int, float]],
    demand: int,
) -> dict[str, int]:
    """Stages for relays that start unplaced: each in turn goes to the current bottleneck.

    ``newcomers`` is (node id, capacity, compute ms) in the order they decide (the fastest and
    largest first gives the most even result, but the caller chooses). Deterministic. The sums
    grow with each newcomer in the order ``stage_loads`` would add them up (same floats).
    """
    totals = _StageTotals(stages)
    for replica in placed:
        totals.add(replica)
    chosen: dict[str, int] = {}
    for node_id, capacity, compute_ms in newcomers:
        decision = choose_stage(totals.loads(demand))
        chosen[node_id] = decision.stage
        totals.add((decision.stage, 0, capacity, compute_ms))
    return chosen


#: What a live replica says of itself to a joiner: (stage, capacity, compute ms per microbatch).
LiveReplica = tuple[int, int, float]


@dataclass(frozen=True, slots=True)
class StageCapacity:
    """A stage's live replicas against the flows the run needs (``demand``).

    ``usable_slots_per_s`` is what the stage can turn over of the demand: its fastest slots,
    speed-weighted, up to ``demand`` slots (all of them when the demand is unknown, 0).
    """

    stage: int
    replicas: int
    capacity: int
    slots_per_s: float
    usable_slots_per_s: float


def stage_capacities(
    stages: int, replicas: Iterable[LiveReplica], demand: int
) -> list[StageCapacity]:
    """Per-stage live capacity of ``replicas`` (each node once) for ``demand`` flows."""
    members: dict[int, list[tuple[int, float]]] = {stage: [] for stage in range(1, stages + 1)}
    for stage, capacity, compute_ms in replicas:
        if stage in members and capacity > 0:
            members[stage].append((capacity, compute_ms))
    return [_stage_capacity(stage, members[stage], demand) for stage in range(1, stages + 1)]


def _stage_capacity(stage: int, members: list[tuple[int, float]], demand: int) -> StageCapacity:
    # Flows are routed to the cheapest next hop, so the demand fills the fastest slots first;
    # sorted (then summed) in one order, so equal inputs give bit-equal floats.
    fastest_first = sorted(members, key=lambda m: (max(m[1], _MIN_COMPUTE_MS), -m[0]))
    left: float = demand if demand > 0 else math.inf
    usable = 0.0
    for capacity, compute_ms in fastest_first:
        used = min(capacity, left)
        if used <= 0:
            break
        usable += slots_per_s(int(used), compute_ms)
        left -= used
    return StageCapacity(
        stage,
        len(members),
        sum(capacity for capacity, _ in members),
        sum(slots_per_s(capacity, compute_ms) for capacity, compute_ms in fastest_first),
        usable,
    )


def choose_bottleneck(
    stages: int,
    replicas: Iterable[LiveReplica],
    demand: int,
    allowed: Collection[int] | None = None,
) -> JoinDecision:
    """The stage a joiner takes: the least usable live capacity for ``demand`` flows. Ties go to
    the least capacity in all (speed-weighted, then slots), then to fewer replicas (one crash
    there takes more of the stage), then to the lower stage. An empty stage comes first.
    ``allowed``: the stages the joiner can hold (e.g. those that fit its memory); None: all."""
    if stages < 1:
        raise PlacementError("no stage to choose from: the run has no relay stages")
    loads = stage_capacities(stages, replicas, demand)
    if allowed is not None:
        loads = [load for load in loads if load.stage in allowed]
        if not loads:
            raise PlacementError("none of the run's stages is one this joiner can hold")
    best = min(
        loads,
        key=lambda s: (s.usable_slots_per_s, s.slots_per_s, s.capacity, s.replicas, s.stage),
    )
    pressure = demand / best.usable_slots_per_s if best.usable_slots_per_s > 0 else math.inf
    replicas_word = "replica" if best.replicas == 1 else "replicas"
    reason = (
        f"stage {best.stage} is the bottleneck: {best.replicas} live {replicas_word} of capacity "
        f"{best.capacity} for the {demand} flows the run needs "
        f"({best.usable_slots_per_s:.3g} usable slots/s)"
    )
    return JoinDecision(best.stage, pressure, reason)
