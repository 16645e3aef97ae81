"""Saving the gradients a dead replica held, before its stage averages.

A relay accumulates the gradient of every microbatch whose backward it computes until its stage
averages at the iteration's end. If it dies first (or comes back as a new process), those
gradients are gone while their microbatches count as done: the stage's average would leave them
out and training would drift from the whole model. So once every microbatch of its share is
done, and before the relays end the iteration, a data node asks every relay which of its
microbatches its accumulated gradient holds (``Holds``). A (microbatch, stage) that no live
replica in step holds is lost; it is redone from what the neighbours keep until the iteration
ends, on a live replica of that stage:

* forward: the node before it (the data node for stage 1) re-sends its kept forward output to
  the replica as a repair (``Resend``): it computes the forward and holds it;
* backward: the replica is told to expect the redo from the node after it, which sends it the
  gradient it keeps (``ExpectRedo``, ``RedoBack``; the data node for the last stage): the
  replica accumulates it and keeps the gradient for its input, sending nothing on.

Consecutive lost stages of one microbatch are redone as a run: the forward through each in turn,
then the backward back up to the first, each replica handing on what it computed. Only the lost
stages compute again, never a whole microbatch.

A (microbatch, stage) held by two replicas (a backward computed twice around a peer that looked
dead: its ack came late) would count twice in the stage's average. A relay's gradient is one
sum, so no single microbatch can be taken out of it: one holder drops its whole sum
(``Discard``; the one with the fewest microbatches no other replica holds, ``holder_to_drop``)
and those are redone like a dead replica's. A holder that also holds another origin's
microbatches cannot drop its sum for one origin; such a duplicate is counted, not fixed.

The plan is pure (``gwtf.coordinator_free.decisions.gradient_redo``); ``GradientRedo`` asks
the nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import trio

from gwtf.coordinator_free.decisions.gradient_redo import (
    Answer,
    RedoRun,
    holder_to_drop,
    plan_redo,
)
from gwtf.errors import ProtocolError
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.dataplane.hop import TakeAttempt

log = logging.getLogger(__name__)

#: Redo runs in flight at once: each holds a forward on its replicas until its backward.
MAX_CONCURRENT_RUNS = 2


@dataclass
class RedoReport:
    """What saving an iteration's lost gradients did, by (microbatch, stage) gradient; a later
    redo of the same iteration (after an end that missed a holder) merges in (``add``)."""

    redone_pairs: set[tuple[int, int]] = field(default_factory=set)  # computed again
    unsaved_pairs: set[tuple[int, int]] = field(default_factory=set)  # no live replica to redo on
    duplicated_pairs: set[tuple[int, int]] = field(default_factory=set)  # held by two or more
    #: Gradients lost because a stage stepped without a holder (the end's last attempt).
    left_out: int = 0
    #: Relays that dropped their gradient's sum, as it held a microbatch another held too.
    sums_dropped: int = 0
    #: Relay -> (its stage, how many of the microbatches' gradients it holds after the redo):
    #: the iteration's end must hear from each of them (``EndIteration.holders``).
    holders: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def redone(self) -> int:
        return len(self.redone_pairs)

    @property
    def lost(self) -> int:
        return len(self.unsaved_pairs - self.redone_pairs) + self.left_out

    @property
    def duplicated(self) -> int:
        return len(self.duplicated_pairs)

    @property
    def microbatches_redone(self) -> int:
        return len({microbatch for microbatch, _ in self.redone_pairs})

    def add(self, later: RedoReport) -> None:
        self.redone_pairs |= later.redone_pairs
        self.unsaved_pairs |= later.unsaved_pairs
        self.duplicated_pairs |= later.duplicated_pairs
        self.left_out += later.left_out
        self.sums_dropped += later.sums_dropped


def decode_holds(data: bytes, stages: int, count: int) -> tuple[int, int, list[int]]:
    """A ``Holds`` reply's stage, step and held offsets; anything malformed is a
    ``ProtocolError``."""
    raw = control.decode_reply(data)
    stage, step, held = raw.get("stage"), raw.get("step"), raw.get("held")
    if not (type(stage) is int and 1 <= stage <= stages and type(step) is int and step >= 0):
        raise ProtocolError("holds reply without a relay stage and a step")
    if not (isinstance(held, list) and len(held) <= count):
        raise ProtocolError(f"holds reply without a list of at most {count} offsets")
    if not all(type(m) is int and 0 <= m < count for m in held):
        raise ProtocolError(f"holds reply with an offset outside 0..{count - 1}")
    return stage, step, held


Key = tuple[int, int]  # (iteration, microbatch id)


class ReachableRelays(Protocol):
    """Every relay that may be alive, relay -> stage, its answer awaited: may take up to a
    probe's deadline. Does not raise."""

    async def __call__(self) -> dict[str, int]: ...


