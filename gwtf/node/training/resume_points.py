"""A data node's resume points: its part's state and its place in the data, one file each.

A resume point is a part state file (``checkpoint.py``: weights, AdamW state and step, under a
content digest) whose header also names the run it belongs to and the next iteration to train
(the microbatch ids follow from it). Files are written whole or not at all (a temporary file,
fsynced, renamed, the folder fsynced), named by that iteration, and only the newest ``KEEP``
stay. Taking a point is two steps: ``snapshot`` copies the state (in the thread that steps the
part, so the copy is one step's state) and ``write_point`` writes the copy (in any thread).

Beside them, ``AttemptJournal`` remembers which attempt numbers earlier processes of the data
node may have given the microbatches of the iterations a resume could train again: a receipt's
hop key holds the attempt, and a hop redone under a key already signed for would have an honest
relay refuse it (or, with other bytes, be a second version of a signed hop).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from gwtf.node.training.checkpoint import (
    apply_part_state,
    content_digest,
    part_metadata,
    read_checked,
    state_tensors,
)
from gwtf.node.training.errors import CheckpointError
from gwtf.node.training.trainer import PartTrainer

#: Resume points kept: the newest, and one before it should the newest be damaged.
KEEP = 2
_NAME = re.compile(r"data-([0-9]{9})\.safetensors")
_REMEDY = (
    "delete it to resume from the resume point before it, or move the folder away to start "
    "the run afresh"
)


def point_name(next_iteration: int) -> str:
    return f"data-{next_iteration:09d}.safetensors"


@dataclass(frozen=True)
class Snapshot:
    """A copy of a part's state, to be written as the resume point of ``next_iteration``."""

    next_iteration: int
    metadata: dict[str, str]
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    next_iteration: int
    step: int
    digest: str


def snapshot(trainer: PartTrainer, run: str, next_iteration: int) -> Snapshot:
    """Copy the trainer's state (weights, optimizer, step) with the run and the position."""
    metadata = {**part_metadata(trainer), "run": run, "next_iteration": str(next_iteration)}
    return Snapshot(next_iteration, metadata, state_tensors(trainer))


def write_point(folder: Path, taken: Snapshot, keep: int = KEEP) -> Path:
    """Write ``taken`` atomically and durably into ``folder``; then delete all but the newest
    ``keep`` resume points (and any temporary file a crash left)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / point_name(taken.next_iteration)
    digest = content_digest(taken.metadata, taken.tensors)
    temporary = path.with_name(path.name + ".partial")
    save_file(taken.tensors, str(temporary), metadata={**taken.metadata, "digest": digest})
    _fsync(temporary)
    os.replace(temporary, path)
    _fsync(folder)  # the rename itself survives a power cut
    for old in points(folder)[keep:]:
        old.unlink(missing_ok=True)
    for partial in folder.glob("data-*.safetensors.partial"):
        if partial != temporary:
            partial.unlink(missing_ok=True)
    return path


def points(folder: Path) -> list[Path]:
    """The resume points in ``folder``, newest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [path for _, path in sorted(found, reverse=True)]


def load_latest(folder: Path, trainer: PartTrainer, run: str) -> ResumePoint | None:
    """Load the newest resume point of ``folder`` into ``trainer`` (None: there is none). One
    that is damaged, of another run or of another part is refused with a one-line
    ``CheckpointError`` naming it; the trainer is then unchanged."""
    found = points(folder)
    if not found:
        return None
    path = found[0]
    metadata, tensors = read_checked(path, _REMEDY)
    if metadata.get("run") != run:
        raise CheckpointError(
            f"resume point {path} is of {metadata.get('run', 'no run')!r}, this node trains "
            f"{run!r}; {_REMEDY}"
        )
    position = metadata.get("next_iteration", "")
    if not position.isdigit() or point_name(int(position)) != path.name:
        raise CheckpointError(f"resume point {path} names position {position!r}; {_REMEDY}")
    digest = apply_part_state(trainer, metadata, tensors, f"resume point {path}", _REMEDY)
    return ResumePoint(path, int(position), trainer.step_count, digest)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Attempt blocks (``hop.origin_attempt``) a process sets aside for an iteration at a time.
ATTEMPT_RESERVE = 16
JOURNAL = "attempts.json"


class AttemptJournal:
    """The attempt blocks each iteration's microbatches may have used, kept on disk.

    Before a process sends the first hop of an iteration it records, durably, that blocks up
    to ``floor + ATTEMPT_RESERVE`` of that iteration are taken, where ``floor`` is what earlier
    processes recorded (0 if none); a microbatch needing more records more first. A process
    resumed into an iteration an earlier one had started thus numbers its attempts above every
    number that one can have used: no hop key is ever used twice."""

    def __init__(self, path: Path, reserve: int = ATTEMPT_RESERVE) -> None:
        self.path = path
        self.reserve = reserve
        self.taken = self._read()  # iteration -> blocks below this may have been used
        self.floors: dict[int, int] = {}  # iteration -> this process's first block

    def begin(self, iteration: int, forget_before: int = 0) -> int:
        """Set aside this process's blocks for ``iteration`` (durably); returns its first."""
        floor = self.taken.get(iteration, 0)
        self.floors[iteration] = floor
        self.taken = {i: b for i, b in self.taken.items() if i >= forget_before}
        self.taken[iteration] = floor + self.reserve
        self._write()
        return floor

    def block(self, iteration: int, tries: int) -> int:
        """The block of a microbatch's ``tries``-th try in ``iteration`` (recording more set
        aside first when it runs past what is)."""
        if iteration not in self.floors:
            self.begin(iteration)
        chosen = self.floors[iteration] + tries
        if chosen >= self.taken[iteration]:
            self.taken[iteration] = chosen + self.reserve
            self._write()
        return chosen

    def _read(self) -> dict[int, int]:
        try:
            raw = json.loads(self.path.read_text())
            return {int(i): int(b) for i, b in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"attempt journal {self.path} is unreadable ({exc}); a data node resumed "
                "without it could reuse a signed hop key: restore it, or move the folder away "
                "to start the run afresh"
            ) from exc

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".partial")
        with open(temporary, "w") as out:
            json.dump({str(i): b for i, b in sorted(self.taken.items())}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        _fsync(self.path.parent)


def kept_from(folder: Path) -> int:
    """The earliest iteration a resume point in ``folder`` starts at (0: none): no resume
    trains an iteration before it again."""
    found = points(folder)
    return int(_NAME.fullmatch(found[-1].name).group(1)) if found else 0  # type: ignore[union-attr]
