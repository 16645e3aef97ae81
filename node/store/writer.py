"""Batched, off-the-loop writes for the trio node: many callers, one worker thread, one commit.

A hop waits for its receipt's record (a node hands out a signature only once it is committed,
see ``node.store.hops``), but never for the disk alone: requests that arrive while a batch is
being written wait for the next one, so under load each commit carries many hops (group
commit) and the trio loop itself never blocks on the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Pending(Generic[Item, Result]):
    item: Item
    done: trio.Event = field(default_factory=trio.Event)
    result: Result | None = None
    error: BaseException | None = None


class BatchWriter(Generic[Item, Result]):
    """Calls ``write(batch)`` in a worker thread for batches of what ``submit`` was given; each
    caller gets its item's result. Start ``run`` in the node's nursery."""

    def __init__(self, write: Callable[[Sequence[Item]], list[Result]], max_batch: int = 1_000):
        self._write = write
        self._max_batch = max_batch
        self._queue: list[_Pending[Item, Result]] = []
        self._wake = trio.Event()

    async def submit(self, item: Item) -> Result:
        """Queue ``item`` and wait until the batch holding it is written."""
        pending: _Pending[Item, Result] = _Pending(item)
        self._queue.append(pending)
        self._wake.set()
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._queue:
                batch, self._queue = (
                    self._queue[: self._max_batch],
                    self._queue[self._max_batch :],
                )
                await self._flush(batch)

    async def _flush(self, batch: list[_Pending[Item, Result]]) -> None:
        try:
            results = await trio.to_thread.run_sync(self._write, [p.item for p in batch])
        except Exception as exc:  # the database's error is each waiting caller's
            for pending in batch:
                pending.error = exc
                pending.done.set()
            return
        for pending, result in zip(batch, results, strict=True):
            pending.result = result
            pending.done.set()
