"""What a simulated run measures, and the JSON object ``gwtf-sim --json`` prints.

GPU time is counted per compute task actually executed (a task cut by a crash counts up to the
crash). *Useful* GPU time is the compute of the hops on each completed microbatch's final path whose
node was still alive, in the same incarnation, at that iteration's gradient averaging; everything
else is *wasted*, split by cause:

* ``lost_with_replica``: final-path work of a node that died before its iteration's averaging
  (its gradients died with it), and the attempts of an origin that died;
* ``recomputed``: forwards done again by a repair (SWARM as released: every backward);
* ``restarted``: what an attempt had computed when a restart dropped it;
* ``cut_by_crash``: the part of a task a crash interrupted;
* ``superseded``: the rest: hops a recovery replaced (a re-sent forward whose first receiver
  computed it, a repaired hop's backward in flight) and late tasks of dropped attempts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunMetrics:
    """Counters the engine fills in while it runs."""

    algorithm: str
    scenario: str
    seed: int
    iterations_target: int
    iterations_completed: int = 0
    sim_time_s: float = 0.0
    microbatches_injected: int = 0
    microbatches_completed: int = 0
    microbatches_abandoned: int = 0
    restarts: int = 0
    forward_timeouts: int = 0
    backward_timeouts: int = 0
    replacements: int = 0
    stalls: int = 0
    hops_lost: int = 0
    total_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    lost_with_replica_gpu_s: float = 0.0
    recomputed_gpu_s: float = 0.0
    restarted_gpu_s: float = 0.0
    cut_by_crash_gpu_s: float = 0.0
    crashes: int = 0
    #: What each crashed node was computing: a forward, a backward (a repair's recompute and a
    #: sink count as backward: both end in one), or nothing.
    crashes_by_phase: dict[str, int] = field(
        default_factory=lambda: {"forward": 0, "backward": 0, "idle": 0}
    )
    joins: int = 0
    stage_moves: int = 0
    capacity_exceeded: int = 0
    admission_waits: int = 0
    control_messages: int = 0
    control_bytes: int = 0
    events_processed: int = 0
    stopped_reason: str = "finished"
    iteration_end_times_s: list[float] = field(default_factory=list)

    @property
    def wasted_gpu_s(self) -> float:
        # Clamped: useful and total are sums of the same floats in different orders.
        return max(0.0, self.total_gpu_s - self.useful_gpu_s)

    @property
    def superseded_gpu_s(self) -> float:
        named = (
            self.lost_with_replica_gpu_s
            + self.recomputed_gpu_s
            + self.restarted_gpu_s
            + self.cut_by_crash_gpu_s
        )
        return max(0.0, self.wasted_gpu_s - named)

    def waste_by_cause(self) -> dict[str, float]:
        """Wasted GPU seconds per cause (the module docstring names them)."""
        return {
            "lost_with_replica": self.lost_with_replica_gpu_s,
            "recomputed": self.recomputed_gpu_s,
            "restarted": self.restarted_gpu_s,
            "cut_by_crash": self.cut_by_crash_gpu_s,
            "superseded": self.superseded_gpu_s,
        }

    @property
    def throughput_mb_per_s(self) -> float:
        if self.sim_time_s <= 0:
            return 0.0
        return self.microbatches_completed / self.sim_time_s

    def to_json(self) -> dict[str, Any]:
        """The run's summary as a flat JSON object."""
        return {
            "algorithm": self.algorithm,
            "scenario": self.scenario,
            "seed": self.seed,
            "iterations_target": self.iterations_target,
            "iterations_completed": self.iterations_completed,
            "sim_time_s": round(self.sim_time_s, 6),
            "microbatches_injected": self.microbatches_injected,
            "microbatches_completed": self.microbatches_completed,
            "microbatches_abandoned": self.microbatches_abandoned,
            "throughput_mb_per_s": round(self.throughput_mb_per_s, 6),
            "total_gpu_s": round(self.total_gpu_s, 6),
            "useful_gpu_s": round(self.useful_gpu_s, 6),
            "wasted_gpu_s": round(self.wasted_gpu_s, 6),
            "wasted_by_cause_gpu_s": {k: round(v, 6) for k, v in self.waste_by_cause().items()},
            "restarts": self.restarts,
            "forward_timeouts": self.forward_timeouts,
            "backward_timeouts": self.backward_timeouts,
            "replacements": self.replacements,
            "stalls": self.stalls,
            "hops_lost": self.hops_lost,
            "crashes": self.crashes,
            "crashes_by_phase": dict(self.crashes_by_phase),
            "joins": self.joins,
            "stage_moves": self.stage_moves,
            "capacity_exceeded": self.capacity_exceeded,
            "admission_waits": self.admission_waits,
            "control_messages": self.control_messages,
            "control_bytes": self.control_bytes,
            "events_processed": self.events_processed,
            "stopped_reason": self.stopped_reason,
        }
