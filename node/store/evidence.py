"""Hop evidence: what an auditor needs to re-execute a relay's hops, kept for the challenge window.

For every hop a relay computes it keeps the input and the output frame, each under its SHA-256
(the digests its receipts name, so anyone can check a frame against a receipt and nobody can
slip in another), and once per iteration its stage's state at that iteration: the weights
every hop of the iteration ran with. A backward's re-execution also needs the forward's input,
which is the input frame of the forward hop of the same microbatch. The files of epoch e lie
under ``<root>/<e>/``; when a hop of a newer epoch arrives, epochs older than ``keep_epochs``
before it are deleted (the retention setting covers the challenge window). Every file is
written to a temporary name and renamed, so a crash leaves no half file under a digest.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_FRAME_SUFFIX = ".gwtt"
_STATE_PREFIX = "state-"
_STATE_SUFFIX = ".safetensors"


class EvidenceArchive:
    """One relay's kept evidence under ``root``; safe to call from several threads."""

    def __init__(self, root: Path, keep_epochs: int) -> None:
        if keep_epochs < 1:
            raise ValueError(f"keep_epochs must be at least 1, got {keep_epochs}")
        self.root = root
        self.keep_epochs = keep_epochs
        self._lock = threading.Lock()
        self._newest = -1
        root.mkdir(parents=True, exist_ok=True)

    def keep_frame(self, epoch: int, frame: bytes | bytearray | memoryview) -> bytes:
        """Keeps ``frame`` of a hop of ``epoch``; returns its digest."""
        digest = hashlib.sha256(frame).digest()
        path = self._epoch_dir(epoch) / (digest.hex() + _FRAME_SUFFIX)
        if not path.exists():
            _write_atomically(path, lambda tmp: tmp.write_bytes(frame))
        return digest

    def keep_state(self, epoch: int, iteration: int, save: Callable[[Path], object]) -> None:
        """Keeps the stage's state at ``iteration`` (``save(path)`` writes it) unless kept."""
        path = self._epoch_dir(epoch) / f"{_STATE_PREFIX}{iteration}{_STATE_SUFFIX}"
        if not path.exists():
            _write_atomically(path, save)

    def frame(self, epoch: int, digest: bytes) -> bytes | None:
        """The kept frame of ``epoch`` with ``digest``, or None."""
        return _read(self.root / str(epoch) / (digest.hex() + _FRAME_SUFFIX))

    def state(self, epoch: int, iteration: int) -> bytes | None:
        """The kept state file of the stage at ``iteration`` of ``epoch``, or None."""
        return _read(self.root / str(epoch) / f"{_STATE_PREFIX}{iteration}{_STATE_SUFFIX}")

    def bytes_of(self, epoch: int) -> int:
        """Disk use of ``epoch``'s evidence."""
        folder = self.root / str(epoch)
        if not folder.is_dir():
            return 0
        return sum(path.stat().st_size for path in folder.iterdir())

    def _epoch_dir(self, epoch: int) -> Path:
        folder = self.root / str(epoch)
        with self._lock:
            if epoch > self._newest:
                self._newest = epoch
                self._prune_before(epoch - self.keep_epochs + 1)
            folder.mkdir(exist_ok=True)
        return folder

    def _prune_before(self, first_kept: int) -> None:
        for folder in self.root.iterdir():
            if folder.is_dir() and folder.name.isdigit() and int(folder.name) < first_kept:
                shutil.rmtree(folder, ignore_errors=True)
                log.info("pruned the hop evidence of epoch %s", folder.name)


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
