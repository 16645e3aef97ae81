"""Hosts served on a trio loop of their own thread, for tests that drive them from synchronous
code (a command's ``main``) in the meantime."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import TypeVar

import trio

T = TypeVar("T")


@contextmanager
def served_in_a_thread(hosts: Callable[[], AbstractAsyncContextManager[T]]) -> Iterator[T]:
    """Enter ``hosts()`` (which starts hosts and gives what the test needs of them, e.g. their
    addresses) on a trio loop in a thread; they serve until the block ends."""
    entered: queue.Queue[T] = queue.Queue()
    stop = threading.Event()

    async def serve() -> None:
        async with hosts() as value:
            entered.put(value)
            while not stop.is_set():
                await trio.sleep(0.05)

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    try:
        yield entered.get(timeout=30)
    finally:
        stop.set()
        thread.join(timeout=10)
