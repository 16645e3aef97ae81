"""A prepared data set as microbatches and validation windows.

``ShardSampler`` is the ``MicrobatchSampler`` of a run that names a data set
(``training.data``): microbatch id -> (inputs, targets), each int64 (batch_size, seq_len). A
window is ``seq_len + 1`` tokens at a multiple of ``seq_len`` inside one shard; row ``j`` of
microbatch ``m`` reads the window ``node.training.window_map`` gives row ``m * batch_size + j``,
each read with its own ``pread``. Any node holding the shards regenerates any microbatch.

``validation_batches`` is the fixed, unshuffled list of validation windows a data node evaluates
(the first ones of the validation shards, in manifest order).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from gwtf.errors import ConfigError
from node.training.shards import Manifest, Shard, load_manifest
from node.training.window_map import window_of_row


def shard_windows(shards: tuple[Shard, ...], seq_len: int) -> list[int]:
    """Windows of ``seq_len + 1`` tokens, at multiples of ``seq_len``, in each shard."""
    return [max(0, (s.tokens - 1) // seq_len) for s in shards]


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
        counts = shard_windows(manifest.train, seq_len)
        self.windows = sum(counts)
        if self.windows < 1:
            raise ConfigError(
                f"data set {manifest.root} holds no training window of {seq_len + 1} tokens; "
                "prepare a larger corpus or lower training.seq_len"
            )
        self.manifest, self.digest, self.seed = manifest, digest, seed
        self.batch_size, self.seq_len = batch_size, seq_len
        self._ends = list(np.cumsum(counts))  # window index -> shard by bisection

    def window(self, row: int) -> tuple[Shard, int]:
        """The shard and token offset of the run's row ``row``."""
        _, index = window_of_row(row, self.windows, self.digest, self.seed)
        position = bisect.bisect_right(self._ends, index)
        before = int(self._ends[position - 1]) if position else 0
        return self.manifest.train[position], (index - before) * self.seq_len

    def __call__(self, microbatch_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        if microbatch_id < 0:
            raise ConfigError(f"microbatch id {microbatch_id} must be non-negative")
        first = microbatch_id * self.batch_size
        rows = []
        for row in range(first, first + self.batch_size):
            shard, start = self.window(row)
            rows.append(self.manifest.read(shard, start, self.seq_len + 1))
        windows = torch.from_numpy(np.stack(rows))  # (B, T + 1)
        return windows[:, :-1], windows[:, 1:]


def validation_batches(
    manifest: Manifest, batch_size: int, seq_len: int, windows: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``windows`` validation windows (fewer if the split holds fewer), in order,
    as microbatches of up to ``batch_size`` rows."""
    places: list[tuple[Shard, int]] = []
    for shard, count in zip(manifest.val, shard_windows(manifest.val, seq_len), strict=True):
        places += [(shard, k * seq_len) for k in range(min(count, windows - len(places)))]
        if len(places) >= windows:
            break
    batches = []
    for start in range(0, len(places), batch_size):
        rows = [manifest.read(s, o, seq_len + 1) for s, o in places[start : start + batch_size]]
        tokens = torch.from_numpy(np.stack(rows))
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    return batches


Sampler = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def run_sampler(
    data: str, batch_size: int, seq_len: int, seed: int, expected_digest: str | None = None
) -> Sampler:
    """The run's microbatches: its prepared data set's (``data``: a manifest or its folder,
    every shard checked against its hash) or, with ``data`` empty, the shipped corpus's."""
    from node.training.data import MicrobatchSampler, load_default_corpus

    if not data:
        return MicrobatchSampler(load_default_corpus(), batch_size, seq_len)
    manifest = load_manifest(Path(data))
    # Every shard is hashed once here: a damaged copy is refused (naming the shard) before it
    # trains anything, rather than giving windows no other node would give.
    manifest.verify()
    return ShardSampler(manifest, batch_size, seq_len, seed, expected_digest)
