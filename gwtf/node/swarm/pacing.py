"""How far the swarm lets its data nodes train, so what a run is to show happens however fast or
slow the machine is.

Each data node process starts iteration i only once its pace file (``<out>/<name>.pace``,
``python -m gwtf.node.process --pace-file``) holds a count above i. The swarm holds the data
nodes (after the iteration in flight) at each epoch's end until every live one has read the new
epoch off the chain (it reads the chain's clock every ``chain.clock_period_s``), so every epoch
gets its share of the iterations; and while a relay entering (a joiner, or one restarted) loads
its stage's state, so it is serving with the run's iterations still ahead. Every hold is bounded
(``HOLD_TIMEOUT_S``): a node that never gets there costs the run that long, and the run goes on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

#: The longest the swarm holds its data nodes for one reason.
HOLD_TIMEOUT_S = 90.0
POLL_S = 0.05


def pace_file(out_dir: Path, name: str) -> Path:
    return out_dir / f"{name}.pace"


class Pacing:
    """The iteration count the data nodes may start: the run's, or less while a hold lasts."""

    def __init__(self, out_dir: Path, iterations: int) -> None:
        self.out_dir, self.iterations = out_dir, iterations
        self.names: list[str] = []
        self.holds: dict[str, int] = {}  # why -> iterations allowed meanwhile

    def add(self, name: str) -> Path:
        """The pace file of data node ``name``, written now."""
        if name not in self.names:
            self.names.append(name)
        self._write()
        return pace_file(self.out_dir, name)

    def allowed(self) -> int:
        return min([self.iterations, *self.holds.values()])

    def hold(self, why: str, iterations: int) -> None:
        """Let the data nodes start no iteration from ``iterations`` on, until ``release(why)``."""
        self.holds[why] = iterations
        self._write()

    def release(self, why: str) -> None:
        self.holds.pop(why, None)
        self._write()

    def hold_until(self, why: str, iterations: int, done: Callable[[], bool]) -> bool:
        """Hold the data nodes at ``iterations`` until ``done()`` (at most ``HOLD_TIMEOUT_S``);
        whether it came true."""
        self.hold(why, iterations)
        try:
            deadline = time.monotonic() + HOLD_TIMEOUT_S
            while not done():
                if time.monotonic() > deadline:
                    log.warning("held the data nodes %.0f s for %s; going on", HOLD_TIMEOUT_S, why)
                    return False
                time.sleep(POLL_S)
            return True
        finally:
            self.release(why)

    def _write(self) -> None:
        count = str(self.allowed())
        for name in self.names:
            path = pace_file(self.out_dir, name)
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(count)
            os.replace(temporary, path)
