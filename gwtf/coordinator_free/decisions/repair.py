"""A stalled microbatch: which node stands in for a dead hop of its backward, and whether to wait
on it one more stall deadline or start it over.

``plan_hop_repair``: a backward whose receiver at ``stage`` of ``path`` (origin, relays 1..S,
sink) is dead is repaired at that hop alone. A stand-in of the stage (``hops.stand_in``, or what
the caller chooses) gets the lost hop's input again from the node before it (``upstream``
re-sends its buffered forward output, which the stand-in recomputes) and then the gradient from
the node after it (``downstream``); nothing else is recomputed. None: no stand-in is known (or
the stage is the origin's, which nobody can stand in for); the caller restarts the microbatch.

``keep_waiting``: at each stall deadline a microbatch has passed, it is waited on one deadline
more while there is progress to wait for (live: a trace found it alive somewhere or a hop was
just repaired; simulated: a re-sent or repaired hop is still within its ack deadline), for at
most ``MAX_STALL_DEADLINES`` deadlines in all; else it starts over: two dead hops in a row, or a
repair after its probe, outlast one deadline, and a restart would drop work about to succeed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Stall deadlines a microbatch may pass while it makes progress before it starts over (ours).
MAX_STALL_DEADLINES = 4


@dataclass(frozen=True, slots=True)
class HopRepair:
    """Recompute ``stage`` on ``replacement`` instead of ``dead``: ``upstream`` re-sends its
    buffered output to it, then ``downstream`` its gradient."""

    stage: int
    dead: str
    replacement: str
    upstream: str
    downstream: str


def plan_hop_repair(
    path: Sequence[str], stage: int, choose_replacement: Callable[[int, str], str | None]
) -> HopRepair | None:
    """The one-hop repair of ``stage`` on ``path`` (module docstring), or None."""
    if not 1 <= stage <= len(path) - 2:
        return None
    dead = path[stage]
    replacement = choose_replacement(stage, dead)
    if replacement is None or replacement == dead:
        return None
    return HopRepair(stage, dead, replacement, path[stage - 1], path[stage + 1])


def keep_waiting(deadlines: int, progress: bool) -> bool:
    """Whether a microbatch that has passed ``deadlines`` stall deadlines (this one included) is
    waited on one more; False: start it over."""
    return progress and deadlines < MAX_STALL_DEADLINES
