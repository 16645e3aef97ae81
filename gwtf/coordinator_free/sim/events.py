"""The engine's vocabulary: event kinds, compute task kinds, run limits and trace records."""

from __future__ import annotations

from dataclasses import dataclass

# Event kinds. Plain ints keep the heap tuples cheap to compare and dispatch.
ARRIVE_FWD, ARRIVE_BWD, ARRIVE_REPAIR, COMPUTE_DONE, ACK = 0, 1, 2, 3, 4
FWD_DEADLINE, BWD_DEADLINE, STALL, REPAIR_START, RESTART = 5, 6, 7, 8, 9
INJECT, RETRY, MESSAGE, TICK, CRASH, JOIN, ALLREDUCE_DONE = 10, 11, 12, 13, 14, 15, 16
PARK_TIMER = 17
#: Client-routed data plane: a relay's output back at the origin; a backward call asked again.
RETURN_FWD, CALL_BWD = 19, 20
#: A deadline kept in its queue (``engine_base``), armed on the heap while it heads the queue.
QUEUED_DEADLINE = 18

# Compute task kinds.
TASK_FWD, TASK_SINK, TASK_BWD, TASK_REPAIR = 0, 1, 2, 3
#: Share of a relay's forward + backward time spent on the forward (backward costs twice as much).
FORWARD_SHARE = 1.0 / 3.0


@dataclass(frozen=True)
class EngineConfig:
    """Limits of one run: simulated time and events processed, to stop a run that cannot finish."""

    max_sim_time_s: float = 36_000.0
    max_events: int | None = None
    record_trace: bool = False


@dataclass(frozen=True)
class ComputeRecord:
    """One executed compute task (kept only with ``record_trace``, for invariant tests)."""

    node_id: str
    incarnation: int
    start_s: float
    end_s: float
