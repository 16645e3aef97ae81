"""A prepared data set on disk: flat little-endian token shards and one canonical manifest.

``manifest.json`` lists each shard (file, token count, SHA-256) of the train and validation
splits, the token width (uint16 for vocabularies up to 65,536, else uint32), the vocabulary, the
end-of-document id and the tokenizer file with its SHA-256. It is written in one canonical byte
form, and its SHA-256 is the data set hash a run commits to on chain.

Shards are read a window at a time with ``os.pread`` on a descriptor opened for the read: no
corpus is ever in memory and no memory map outlives a microbatch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gwtf.errors import ConfigError
from gwtf.node.training.config import BYTE_VOCAB_SIZE

MANIFEST_FILE = "manifest.json"
FORMAT = "gwtf-data-1"
#: A manifest over this size is not one of ours (a million shards take ~150 MB; 16 MiB is
#: ~100,000 shards, 10^13 tokens at the usual 10^8 per shard).
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
UINT16_VOCAB = 65_536
_HASH_CHUNK = 8 * 1024 * 1024


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


def canonical_json(value: object) -> bytes:
    """The one byte form of a JSON value: sorted keys, no spaces, UTF-8, a final newline."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return (text + "\n").encode("utf-8")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Shard:
    file: str  # a plain file name inside the data set's folder
    tokens: int
    sha256: str

    def as_json(self) -> dict[str, Any]:
        return {"file": self.file, "tokens": self.tokens, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """A data set's manifest and the folder its shards lie in."""

    root: Path
    vocab_size: int
    eod_id: int
    dtype: str
    tokenizer_file: str
    tokenizer_sha256: str
    tokenizer_kind: str
    train: tuple[Shard, ...]
    val: tuple[Shard, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "vocab_size": self.vocab_size,
            "eod_id": self.eod_id,
            "dtype": self.dtype,
            "tokenizer": {
                "file": self.tokenizer_file,
                "sha256": self.tokenizer_sha256,
                "kind": self.tokenizer_kind,
            },
            "train": [s.as_json() for s in self.train],
            "val": [s.as_json() for s in self.val],
        }

    def canonical(self) -> bytes:
        return canonical_json(self.as_json())

    @property
    def digest(self) -> str:
        """The data set hash: the SHA-256 of the canonical manifest."""
        return hashlib.sha256(self.canonical()).hexdigest()

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def train_tokens(self) -> int:
        return sum(s.tokens for s in self.train)

    @property
    def val_tokens(self) -> int:
        return sum(s.tokens for s in self.val)

    def tokenizer_text(self) -> str:
        path = self.root / self.tokenizer_file
        if not path.is_file():
            raise ConfigError(f"tokenizer file {path} is missing; prepare the data set again")
        text = path.read_text(encoding="utf-8")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != self.tokenizer_sha256:
            raise ConfigError(
                f"tokenizer file {path} does not match the manifest's hash; prepare the data set "
                "again or restore the file"
            )
        return text

    def verify(self, on_shard: Callable[[Shard], None] | None = None) -> None:
        """Check every shard's size and SHA-256 (and the tokenizer's); the first bad file
        stops it with an error that names it."""
        self.tokenizer_text()
        for shard in (*self.train, *self.val):
            self.check_size(shard)
            if file_sha256(self.root / shard.file) != shard.sha256:
                raise ConfigError(
                    f"shard {self.root / shard.file} does not match its hash in the manifest; "
                    "restore it or prepare the data set again"
                )
            if on_shard is not None:
                on_shard(shard)

    def check_size(self, shard: Shard) -> None:
        path = self.root / shard.file
        if not path.is_file():
            raise ConfigError(
                f"shard {path} is missing; copy the data set's shards beside {MANIFEST_FILE}"
            )
        if path.stat().st_size != shard.tokens * self.itemsize:
            raise ConfigError(
                f"shard {path} is {path.stat().st_size} bytes, not the manifest's "
                f"{shard.tokens} {self.dtype} tokens; restore it or prepare the data set again"
            )

    def read(self, shard: Shard, start: int, count: int) -> np.ndarray:
        """Tokens ``start .. start + count`` of ``shard`` (int64), read with one ``pread``."""
        if start < 0 or start + count > shard.tokens:
            raise ConfigError(f"tokens {start}..{start + count} lie outside shard {shard.file}")
        size = self.itemsize
        fd = os.open(self.root / shard.file, os.O_RDONLY)
        try:
            raw = os.pread(fd, count * size, start * size)
        finally:
            os.close(fd)
        if len(raw) != count * size:
            raise ConfigError(f"shard {self.root / shard.file} is shorter than its manifest says")
        return np.frombuffer(raw, dtype=np.dtype(self.dtype).newbyteorder("<")).astype(np.int64)


def load_manifest(path: Path | str) -> Manifest:
    """The manifest at ``path`` (its file, or the folder holding ``manifest.json``), checked
    for form only (``Manifest.verify`` checks the shards)."""
    path = Path(path)
    file = path / MANIFEST_FILE if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"data set manifest {file} does not exist; run `gwtf-node data prepare`")
    if file.stat().st_size > MAX_MANIFEST_BYTES:
        raise ConfigError(f"data set manifest {file} is over {MAX_MANIFEST_BYTES} bytes")
    raw = file.read_bytes()
    try:
        data = json.loads(raw)
        manifest = _from_json(file.parent, data)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"data set manifest {file} is malformed ({exc}); prepare it again"
        ) from None
    if manifest.canonical() != raw:
        raise ConfigError(
            f"data set manifest {file} is not in canonical form (edited by hand?); prepare it again"
        )
    return manifest


