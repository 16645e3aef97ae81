"""SWARM parallelism (Ryabinin, Dettmers, Diskin, Borzunov; ICML 2023) as a simulator policy.

What SWARM does, and how each part maps here:

* **Stochastic wiring.** Each sender spreads the microbatches it forwards over the next stage's
  peers in proportion to their throughput, by interleaved (smooth) weighted round-robin. The
  weight of a peer is an exponential moving average, α = 0.1, of the throughput the sender
  observes on it (1 / response time of a hop, queueing included), started from the throughput the
  peer announces when it joins (1 / its compute time).
* **Fault tolerance.** A call that misses its deadline (forward 30 s, backward 75 s) marks the peer
  as failed on that sender (for 60 s, or until it rejoins: a live peer keeps announcing itself)
  and is re-dispatched to another peer of the same stage. A failed
  backward is recovered by re-running that stage's forward on a new peer, then its backward
  (``Replace``). SWARM has no capacity negotiation: peers queue what they receive.
* **Adaptive rebalancing.** Every ``rebalance_period_s`` (300 s, our choice: the paper leaves the
  period as a parameter) one peer moves from the stage with the most throughput per unit of work to
  the one with the least, if that narrows the gap; it downloads the new stage's weights first.
  Joining peers go to the stage with the least throughput.
* The trainer (the data node that injected the microbatch) computes the loss, so the sink is the
  origin.

Knowledge: each sender's own observations; stage membership as announced (a DHT in SWARM).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from coordinator_free.baselines.common import balanced_placement, unplaced_relays
from coordinator_free.sim.policy import (
    Action,
    Forward,
    Hold,
    HopDecision,
    HopReport,
    MicrobatchView,
    MoveStage,
    PolicyDefaults,
    PolicyTiming,
    RepairDecision,
    Replace,
    Restart,
    WorldView,
)
from coordinator_free.sim.suspicion import Suspicions

THROUGHPUT_EMA_ALPHA = 0.1
FORWARD_TIMEOUT_S = 30.0
BACKWARD_TIMEOUT_S = 75.0
REBALANCE_PERIOD_S = 300.0


class SwarmPolicy(PolicyDefaults):
    """SWARM's wiring, timeouts with re-dispatch, recompute-on-backward-failure and rebalancing."""

    name: ClassVar[str] = "swarm"

    def __init__(
        self,
        forward_timeout_s: float = FORWARD_TIMEOUT_S,
        backward_timeout_s: float = BACKWARD_TIMEOUT_S,
        rebalance_period_s: float = REBALANCE_PERIOD_S,
        ema_alpha: float = THROUGHPUT_EMA_ALPHA,
    ) -> None:
        self._timing = PolicyTiming(forward_timeout_s, backward_timeout_s)
        self._rebalance_period_s = rebalance_period_s
        self._alpha = ema_alpha
        #: sender -> peer -> EMA of observed throughput (microbatches per second)
        self._throughput: dict[str, dict[str, float]] = {}
        #: (sender, stage) -> peer -> smooth-WRR running credit
        self._credit: dict[tuple[str, int], dict[str, float]] = {}
        self._failed: dict[str, Suspicions] = {}
        self._last_rebalance_s = 0.0

    def timing(self) -> PolicyTiming:
        return self._timing

    # ---- membership ----

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        return balanced_placement(world, unplaced_relays(world))

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        for failed in self._failed.values():
            failed.clear(node_id)
        totals = self._stage_throughput(world, now, exclude=node_id)
        return min(totals, key=lambda s: (totals[s], s))

    def on_node_up(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        for failed in self._failed.values():
            failed.clear(node_id)
        return ()

    # ---- wiring ----

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        if mb.stage == world.stages:
            return Forward(mb.origin)
        peer = self._pick(world, node_id, mb.stage + 1, now)
        return Forward(peer) if peer is not None else Hold()

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Action]:
        if world.spec(report.receiver).role != "relay":
            return ()
        response_s = max(report.acked_at_s - report.sent_at_s, 1e-6)
        table = self._throughput.setdefault(report.sender, {})
        previous = table.get(report.receiver, self._announced(world, report.receiver))
        table[report.receiver] = (1 - self._alpha) * previous + self._alpha / response_s
        return ()

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        self._failed.setdefault(node_id, Suspicions()).mark(suspect, now)
        return self.choose_next_hop(world, node_id, mb, now)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        self._failed.setdefault(node_id, Suspicions()).mark(suspect, now)
        stage = mb.stage - 1
        if stage < 1:
            return Restart()
        peer = self._pick(world, node_id, stage, now)
        return Replace(stage, peer) if peer is not None else Restart()

    # ---- rebalancing ----

    def on_iteration_end(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        if now - self._last_rebalance_s < self._rebalance_period_s:
            return ()
        self._last_rebalance_s = now
        move = self._rebalancing_move(world, now)
        return (move,) if move is not None else ()

    def _rebalancing_move(self, world: WorldView, now: float) -> MoveStage | None:
        totals = self._stage_throughput(world, now)
        richest = max(totals, key=lambda s: (totals[s], -s))
        poorest = min(totals, key=lambda s: (totals[s], s))
        peers = [p for p in world.nodes_in_stage(richest) if not self._failed_anywhere(p, now)]
        if richest == poorest or len(peers) < 2:
            return None
        gap = totals[richest] - totals[poorest]
        # Move the peer whose throughput best halves the gap, and only if the gap narrows.
        best = min(peers, key=lambda p: (abs(gap / 2 - self._announced(world, p)), p))
        if self._announced(world, best) >= gap:
            return None
        return MoveStage(best, poorest)

    # ---- helpers ----

    def _pick(self, world: WorldView, sender: str, stage: int, now: float) -> str | None:
        """Smooth weighted round-robin over the stage's peers not failed for this sender."""
        failed = self._failed.get(sender)
        peers = [
            p
            for p in world.nodes_in_stage(stage)
            if failed is None or not failed.is_suspected(p, now)
        ]
        if not peers:
            return None
        observed = self._throughput.get(sender, {})
        weights = {p: observed.get(p, self._announced(world, p)) for p in peers}
        credit = self._credit.setdefault((sender, stage), {})
        total = sum(weights.values())
        for peer, weight in weights.items():
            credit[peer] = credit.get(peer, 0.0) + weight
        chosen = max(peers, key=lambda p: (credit[p], p))
        credit[chosen] -= total
        return chosen

    @staticmethod
    def _announced(world: WorldView, peer: str) -> float:
        return 1000.0 / world.compute_ms(peer)

    def _failed_anywhere(self, peer: str, now: float) -> bool:
        return any(failed.is_suspected(peer, now) for failed in self._failed.values())

    def _stage_throughput(
        self, world: WorldView, now: float, exclude: str | None = None
    ) -> dict[int, float]:
        totals = {}
        for stage in range(1, world.stages + 1):
            peers = [
                p
                for p in world.nodes_in_stage(stage)
                if p != exclude and not self._failed_anywhere(p, now)
            ]
            totals[stage] = sum(self._announced(world, p) for p in peers)
        return totals
