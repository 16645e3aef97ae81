"""Which gradients a dead replica took with it, and where to redo them: a pure plan over what
every relay says its accumulated gradient holds (the live data node's ``Holds``, asked once its
share of an iteration is done; ``gwtf/node/runtime/dataplane/gradient_redo.py`` asks and
redoes). A (microbatch, stage) no live replica in step holds is lost and redone, consecutive
stages of one microbatch as one run, each stage on the live replica with the least work; one held
twice would count twice in the stage's average, and one holder drops its whole sum
(``holder_to_drop``). The simulator counts such gradients as waste lost with the replica and
redoes none.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """A relay's answer to ``Holds``: its stage, its step, the microbatches its gradient holds."""

    stage: int
    step: int
    held: frozenset[int]


@dataclass(frozen=True)
class RedoRun:
    """Stages ``first..last`` of ``microbatch`` are lost: redo them on ``replicas`` (one per
    stage, in order)."""

    microbatch: int
    first: int
    last: int
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class RedoPlan:
    runs: tuple[RedoRun, ...]
    #: (microbatch, stage) lost with no live replica in step to redo it on.
    unsaved: tuple[tuple[int, int], ...] = ()
    #: (microbatch, stage) whose gradient two or more live replicas hold.
    duplicated: tuple[tuple[int, int], ...] = ()


def plan_redo(
    microbatches: Sequence[int],
    stages: int,
    iteration: int,
    answers: Mapping[str, Answer],
    only: Collection[int] | None = None,
) -> RedoPlan:
    """Which (microbatch, stage) gradients no live replica in step holds, grouped in runs of
    consecutive stages, each stage given the live replica with the least work (what it holds
    plus what it was given so far; ties by id). ``only``: look at these stages alone (the
    others have stepped)."""
    looked_at = range(1, stages + 1) if only is None else sorted(only)
    in_step = {peer: a for peer, a in answers.items() if a.step == iteration}
    load = {peer: len(a.held) for peer, a in in_step.items()}
    replicas = {
        stage: sorted(peer for peer, a in in_step.items() if a.stage == stage)
        for stage in range(1, stages + 1)
    }
    runs: list[RedoRun] = []
    unsaved: list[tuple[int, int]] = []
    duplicated: list[tuple[int, int]] = []
    for microbatch in sorted(microbatches):
        lost = []
        for stage in looked_at:
            holders = [p for p in replicas[stage] if microbatch in in_step[p].held]
            if len(holders) > 1:
                duplicated.append((microbatch, stage))
            if not holders:
                lost.append(stage)
        for first, last in _consecutive(lost):
            chosen = []
            for stage in range(first, last + 1):
                if not replicas[stage]:
                    break
                peer = min(replicas[stage], key=lambda p: (load[p], p))
                load[peer] += 1
                chosen.append(peer)
            if len(chosen) == last - first + 1:
                runs.append(RedoRun(microbatch, first, last, tuple(chosen)))
            else:
                unsaved.extend((microbatch, stage) for stage in range(first, last + 1))
    return RedoPlan(tuple(runs), tuple(unsaved), tuple(duplicated))


def holder_to_drop(
    microbatches: Collection[int],
    iteration: int,
    answers: Mapping[str, Answer],
    only: Collection[int] | None = None,
    refused: Collection[str] = (),
) -> str | None:
    """Of the relays in step whose gradient holds a microbatch another replica of its stage
    holds too, the one whose sum is cheapest to drop: the fewest microbatches that only it
    holds (each is redone), then the fewest held, then by id. None when nothing is held
    twice (at the stages of ``only``), or every such holder ``refused``."""
    wanted = set(microbatches)
    in_step = {peer: a for peer, a in answers.items() if a.step == iteration}
    best: tuple[int, int, str] | None = None
    for peer, a in in_step.items():
        if peer in refused or (only is not None and a.stage not in only):
            continue
        held = a.held & wanted
        others = [o.held for q, o in in_step.items() if q != peer and o.stage == a.stage]
        shared = {m for m in held if any(m in o for o in others)}
        if shared:
            cost = (len(held - shared), len(held), peer)
            best = cost if best is None or cost < best else best
    return None if best is None else best[2]


def _consecutive(stages: Sequence[int]) -> list[tuple[int, int]]:
    """[1, 2, 4] -> [(1, 2), (4, 4)]."""
    runs: list[tuple[int, int]] = []
    for stage in stages:
        if runs and runs[-1][1] == stage - 1:
            runs[-1] = (runs[-1][0], stage)
        else:
            runs.append((stage, stage))
    return runs