def _from_json(root: Path, data: dict[str, Any]) -> Manifest:
    if data.get("format") != FORMAT:
        raise ValueError(f"format is {data.get('format')!r}, not {FORMAT!r}")
    tokenizer = data["tokenizer"]
    manifest = Manifest(
        root=root,
        vocab_size=int(data["vocab_size"]),
        eod_id=int(data["eod_id"]),
        dtype=str(data["dtype"]),
        tokenizer_file=_plain_name(tokenizer["file"]),
        tokenizer_sha256=str(tokenizer["sha256"]),
        tokenizer_kind=str(tokenizer["kind"]),
        train=tuple(_shard(s) for s in data["train"]),
        val=tuple(_shard(s) for s in data["val"]),
    )
    if manifest.dtype != token_dtype(manifest.vocab_size):
        raise ValueError(f"dtype {manifest.dtype} does not fit vocabulary {manifest.vocab_size}")
    if not 0 <= manifest.eod_id < manifest.vocab_size:
        raise ValueError(f"eod_id {manifest.eod_id} is outside the vocabulary")
    return manifest


def _shard(raw: dict[str, Any]) -> Shard:
    shard = Shard(_plain_name(raw["file"]), int(raw["tokens"]), str(raw["sha256"]))
    if shard.tokens < 1 or len(shard.sha256) != 64:
        raise ValueError(f"shard {shard.file} has no tokens or a malformed sha256")
    return shard


def _plain_name(name: object) -> str:
    """A file name inside the data set's folder: a manifest never points elsewhere."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in {".", ".."}:
        raise ValueError(f"{name!r} is not a plain file name")
    return name


def run_vocab(data: str, vocab_size: int = 0) -> int:
    """The run's vocabulary: the data set's tokenizer's (``data``: its manifest or folder), else
    ``vocab_size`` (``training.vocab_size``, a node without the data set), else the byte
    tokenizer's."""
    if not data:
        return vocab_size or BYTE_VOCAB_SIZE
    vocab = load_manifest(data).vocab_size
    if vocab_size and vocab_size != vocab:
        raise ConfigError(
            f"training.vocab_size={vocab_size} but data set {data} has a vocabulary of {vocab}; "
            "drop training.vocab_size"
        )
    return vocab
