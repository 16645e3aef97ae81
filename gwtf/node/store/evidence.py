"""Hop evidence: what an auditor needs to re-execute a relay's hops, kept until no dispute needs it.

For every hop a relay computes it keeps the input and the output frame, each under its SHA-256
(the digests its receipts name, so anyone can check a frame against a receipt and nobody can
slip in another), and once per iteration its stage's state at that iteration: the weights
every hop of the iteration ran with. A backward's re-execution also needs the forward's input,
which is the input frame of the forward hop of the same microbatch. The files of epoch e lie
under ``<root>/<e>/``. The epoch is the hop's header's, which a peer stamps, so with a chain
clock (``epoch_now``) only hops of the last ``keep_epochs`` epochs up to the next one are kept:
a made-up epoch is never kept. Nothing is deleted because newer epochs' hops come: an epoch's
evidence goes only through ``prune_settled`` (driven by
``gwtf.node.receipts.evidence.prune_settled_evidence``), once the chain says the epoch is settled
and none of its tensor disputes is still open, since jurors re-execute a disputed hop from this
evidence, possibly long after the epoch, and missing evidence loses the dispute. Every file is
written to a temporary name and renamed, so a crash leaves no half file under a digest; reads
return one chunk, so serving a large state never reads it whole.

A state is hashed and written in the archive's writer thread, from a copy its caller takes, so
that computing goes on meanwhile; it is flushed to the disk (file and folder) before it counts
as kept. ``state_write`` gives the write of an iteration's state while it is under way: nothing
computed with that state may be vouched for (its receipt signed) before the write is done,
since a relay that crashed before it would hold no evidence for the hop. Reads of a state wait
for its write.

A node keeps each run's evidence in a folder of its own (``run_folder``), named by the chain,
the ledger, the run and the run's start time on chain: a dev chain started afresh deploys the
ledger at the same address and opens the same run id again, and a state kept in an earlier run
must never be served as this run's (its hops would replay as wrong tensors).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_FRAME_SUFFIX = ".gwtt"
_STATE_PREFIX = "state-"
_STATE_SUFFIX = ".safetensors"
_RUN_FOLDER = re.compile(r"(\d+)-(0x[0-9a-f]{40})-run(\d+)-start(\d+)")


def run_folder(chain_id: int, ledger: str, run_id: int, run_start: int) -> str:
    """The name of the folder of one run's evidence: its chain, ledger, run id and start time
    (the block time the run opened at, which no other deployment of the same addresses has)."""
    return f"{chain_id}-{ledger.lower()}-run{run_id}-start{run_start}"


@dataclass(frozen=True)
class RunFolder:
    chain_id: int
    ledger: str  # lower case
    run_id: int
    run_start: int


def parse_run_folder(name: str) -> RunFolder | None:
    """What ``run_folder`` put in ``name``, or None for a name it does not make."""
    match = _RUN_FOLDER.fullmatch(name)
    if match is None:
        return None
    chain_id, ledger, run_id, run_start = match.groups()
    return RunFolder(int(chain_id), ledger, int(run_id), int(run_start))


class EvidenceArchive:
    """One relay's kept evidence under ``root``; safe to call from several threads."""

    def __init__(
        self, root: Path, keep_epochs: int, epoch_now: Callable[[], int] | None = None
    ) -> None:
        if keep_epochs < 1:
            raise ValueError(f"keep_epochs must be at least 1, got {keep_epochs}")
        self.root = root
        self.keep_epochs = keep_epochs
        self.epoch_now = epoch_now
        self._lock = threading.Lock()
        self._made: dict[int, str] = {}  # epochs whose folder exists: the folder
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="evidence-writer")
        self._writes: dict[Path, Future[None]] = {}  # state writes, the latest of each path
        root.mkdir(parents=True, exist_ok=True)

    def keep_frame(
        self, epoch: int, frame: bytes | bytearray | memoryview, digest: bytes | None = None
    ) -> bytes:
        """Keeps ``frame`` of a hop of ``epoch`` (unless the epoch is out of range); returns
        its digest, its SHA-256 (``digest`` when the caller hashed it already)."""
        if digest is None:
            digest = hashlib.sha256(frame).digest()
        folder = self._epoch_folder(epoch)
        if folder is not None:
            # Plain strings and os calls: a relay keeps two frames a hop in its compute thread,
            # and pathlib's objects would cost as much as the write.
            path = os.path.join(folder, digest.hex() + _FRAME_SUFFIX)
            if not os.path.exists(path):
                _write_frame(path, frame)
        return digest

    def keep_state(
        self,
        epoch: int,
        iteration: int,
        snapshot: Callable[[], Callable[[Path], object]],
        is_current: Callable[[bytes], bool],
    ) -> bool:
        """Keeps the stage's state at ``iteration`` of ``epoch`` unless a state of that
        iteration is kept already: ``snapshot()``, called here, copies the state and returns
        what writes the copy to a path, which runs in the writer thread (``state_write``).
        Returns whether the kept state is the current one, so that a hop computed now replays
        from it. A state kept before (by this node's previous process, after a restart) is the
        current one if ``is_current`` says so of its bytes; if not, it stays (the hops computed
        with it replay from it alone) and False says that no hop of that iteration may be
        computed with the weights of now. True when nothing is kept of the epoch (the clock
        says it is not being worked)."""
        folder = self._epoch_dir(epoch)
        if folder is None:
            return True
        path = folder / f"{_STATE_PREFIX}{iteration}{_STATE_SUFFIX}"
        kept = self._read_state(path)
        if kept is not None:
            return is_current(kept)
        with self._lock:
            earlier = list(self._writes.values())
        wait(earlier)  # one copy in memory at a time
        save = snapshot()
        with self._lock:
            # A failed write stays until its state is kept again: what was computed with it
            # must never be vouched for.
            self._writes = {p: w for p, w in self._writes.items() if w.exception() is not None}
            self._writes[path] = self._writer.submit(_write_atomically, path, save, durable=True)
        return True

    def state_write(self, epoch: int, iteration: int) -> Future[None] | None:
        """The write of the state of ``iteration`` of ``epoch`` while it is under way, or once
        it failed (``exception()``) until the state is kept again; None once it is done, at
        the latest when the next state is kept."""
        with self._lock:
            return self._writes.get(self._state_path(epoch, iteration))

    def frame(self, epoch: int, digest: bytes) -> bytes | None:
        """The kept frame of ``epoch`` with ``digest``, or None."""
        return _read(self._frame_path(epoch, digest))

    def state(self, epoch: int, iteration: int) -> bytes | None:
        """The kept state file of the stage at ``iteration`` of ``epoch``, or None."""
        return self._read_state(self._state_path(epoch, iteration))

    def _read_state(self, path: Path) -> bytes | None:
        self._finish_write(path)
        return _read(path)

    def _finish_write(self, path: Path) -> None:
        """Wait for a write of ``path`` under way."""
        with self._lock:
            write = self._writes.get(path)
        if write is not None:
            wait([write])

    def frame_chunk(self, epoch: int, digest: bytes, offset: int, size: int) -> Chunk | None:
        """``size`` bytes from ``offset`` of a kept frame, with its length, or None."""
        return _read_chunk(self._frame_path(epoch, digest), offset, size)

    def state_chunk(self, epoch: int, iteration: int, offset: int, size: int) -> Chunk | None:
        """``size`` bytes from ``offset`` of a kept state file, with its length, or None."""
        path = self._state_path(epoch, iteration)
        self._finish_write(path)
        return _read_chunk(path, offset, size)

    def _frame_path(self, epoch: int, digest: bytes) -> Path:
        return self.root / str(epoch) / (digest.hex() + _FRAME_SUFFIX)

    def _state_path(self, epoch: int, iteration: int) -> Path:
        return self.root / str(epoch) / f"{_STATE_PREFIX}{iteration}{_STATE_SUFFIX}"

    def bytes_of(self, epoch: int) -> int:
        """Disk use of ``epoch``'s evidence."""
        return folder_bytes(self.root / str(epoch))

    def kept_epochs(self) -> list[int]:
        """The epochs with a folder of evidence, oldest first."""
        return sorted(int(f.name) for f in _listing(self.root) if f.name.isdigit() and f.is_dir())

    def prune_settled(self, is_done: Callable[[int], bool]) -> list[int]:
        """Deletes the evidence of every kept epoch that ``is_done`` says is done with (settled,
        so no dispute of it can be opened, and no dispute of it open, so none is still to be
        ruled); returns those epochs. An epoch under dispute keeps its evidence while later,
        undisputed ones go."""
        pruned = []
        for epoch in self.kept_epochs():
            if not is_done(epoch):
                continue
            folder = self.root / str(epoch)
            with self._lock:
                writes = [w for path, w in self._writes.items() if path.parent == folder]
            wait(writes)  # a write under way would put the state back
            with self._lock:
                shutil.rmtree(folder, ignore_errors=True)
                self._made.pop(epoch, None)
            pruned.append(epoch)
            log.info("pruned the hop evidence of epoch %s: it is settled and undisputed", epoch)
        return pruned

    def _epoch_dir(self, epoch: int) -> Path | None:
        """The folder of ``epoch``'s evidence; None for an epoch the clock says is not being
        worked. Older epochs stay: only ``prune_settled`` deletes."""
        folder = self._epoch_folder(epoch)
        return None if folder is None else Path(folder)

    def _epoch_folder(self, epoch: int) -> str | None:
        """``_epoch_dir`` as a string."""
        if self.epoch_now is not None:
            now = self.epoch_now()
            if not now - self.keep_epochs < epoch <= now + 1:
                log.debug("no evidence kept of a hop of epoch %s (now %s)", epoch, now)
                return None
        with self._lock:
            folder = self._made.get(epoch)
            if folder is None:
                folder = self._made[epoch] = str(self.root / str(epoch))
                os.makedirs(folder, exist_ok=True)
        return folder


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (0 if there is none); a file deleted while it is
    counted counts 0."""
    total = 0
    for directory, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(directory, name)).st_size
    return total


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def _write_atomically(path: Path, write: Callable[[Path], object], durable: bool = False) -> None:
    """``write`` to a temporary name, then rename; ``durable``: flushed to the disk before the
    rename and the rename after, so that not even a power cut leaves a half file under
    ``path`` or takes back a file once it is there."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent)


def _write_frame(path: str, frame: bytes | bytearray | memoryview) -> None:
    """``_write_atomically`` of a frame (not ``durable``), in os calls on strings."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as file:
            file.write(frame)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class Chunk:
    total: int  # the file's length
    data: bytes


def _read_chunk(path: Path, offset: int, size: int) -> Chunk | None:
    try:
        with path.open("rb") as file:
            total = os.fstat(file.fileno()).st_size
            file.seek(min(offset, total))
            return Chunk(total, file.read(size))
    except FileNotFoundError:
        return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
