"""A lone data node stopped (a crash, Ctrl-C, a reboot) resumes its run where it stood.

After every ``training.checkpoint_every``-th iteration's step the data node copies its part's
state (in its compute thread, between two steps) and writes it as a resume point of the next
iteration into its home, in a worker thread while the next iteration trains; a write waits for
the one before, so at most one copy is held (``gwtf.node.training.resume_points``). Started again
with a resume point of its run, it loads it and trains from that iteration. Before the first
hop of each iteration it sets aside attempt numbers above those its earlier processes may have
used (``AttemptJournal``): a hop of the iteration a crash interrupted is redone under a new hop
key, never under one a relay signed already. It then asks the relays to drop what they hold of
the iteration it trains again (``control.Forget``): the gradients of microbatches the stopped
process sent would otherwise count twice. Relays that stepped past its resume point (it
stopped after their step, before the point was written) are followed: the embedding and head
go on from their own state, without that step's update, as a relay with no replica does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import trio

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.roles.data import DataRole
from gwtf.node.training.resume_points import (
    JOURNAL,
    AttemptJournal,
    Snapshot,
    kept_from,
    load_latest,
    snapshot,
    write_point,
)

log = logging.getLogger(__name__)

#: How long a resumed data node waits for discovery to list a relay of every stage before it
#: asks the relays it knows to drop the iteration it trains again.
DISCOVERY_WAIT_S = 10.0


@dataclass
class DataResume:
    """One data node's resume points and attempt journal, in ``folder`` (one per run)."""

    folder: Path
    run: str  # what the points must be of: run, seed, data, microbatch layout
    every: int  # a resume point after every this many iterations
    role: DataRole
    nursery: trio.Nursery
    journal: AttemptJournal = field(init=False)
    _written: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        self.journal = AttemptJournal(self.folder / JOURNAL)
        self.role.attempt_block = self.journal.block
        self._written.set()

    async def load(self) -> int:
        """Load the newest resume point into the part; the iteration to train first (0: none)."""
        role = self.role
        point = await trio.to_thread.run_sync(
            load_latest, self.folder, role.worker, self.run, limiter=role.limiter
        )
        if point is None:
            return 0
        log.info(
            "resuming at iteration %s (step %s) from %s",
            point.next_iteration,
            point.step,
            point.path,
        )
        return point.next_iteration

    async def settle_relays(self, rpc: RequestResponse, iteration: int, timeout_s: float) -> int:
        """Have the relays drop what they hold of ``iteration``; the iteration to train: this
        one, or the relays' step where they stepped past it."""
        steps = await self._forget(rpc, iteration, timeout_s)
        ahead = max(steps, default=iteration)
        if ahead <= iteration:
            return iteration
        log.error(
            "the relays stepped to %s, past this data node's resume point at iteration %s (it "
            "stopped before writing the next); going on from its own state: the embedding and "
            "head lose the update of %s iteration(s)",
            ahead,
            iteration,
            ahead - iteration,
        )
        self.role.worker.step_count = ahead
        await self._forget(rpc, ahead, timeout_s)
        return ahead

    async def _forget(self, rpc: RequestResponse, iteration: int, timeout_s: float) -> list[int]:
        roster, stages = self.role.roster, self.role.plane.stages
        # Discovery lists a middle stage's relays a little after the flows form: wait a while
        # for a relay of every stage.
        with trio.move_on_after(DISCOVERY_WAIT_S):
            while set(roster.believed().values()) < set(range(1, stages + 1)):
                await trio.sleep(0.1)
        relays = sorted(roster.believed())
        steps: list[int] = []
        dropped: list[str] = []

        async def ask(relay: str) -> None:
            try:
                reply = await control.ask(rpc, relay, control.Forget(iteration), timeout_s)
                answer = control.decode_reply(reply)
            except ProtocolError as exc:
                log.info("relay %s did not answer Forget(%s): %s", relay, iteration, exc)
                return
            step = answer.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                steps.append(step)
            if answer["ok"]:
                dropped.append(relay)

        async with trio.open_nursery() as asking:
            for relay in relays:
                asking.start_soon(ask, relay)
        log.info(
            "iteration %s trained again: %s of %s relay(s) dropped what they held of it",
            iteration,
            len(dropped),
            len(relays),
        )
        return steps

    async def begin(self, iteration: int) -> None:
        """Set aside the attempt numbers of ``iteration`` (durably) before its first hop."""
        await trio.to_thread.run_sync(self.journal.begin, iteration, kept_from(self.folder))

    async def after(self, iteration: int) -> None:
        """``iteration`` stepped: take a resume point of the next, if one is due."""
        if (iteration + 1) % self.every:
            return
        await self._written.wait()  # one copy held, one write at a time
        role = self.role
        taken = await trio.to_thread.run_sync(
            snapshot, role.worker, self.run, iteration + 1, limiter=role.limiter
        )
        self._written = trio.Event()
        self.nursery.start_soon(self._write, taken)

    async def flush(self) -> None:
        """Wait for the resume point being written."""
        await self._written.wait()

    async def _write(self, taken: Snapshot) -> None:
        try:
            await trio.to_thread.run_sync(write_point, self.folder, taken)
        except OSError as exc:
            log.error(
                "resume point of iteration %s not written to %s: %s; a stop now would resume "
                "from an older one (free space or fix the folder's permissions)",
                taken.next_iteration,
                self.folder,
                exc,
            )
        finally:
            self._written.set()
