"""A prepared data set as microbatches and validation windows.

``ShardSampler`` is the ``MicrobatchSampler`` of a run that names a data set
(``training.data``): microbatch id -> (inputs, targets), each int64 (batch_size, seq_len). A
split's shards, in manifest order, are one stream of tokens (documents end with the
end-of-document id, so a window may run from one file's into the next's, as it runs from one
document into the next); a window is ``seq_len + 1`` tokens at a multiple of ``seq_len`` of that
stream, so at most ``seq_len`` tokens of a split go unread however many files it came from. Row
``j`` of microbatch ``m`` reads the window ``gwtf.node.training.window_map`` gives row
``m * batch_size + j``, with one ``pread`` per shard it spans. Any node holding the shards
regenerates any microbatch.

``validation_batches`` is the fixed, unshuffled list of validation windows a data node evaluates
(the first ones of the validation stream).
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from gwtf.errors import ConfigError
from gwtf.node.training.shards import Manifest, Shard, load_manifest
from gwtf.node.training.window_map import window_of_row

log = logging.getLogger(__name__)


class TokenStream:
    """A split's shards (``manifest.train`` or ``manifest.val``) as one stream of tokens."""

    def __init__(self, manifest: Manifest, shards: tuple[Shard, ...]) -> None:
        self.manifest, self.shards = manifest, shards
        self.starts: list[int] = [0]
        for shard in shards:
            self.starts.append(self.starts[-1] + shard.tokens)
        self.tokens = self.starts[-1]

    def windows(self, seq_len: int) -> int:
        """Windows of ``seq_len + 1`` tokens at multiples of ``seq_len``."""
        return max(0, (self.tokens - 1) // seq_len)

    def unused(self, seq_len: int) -> int:
        """Tokens no window reads (fewer than ``seq_len + 1``)."""
        windows = self.windows(seq_len)
        return self.tokens - (windows * seq_len + 1 if windows else 0)

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``start .. start + count`` of the stream (int64)."""
        if start < 0 or start + count > self.tokens:
            raise ConfigError(f"tokens {start}..{start + count} lie outside the data set's split")
        index = bisect.bisect_right(self.starts, start) - 1
        pieces = []
        while count > 0:
            shard, offset = self.shards[index], start - self.starts[index]
            take = min(count, shard.tokens - offset)
            pieces.append(self.manifest.read(shard, offset, take))
            start, count, index = start + take, count - take, index + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class ShardSampler:
    """microbatch id -> (inputs, targets) from a prepared data set's training shards."""

    def __init__(
        self,
        manifest: Manifest,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        expected_digest: str | None = None,
    ) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ConfigError(f"batch_size={batch_size} and seq_len={seq_len} must be >= 1")
        digest = manifest.digest
        if expected_digest is not None and expected_digest.removeprefix("0x") != digest:
            raise ConfigError(
                f"data set {manifest.root} has hash {digest[:16]}..., not the run's data set hash "
                f"{expected_digest.removeprefix('0x')[:16]}...; use the run's data set"
            )
        for shard in manifest.train:
            manifest.check_size(shard)
        self.stream = TokenStream(manifest, manifest.train)
        self.windows = self.stream.windows(seq_len)
        if self.windows < 1:
            raise ConfigError(
                f"data set {manifest.root} holds no training window of {seq_len + 1} tokens; "
                "prepare a larger corpus or lower training.seq_len"
            )
        self.manifest, self.digest, self.seed = manifest, digest, seed
        self.batch_size, self.seq_len = batch_size, seq_len

    def window(self, row: int) -> int:
        """The token offset (in the training stream) of the run's row ``row``."""
        _, index = window_of_row(row, self.windows, self.digest, self.seed)
        return index * self.seq_len

    def __call__(self, microbatch_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        if microbatch_id < 0:
            raise ConfigError(f"microbatch id {microbatch_id} must be non-negative")
        first = microbatch_id * self.batch_size
        rows = []
        for row in range(first, first + self.batch_size):
            rows.append(self.stream.read(self.window(row), self.seq_len + 1))
        windows = torch.from_numpy(np.stack(rows))  # (B, T + 1)
        return windows[:, :-1], windows[:, 1:]


def validation_batches(
    manifest: Manifest, batch_size: int, seq_len: int, windows: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``windows`` validation windows (fewer if the split holds fewer), in order,
    as microbatches of up to ``batch_size`` rows."""
    stream = TokenStream(manifest, manifest.val)
    starts = [k * seq_len for k in range(min(windows, stream.windows(seq_len)))]
    batches = []
    for first in range(0, len(starts), batch_size):
        rows = [stream.read(start, seq_len + 1) for start in starts[first : first + batch_size]]
        tokens = torch.from_numpy(np.stack(rows))
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    return batches


class Sampler(Protocol):
    """A run's microbatch by id: (inputs, targets), both int64 of shape (batch, seq_len), the
    same for every node and every call (``ShardSampler``, ``data.MicrobatchSampler``). May
    read the data set from disk, so block on it; ``ShardSampler`` raises ``ConfigError`` for a
    negative id."""

    def __call__(self, microbatch_id: int, /) -> tuple[torch.Tensor, torch.Tensor]: ...


def run_sampler(
    data: str, batch_size: int, seq_len: int, seed: int, expected_digest: str | None = None
) -> Sampler:
    """The run's microbatches: its prepared data set's (``data``: a manifest or its folder,
    every shard checked against its hash) or, with ``data`` empty, the shipped corpus's."""
    from gwtf.node.training.data import MicrobatchSampler, load_default_corpus

    if not data:
        return MicrobatchSampler(load_default_corpus(), batch_size, seq_len)
    manifest = load_manifest(Path(data))
    # Every shard is hashed once here: a damaged copy is refused (naming the shard) before it
    # trains anything, rather than giving windows no other node would give.
    manifest.verify()
    sampler = ShardSampler(manifest, batch_size, seq_len, seed, expected_digest)
    log.info(
        "data set %s: %s training windows of %s tokens; %s of its %s training tokens unread",
        manifest.digest[:16],
        sampler.windows,
        seq_len + 1,
        sampler.stream.unused(seq_len),
        sampler.stream.tokens,
    )
    return sampler
