"""Batched, off-the-loop writes for the trio node: many callers, one writer thread, one commit.

A hop waits for its receipt's record (a node hands out a signature only once it is committed,
see ``gwtf.node.store.hops``), but never for the disk alone: requests that arrive while a batch is
being written wait for the next one, so under load each commit carries many hops (group
commit) and the trio loop itself never blocks on the database.

The writer is one long-lived thread fed by a queue, and it hands each batch's results back
with ``TrioToken.run_sync_soon``: a hop's round trip through it costs tens of microseconds of
CPU, where ``trio.to_thread.run_sync`` per batch costs about 200 (a relay writes three times
per hop).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

Item = TypeVar("Item")
Result = TypeVar("Result")


Done = Callable[[Result | None, BaseException | None], None]


@dataclass
class _Pending(Generic[Item, Result]):
    item: Item
    done: trio.Event = field(default_factory=trio.Event)
    result: Result | None = None
    error: BaseException | None = None
    then: Done[Result] | None = None  # a posted item's callback, on the trio thread


_STOP = object()


class BatchWriter(Generic[Item, Result]):
    """Calls ``write(batch)`` in its own thread for batches of what ``submit`` was given; each
    caller gets its item's result. Start ``run`` in the node's nursery. With ``linger_s`` a
    batch waits that long for more after its first item: for writes nobody waits on, fewer
    and larger transactions."""

    def __init__(
        self,
        write: Callable[[Sequence[Item]], list[Result]],
        max_batch: int = 1_000,
        linger_s: float = 0.0,
    ):
        self._write = write
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._queue: queue.SimpleQueue[_Pending[Item, Result] | object] = queue.SimpleQueue()

    async def submit(self, item: Item) -> Result:
        """Queue ``item`` and wait until the batch holding it is written (items queued before
        ``run`` starts wait for it)."""
        pending: _Pending[Item, Result] = _Pending(item)
        self._queue.put(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[return-value]  # set with done, maybe to None

    def post(self, item: Item, then: Done[Result]) -> None:
        """Queue ``item`` without waiting: ``then(result, error)`` runs on the trio thread once
        its batch is written."""
        self._queue.put(_Pending(item, then=then))

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._loop, args=(token,), daemon=True)
        thread.start()
        try:
            await trio.sleep_forever()
        finally:
            self._queue.put(_STOP)  # the thread ends after the batch it is writing

    def _loop(self, token: trio.lowlevel.TrioToken) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            if self._linger_s:
                time.sleep(self._linger_s)
            batch: list[_Pending[Item, Result]] = [first]  # type: ignore[list-item]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)  # type: ignore[arg-type]
            self._flush(batch, token)
            if stop:
                return

    def _flush(self, batch: list[_Pending[Item, Result]], token: trio.lowlevel.TrioToken) -> None:
        error: BaseException | None = None
        try:
            results: list[Result | None] = list(self._write([p.item for p in batch]))
        except Exception as exc:  # the database's error is each waiting caller's
            results, error = [None] * len(batch), exc

        def deliver() -> None:
            for pending, result in zip(batch, results, strict=True):
                pending.result, pending.error = result, error
                pending.done.set()
                if pending.then is not None:
                    pending.then(result, error)

        with contextlib.suppress(trio.RunFinishedError):  # the node is gone; nobody waits
            token.run_sync_soon(deliver)