class RelayGone(Protocol):
    """Told of a relay that did not answer: it is not asked again this iteration. Does not
    block or raise."""

    def __call__(self, relay: str, /) -> None: ...


class RelayLearned(Protocol):
    """Told of a relay that answered, and its stage. Does not block or raise."""

    def __call__(self, relay: str, stage: int, /) -> None: ...


Redoing = TypeVar("Redoing", control.Resend, control.ExpectRedo, control.RedoBack)


@dataclass
class GradientRedo:
    """A data node's side: ask, plan, redo. ``relays`` lists every relay that may be alive
    (relay -> stage); ``gone`` is told of each that does not answer, ``learn`` of each that
    does."""

    plane: DataPlane
    relays: ReachableRelays
    gone: RelayGone
    #: Told of each relay that answered, and its stage: the iteration's end must ask it too.
    learn: RelayLearned
    timeout_s: control.AskDeadline
    take_attempt: TakeAttempt
    #: This node's own answers: a re-send of its embedding output, a redo of its loss gradient.
    resend_here: control.AnswerHere[control.Resend]
    redo_here: control.AnswerHere[control.RedoBack]

    @property
    def node_id(self) -> str:
        return self.plane.node_id

    async def save_lost(
        self,
        iteration: int,
        first: int,
        paths: Mapping[int, tuple[str, ...]],
        only: Collection[int] | None = None,
    ) -> RedoReport:
        """Redo every lost gradient of the microbatches of ``paths`` (id -> the final backward's
        path: origin, stage 1..S relays, sink), all of ``first .. first + len - 1``; ``only``:
        at these stages alone."""
        answers = await self._ask_holds(iteration, first, paths)
        deduplicated = await self._drop_duplicates(iteration, list(paths), answers, only)
        plan = plan_redo(list(paths), self.plane.stages, iteration, deduplicated, only)
        report = RedoReport(unsaved_pairs=set(plan.unsaved), duplicated_pairs=set(plan.duplicated))
        report.sums_dropped = sum(deduplicated[r] != answers[r] for r in answers)
        answers = deduplicated
        for relay, answer in answers.items():
            held = len(answer.held & set(paths))
            if answer.step == iteration and held and (only is None or answer.stage in only):
                report.holders[relay] = (answer.stage, held)
        for microbatch, stage in plan.unsaved:
            log.warning(
                "gradient of microbatch %s at stage %s is lost: no live replica of the stage",
                microbatch,
                stage,
            )
        for microbatch, stage in plan.duplicated:
            log.warning(
                "gradient of microbatch %s at stage %s is held twice: it counts twice in the "
                "stage's average",
                microbatch,
                stage,
            )
        limiter = trio.CapacityLimiter(MAX_CONCURRENT_RUNS)

        async def redo(run: RedoRun) -> None:
            async with limiter:
                redone = await self._redo(iteration, run, paths[run.microbatch])
            for replica, stage in redone:
                report.holders[replica] = (stage, report.holders.get(replica, (stage, 0))[1] + 1)
                report.redone_pairs.add((run.microbatch, stage))
            done = {stage for _, stage in redone}
            report.unsaved_pairs.update(
                (run.microbatch, stage) for stage in range(run.first, run.last + 1)
                if stage not in done
            )  # fmt: skip

        async with trio.open_nursery() as nursery:
            for run in plan.runs:
                nursery.start_soon(redo, run)
        if plan.runs:
            log.warning(
                "iteration %s: %s gradient(s) that died with a replica redone on live replicas "
                "(%s of %s microbatches), %s not",
                iteration,
                report.redone,
                report.microbatches_redone,
                len(paths),
                report.lost,
            )
        return report

    async def _drop_duplicates(
        self,
        iteration: int,
        microbatches: list[int],
        answers: dict[str, Answer],
        only: Collection[int] | None,
    ) -> dict[str, Answer]:
        """Have holders of a gradient held twice drop their sums (``holder_to_drop``) until
        none is held twice or every holder left refuses; the answers as they stand after."""
        refused: set[str] = set()
        while relay := holder_to_drop(microbatches, iteration, answers, only, refused):
            try:
                request = control.Discard(iteration)
                reply = await control.ask(self.plane.rpc, relay, request, self.timeout_s())
                dropped = bool(control.decode_reply(reply)["ok"])
            except ProtocolError as exc:
                log.info("relay %s did not drop its gradient: %s", relay, exc)
                dropped = False
            if dropped:
                answer = answers[relay]
                answers = {**answers, relay: Answer(answer.stage, answer.step, frozenset())}
            else:
                refused.add(relay)
        return answers

    async def _ask_holds(
        self, iteration: int, first: int, paths: Mapping[int, tuple[str, ...]]
    ) -> dict[str, Answer]:
        """Every relay that may be alive, and every relay of the paths, asked twice."""
        count = len(paths)
        asked = set(await self.relays())
        for path in paths.values():
            asked.update(path[1:-1])
        asked.discard(self.node_id)
        answers: dict[str, Answer] = {}

        async def ask(relay: str) -> None:
            held: set[int] = set()
            stage = step = -1
            for start in range(0, count, control.MAX_HOLDS):
                size = min(control.MAX_HOLDS, count - start)
                request = control.Holds(iteration, first + start, size)
                reply = await self._ask_twice(relay, request)
                if reply is None:
                    self.gone(relay)
                    return
                try:
                    stage, step, offsets = decode_holds(reply, self.plane.stages, size)
                except ProtocolError as exc:
                    log.warning("relay %s answered holds with nonsense: %s", relay, exc)
                    return
                held.update(first + start + offset for offset in offsets)
            answers[relay] = Answer(stage, step, frozenset(held))
            self.learn(relay, stage)

        async with trio.open_nursery() as nursery:
            for relay in sorted(asked):
                nursery.start_soon(ask, relay)
        return answers

    async def _ask_twice(self, relay: str, request: control.Holds) -> bytes | None:
        for attempt in range(2):
            try:
                return await control.ask(self.plane.rpc, relay, request, self.timeout_s())
            except ProtocolError as exc:
                log.info("relay %s missed holds %s: %s", relay, attempt + 1, exc)
        return None

    async def _redo(
        self, iteration: int, run: RedoRun, path: tuple[str, ...]
    ) -> list[tuple[str, int]]:
        """Redo one run; returns the (replica, stage) whose gradient was redone."""
        key = (iteration, run.microbatch)
        by_stage = dict(zip(range(run.first, run.last + 1), run.replicas, strict=True))
        for stage, replica in by_stage.items():
            before = path[run.first - 1] if stage == run.first else by_stage[stage - 1]
            resend = control.Resend(iteration, run.microbatch, replica, self.take_attempt(key))
            if not await self._ask(before, resend, self.resend_here):
                return []
        done: list[tuple[str, int]] = []
        for stage in range(run.last, run.first - 1, -1):
            replica = by_stage[stage]
            after = path[run.last + 1] if stage == run.last else by_stage[stage + 1]
            expect = control.ExpectRedo(iteration, run.microbatch, after)
            redo = control.RedoBack(iteration, run.microbatch, replica, self.take_attempt(key))
            if not await self._ask(replica, expect, None) or not await self._ask(
                after, redo, self.redo_here
            ):
                break
            done.append((replica, stage))
        return done

    async def _ask(
        self,
        node: str,
        request: Redoing,
        here: control.AnswerHere[Redoing] | None,
    ) -> bool:
        """Ask ``node`` (this node: ``here``) for one step of a redo; True when it did it."""
        return await control.ask_to_send(
            self.plane.rpc, self.node_id, node, request, self.plane.ack_deadline_s, here,
            "redoing",
        )  # fmt: skip
