"""Tokens for training: a byte-level tokenizer, the corpus shipped with the package, and the
deterministic map from a microbatch id to its token windows.

Any node holding the corpus regenerates any microbatch from (the run's data set hash, the
microbatch id) alone, so tokens never travel and a re-routed microbatch is the same microbatch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

import torch

from gwtf.errors import ConfigError

DEFAULT_CORPUS = "tinyshakespeare.txt"


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, nothing to download, lossless on valid text."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)

    def decode(self, tokens: torch.Tensor) -> str:
        return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Corpus:
    """A tokenised data set and its SHA-256, the ``data set hash`` a run commits to."""

    tokens: torch.Tensor  # (N,) uint8
    digest: str

    @classmethod
    def from_bytes(cls, raw: bytes) -> Corpus:
        tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return cls(tokens, hashlib.sha256(raw).hexdigest())


def load_default_corpus() -> Corpus:
    """The public-domain Tiny Shakespeare text shipped in ``gwtf/node/training/data``."""
    raw = (
        resources.files("gwtf.node.training").joinpath("data").joinpath(DEFAULT_CORPUS).read_bytes()
    )
    return Corpus.from_bytes(raw)


def sample_offsets(
    dataset_digest: str, microbatch_id: int, batch_size: int, seq_len: int, n_tokens: int
) -> tuple[int, ...]:
    """Start offsets of the ``batch_size`` windows of microbatch ``microbatch_id``: a pure
    function of its arguments (BLAKE2b per row; modulo bias is below 2**-40 for any corpus
    under a terabyte)."""
    span = n_tokens - seq_len  # a window needs seq_len + 1 tokens (inputs and shifted targets)
    if span < 1:
        raise ConfigError(
            f"corpus of {n_tokens} tokens is too short for seq_len={seq_len}; use a larger one"
        )
    if microbatch_id < 0:
        raise ConfigError(f"microbatch id {microbatch_id} must be non-negative")
    offsets = []
    for row in range(batch_size):
        key = f"{dataset_digest}/{microbatch_id}/{row}".encode()
        value = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        offsets.append(value % span)
    return tuple(offsets)


class MicrobatchSampler:
    """microbatch id -> (inputs, targets), each int64 (batch_size, seq_len)."""

    def __init__(
        self, corpus: Corpus, batch_size: int, seq_len: int, expected_digest: str | None = None
    ) -> None:
        if expected_digest is not None and expected_digest != corpus.digest:
            raise ConfigError(
                f"corpus digest {corpus.digest[:16]}... differs from the run's data set hash "
                f"{expected_digest[:16]}...; load the run's data set"
            )
        if batch_size < 1 or seq_len < 1:
            raise ConfigError(f"batch_size={batch_size} and seq_len={seq_len} must be >= 1")
        self.corpus = corpus
        self.batch_size = batch_size
        self.seq_len = seq_len

    def __call__(self, microbatch_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = sample_offsets(
            self.corpus.digest,
            microbatch_id,
            self.batch_size,
            self.seq_len,
            len(self.corpus.tokens),
        )
        windows = torch.stack(
            [self.corpus.tokens[start : start + self.seq_len + 1] for start in offsets]
        ).to(torch.int64)  # (B, T + 1)
        return windows[:, :-1], windows[:, 1:]
