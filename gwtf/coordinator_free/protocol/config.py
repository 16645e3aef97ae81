"""The parameters of the flow protocol and the identity of one node.

Defaults are the values seen in the GWTF authors' 2024 prototype unless a comment names another
source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gwtf.coordinator_free.flow_errors import FlowConfigError
from gwtf.coordinator_free.wire import MAX_ITEMS, Message

DATA = "data"
RELAY = "relay"
#: Data nodes sit at stage 0 (they hold the embedding and the head with the loss).
DATA_STAGE = 0


@dataclass(frozen=True, slots=True)
class FlowConfig:
    """Protocol parameters shared by every node of one training run."""

    stages: int
    activation_bytes: float
    decision_period_s: float = 2.0
    # Ours: relative, a worse move passes with probability exp((Δ / path cost) / T); 0 is
    # greedy (``annealing.is_accepted``). The prototype's 1.7 relays / 2.0 data nodes divided
    # Δ in ms, about 3e-4 in these units. 0.001 took near-ties and measured best on the grid's
    # tuning seeds; 0 and 0.003-0.3 lower (gwtf/coordinator_free/README.md, Moves).
    relay_temperature: float = 0.001
    data_temperature: float = 0.001
    cooling: float = 0.95
    anneal_probability_needing: float = 0.3
    anneal_probability_idle: float = 0.1
    # Ours: annealing ends. An idle node whose rounds keep finding no move at all (while its
    # flows and neighbours stay the same) halves its idle move chance per such round, down to
    # 1 / this; a move found or any change restores it. 1 keeps the prototype's rate for good.
    anneal_backoff_max: int = 8
    unmatched_timeout_periods: int = 12
    ack_deadline_s: float = 20.0
    keepalive_interval_s: float = 20.0
    keepalive_timeout_s: float = 5.0
    keepalive_misses: int = 3
    # Ours: bounds on per-node work and memory, so a tick costs O(neighbours + flows).
    max_peers_per_stage: int = 16
    # Ours: upstream (previous-stage) peers kept. Larger, because a stage's nodes pick their
    # next hops among the cheapest few, so fan-in concentrates: a node that turned upstream
    # introductions away would leave some upstream nodes with no next hop at all.
    max_upstream_peers: int = 64
    # Ours: what a node assumes of a link before its first measurement.
    default_latency_ms: float = 50.0
    default_bandwidth_gbps: float = 1.0
    # Ours, after Petals (which scores relayed servers' throughput x0.2): the share of a link's
    # bandwidth left when it runs through a circuit relay (two links, and a relay that pumps
    # every byte of both in Python, ~6 MB/s each way); its latency gains the relay's leg
    # (``cost.relayed_latency_ms``). Routing then prefers direct edges where it has them.
    relayed_bandwidth_share: float = 0.2
    # Ours: how often an unchanged advert is repeated (adverts go on change and to new peers;
    # the repeat only covers a lost message: every 15 min, it was 5 and made half of a large
    # swarm's steady-state adverts), and how often slot lists are exchanged. A slot list is
    # also the keep-alive ping to an upstream peer not heard from lately, so its period matches
    # the keep-alive interval (10 x 2 s = 20 s) and the two make one message, not two.
    advert_refresh_periods: int = 450
    reconcile_periods: int = 10
    # Ours: a peer that rejected a slot is not asked again for it for this many periods.
    exclusion_periods: int = 6
    # Ours: a same-stage table older than this is too stale to plan a move with.
    table_max_age_periods: int = 3
    # Ours: an annealing move not answered within this many periods is abandoned.
    move_timeout_periods: int = 2
    # Ours: a relay offers min(capacity, max(1, round(capacity x fastest / mine x scale)))
    # slots, where "fastest" is the least compute_ms among itself and the same-stage peers
    # it knows (their Hello); 0 offers every slot. See ``NodeBase.offered_slots``.
    slot_speed_scale: float = 1.5
    # Ours: pipelines of like GPUs. A flow's edge from node i to node j counts
    # k x |c_i - c_j| ms more when a node picks or reroutes to a next hop and when an
    # annealing move is judged, never in advertised costs; equal compute times make every
    # such term exactly 0. Off (0) by default: it pays only while flows are fewer than the
    # microbatches an iteration sends (each flow then carries several); where every flow
    # carries about one, the slowest path sets the iteration and it costs time. k = 3 with
    # slot_speed_scale 2 measured best where it pays (``protocol/like_speed.py``, and
    # bench/README.md, sim_compare).
    like_speed_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise FlowConfigError(f"stages must be >= 1, got {self.stages}; set the model's stages")
        positive = {
            "activation_bytes": self.activation_bytes,
            "decision_period_s": self.decision_period_s,
            "keepalive_interval_s": self.keepalive_interval_s,
            "keepalive_timeout_s": self.keepalive_timeout_s,
            "default_bandwidth_gbps": self.default_bandwidth_gbps,
            "ack_deadline_s": self.ack_deadline_s,
        }
        for name, value in positive.items():
            if not math.isfinite(value) or value <= 0:
                raise FlowConfigError(f"flow.{name} must be > 0, got {value!r}")
        if not math.isfinite(self.slot_speed_scale) or self.slot_speed_scale < 0:
            raise FlowConfigError(
                f"flow.slot_speed_scale must be >= 0 (0 offers every slot), "
                f"got {self.slot_speed_scale!r}"
            )
        if not math.isfinite(self.like_speed_weight) or self.like_speed_weight < 0:
            raise FlowConfigError(
                f"flow.like_speed_weight must be >= 0 (0 switches it off), "
                f"got {self.like_speed_weight!r}"
            )
        for name in ("relay_temperature", "data_temperature"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise FlowConfigError(f"flow.{name} must be >= 0 (0 is greedy), got {value!r}")
        share = self.relayed_bandwidth_share
        if not 0 < share <= 1:
            raise FlowConfigError(f"flow.relayed_bandwidth_share must be in (0, 1], got {share!r}")
        if not 0 < self.cooling <= 1:
            raise FlowConfigError(f"flow.cooling must be in (0, 1], got {self.cooling!r}")
        for name in ("anneal_probability_needing", "anneal_probability_idle"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise FlowConfigError(f"flow.{name} must be in [0, 1], got {value!r}")
        counts = (
            "unmatched_timeout_periods",
            "anneal_backoff_max",
            "keepalive_misses",
            "max_peers_per_stage",
            "max_upstream_peers",
            "advert_refresh_periods",
            "reconcile_periods",
            "exclusion_periods",
            "table_max_age_periods",
            "move_timeout_periods",
        )
        for name in counts:
            if getattr(self, name) < 1:
                raise FlowConfigError(f"flow.{name} must be >= 1, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Who a node is: its id, role, stage (0 for data nodes), capacity and compute time."""

    node_id: str
    role: str
    stage: int
    capacity: int
    compute_ms: float

    def validate(self, config: FlowConfig) -> None:
        if self.role not in (DATA, RELAY):
            raise FlowConfigError(f"node role must be 'data' or 'relay', got {self.role!r}")
        if self.role == DATA and self.stage != DATA_STAGE:
            raise FlowConfigError(f"data node {self.node_id} must have stage 0, got {self.stage}")
        if self.role == RELAY and not 1 <= self.stage <= config.stages:
            raise FlowConfigError(
                f"relay {self.node_id} stage {self.stage} is outside 1..{config.stages}"
            )
        if not 1 <= self.capacity <= MAX_ITEMS:
            raise FlowConfigError(
                f"node {self.node_id} capacity must be in 1..{MAX_ITEMS}, got {self.capacity}"
            )
        if not math.isfinite(self.compute_ms) or self.compute_ms < 0:
            raise FlowConfigError(f"node {self.node_id} compute_ms must be >= 0")


def next_stage(stage: int, stages: int) -> int:
    """The stage a flow goes to from ``stage``: 1 after the data nodes, data after the last."""
    return DATA_STAGE if stage == stages else stage + 1


def previous_stage(stage: int, stages: int) -> int:
    """The stage a flow comes from into ``stage``: data before stage 1, the last before data."""
    return stages if stage == DATA_STAGE else stage - 1


@dataclass(frozen=True, slots=True)
class Outbound:
    """A message the node wants sent to ``to``."""

    to: str
    message: Message
