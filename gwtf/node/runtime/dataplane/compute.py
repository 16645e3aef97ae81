"""Running torch work off the trio loop: one worker thread at a time per node."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from gwtf.errors import ProtocolError, TrainingError

T = TypeVar("T")


async def in_worker_thread(limiter: trio.CapacityLimiter, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` in a worker thread; an engine error on a peer's tensor is the peer's."""
    try:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)
    except TrainingError as exc:
        raise ProtocolError(str(exc)) from exc
