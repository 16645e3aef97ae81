"""SWARM parallelism (Ryabinin, Dettmers, Diskin, Borzunov; ICML 2023) as released
(``yandex-research/swarm``, ``swarm/pipeline``), as a simulator policy. Every modelling choice,
with its source and its measured effect, is tabled in ``baselines/README.md``.

* **The trainer calls every stage itself** (``src/moe/client/balanced_expert.py``): a forward
  is a call from the trainer to one peer of the stage, whose output comes back to the trainer;
  the backward is another call, with the stage's input and output gradient, to any peer of the
  stage, chosen afresh. Servers keep no activations: each backward re-runs the stage's forward
  (``src/moe/server/expert_backend.py``, ``backward``). Here: ``client_routed``.
* **No global barrier.** A trainer (``train_pipeline.py``, batch size 1) sends its next sample
  as soon as the last one is done; each stage's servers average when the swarm has processed
  the target batch (``CollaborativeOptimizer``, ``--averaging_target_batch_size``), inside the
  backward call (``expert_backend.py:178-188``). Here: ``iteration_barrier = False``.
* **Stochastic wiring by a load balancer** per trainer and stage (``swarm_balancer.py``).
* **Timeouts as shipped**: forward 30 s, backward 2.5 × 30 s (``swarm/train_pipeline.py:21-22``);
  other values are options. A call that misses its deadline goes to another peer of the stage,
  and the failed peer is banned by that trainer until it announces itself again. The release
  bans on a failed call and only retries on a deadline; a crash (the failure simulated here)
  shows as a deadline, and is banned like the connection error it gives a live trainer.
* **8-bit activations**, an option: the release's servers run with ``--compression
  BLOCKWISE_8BIT`` (``swarm/setup_and_launch_server.sh:27``): half the bytes of bf16.
* **Rebalancing**, an option off by default: the paper describes it (Sec. 3.2) but the release
  has no code for it (servers serve the stage of ``--expert_pattern`` for life). When on, every
  ``rebalance_period_s`` one peer moves from the stage with the most throughput per unit of work
  to the one with the least, if that narrows the gap; it downloads the new stage's weights
  first. Joining peers always go to the stage with the least announced throughput.
* The trainer (the data node that injected the microbatch) computes the loss.

Knowledge: each trainer's own observations; stage membership as announced (a DHT in SWARM).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from gwtf.coordinator_free.baselines.common import balanced_placement, unplaced_relays
from gwtf.coordinator_free.baselines.swarm_balancer import Balancer
from gwtf.coordinator_free.sim.policy import (
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
    WorldView,
)

FORWARD_TIMEOUT_S = 30.0
BACKWARD_TIMEOUT_S = 2.5 * FORWARD_TIMEOUT_S
#: A backward call's expected time in forward calls (``BalancedRemoteExpert``'s multiplier).
BACKWARD_TASK_SIZE = 2.5
#: The rebalancing period when rebalancing is turned on (the paper leaves it as a parameter).
REBALANCE_PERIOD_S = 300.0
#: Blockwise 8-bit quantisation of bf16: one byte per value, plus a 4-byte scale per block of
#: 4,096 values (bitsandbytes' blockwise quantisation).
BLOCKWISE_8BIT_RATIO = 0.5 * (1.0 + 4.0 / 4096.0)


class SwarmPolicy(PolicyDefaults):
    """SWARM as released: client-routed calls, its balancer, bans with re-dispatch, rebalancing."""

    name: ClassVar[str] = "swarm"
    client_routed: ClassVar[bool] = True

    def __init__(
        self,
        forward_timeout_s: float = FORWARD_TIMEOUT_S,
        backward_timeout_s: float | None = None,
        rebalance_period_s: float | None = None,
        compress_8bit: bool = False,
        barrier: bool = False,
    ) -> None:
        """``backward_timeout_s`` defaults to 2.5 x the forward one, as released;
        ``rebalance_period_s`` None: no rebalancing (as released); ``barrier``: impose the
        engine's global iteration barrier, which the release does not have (an ablation)."""
        backward = 2.5 * forward_timeout_s if backward_timeout_s is None else backward_timeout_s
        self._timing = PolicyTiming(forward_timeout_s, backward)
        self._rebalance_period_s = rebalance_period_s
        self.activation_wire_ratio = BLOCKWISE_8BIT_RATIO if compress_8bit else 1.0
        self.iteration_barrier = barrier
        #: (trainer, stage) -> that trainer's balancer over the stage
        self._balancers: dict[tuple[str, int], Balancer] = {}
        self._rng = random.Random(0)
        self._last_rebalance_s = 0.0

    def timing(self) -> PolicyTiming:
        return self._timing

    # ---- membership ----

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        self._rng = random.Random(rng.random())
        return balanced_placement(world, unplaced_relays(world))

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        totals = self._stage_throughput(world, exclude=node_id)
        return min(totals, key=lambda s: (totals[s], s))

    # ---- calls ----

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        if mb.stage == world.stages:
            return Forward(mb.origin)
        peer = self.pick(world, node_id, mb.stage + 1, 1.0, now)
        return Forward(peer) if peer is not None else Hold()

    def choose_backward_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> RepairDecision:
        stage = mb.stage - 1
        peer = self.pick(world, node_id, stage, BACKWARD_TASK_SIZE, now)
        return Replace(stage, peer) if peer is not None else Hold()

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Action]:
        if world.spec(report.receiver).role != "relay":
            return ()
        size = 1.0 if report.direction == "forward" else BACKWARD_TASK_SIZE
        balancer = self._balancer(report.sender, report.stage)
        balancer.observe(report.receiver, size, report.acked_at_s - report.sent_at_s)
        return ()

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        self._balancer(node_id, mb.stage + 1).ban(suspect, now)
        return self.choose_next_hop(world, node_id, mb, now)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        self._balancer(node_id, mb.stage - 1).ban(suspect, now)
        return self.choose_backward_hop(world, node_id, mb, now)

    def pick(
        self, world: WorldView, trainer: str, stage: int, task_size: float, now: float
    ) -> str | None:
        """The peer of ``stage`` the trainer's balancer gives this call to (None: no peer)."""
        balancer = self._balancer(trainer, stage)
        while True:
            peer = balancer.pick(
                task_size, lambda: world.nodes_in_stage(stage), world.announced_at, now
            )
            if peer is None or world.stage_of(peer) == stage:
                return peer
            # It moved to another stage since the view was refreshed: the call fails at once
            # (the peer no longer serves this stage) and the balancer bans it, as released.
            balancer.ban(peer, now)

    # ---- rebalancing ----

    def on_iteration_end(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        period = self._rebalance_period_s
        if period is None or now - self._last_rebalance_s < period:
            return ()
        self._last_rebalance_s = now
        move = self.rebalancing_move(world)
        return (move,) if move is not None else ()

    def rebalancing_move(self, world: WorldView) -> MoveStage | None:
        """One peer from the stage of most announced throughput to the one of least, if that
        narrows the gap."""
        totals = self._stage_throughput(world)
        richest = max(totals, key=lambda s: (totals[s], -s))
        poorest = min(totals, key=lambda s: (totals[s], s))
        peers = [p for p in world.nodes_in_stage(richest) if not self._banned_anywhere(world, p)]
        if richest == poorest or len(peers) < 2:
            return None
        gap = totals[richest] - totals[poorest]
        # Move the peer whose throughput best halves the gap, and only if the gap narrows.
        best = min(peers, key=lambda p: (abs(gap / 2 - self._announced(world, p)), p))
        if self._announced(world, best) >= gap:
            return None
        return MoveStage(best, poorest)

    # ---- helpers ----

    def _balancer(self, trainer: str, stage: int) -> Balancer:
        balancer = self._balancers.get((trainer, stage))
        if balancer is None:
            balancer = self._balancers[(trainer, stage)] = Balancer(self._rng)
        return balancer

    @staticmethod
    def _announced(world: WorldView, peer: str) -> float:
        return 1000.0 / world.compute_ms(peer)

    def _banned_anywhere(self, world: WorldView, peer: str) -> bool:
        return any(b.is_banned(peer, world.announced_at) for b in self._balancers.values())

    def _stage_throughput(self, world: WorldView, exclude: str | None = None) -> dict[int, float]:
        totals = {}
        for stage in range(1, world.stages + 1):
            peers = [
                p
                for p in world.nodes_in_stage(stage)
                if p != exclude and not self._banned_anywhere(world, p)
            ]
            totals[stage] = sum(self._announced(world, p) for p in peers)
        return totals
