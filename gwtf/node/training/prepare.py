"""``gwtf-node data prepare``: a sponsor's corpus tokenized once into hashed shards and a manifest.

Documents are tokenized with the run's tokenizer, each followed by the end-of-document id, and
fall into the validation split by a hash of their text (so a duplicated document never lies on
both sides, and the split does not depend on file order). A pre-tokenized file is already one
stream: its last ``val_fraction`` of tokens is its validation part.

Each input file has its own shards (``train-FFFFF-KKKK.bin``, ``val-FFFFF-KKKK.bin``), written to
a temporary file, hashed and renamed; a file's shards are recorded under ``.prepare/`` once all
are written. An interrupted run picks up where it stopped: a file whose record matches the file
(its path, size and modification time) and the options, and whose shards still hash right, is
not read again. The manifest is written last.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gwtf.errors import ConfigError
from gwtf.node.training.corpus_files import (
    CorpusFile,
    corpus_files,
    documents,
    token_array,
    token_width,
)
from gwtf.node.training.shards import (
    MANIFEST_FILE,
    Manifest,
    Shard,
    canonical_json,
    file_sha256,
    token_dtype,
)
from gwtf.node.training.tokenizer import (
    RunTokenizer,
    byte_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

log = logging.getLogger(__name__)
TOKENIZER_FILE = "tokenizer.json"
STATE_DIR = ".prepare"
DEFAULT_SHARD_TOKENS = 100_000_000
#: Tokens of a pre-tokenized file copied at a time.
_TOKEN_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class PrepareOptions:
    inputs: tuple[Path, ...]
    out: Path
    #: A sponsor's tokenizer.json; with neither it nor ``train_vocab``, the byte tokenizer.
    tokenizer: Path | None = None
    #: Train a byte-level BPE of this many tokens on the corpus (0: do not).
    train_vocab: int = 0
    eod_token: str | None = None
    field: str = "text"  # JSON Lines field / Parquet column holding each document
    doc_split: str = "paragraph"  # plain text: "paragraph" (blank lines) or "file"
    token_dtype: str = "uint16"  # width of raw .bin token files
    val_fraction: float = 0.01
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    batch_docs: int = 1024

    def validate(self) -> None:
        if self.tokenizer is not None and self.train_vocab:
            raise ConfigError("give --tokenizer or --train-tokenizer, not both")
        if not 0.0 <= self.val_fraction <= 0.5:
            raise ConfigError(f"--val-fraction {self.val_fraction} must lie within 0..0.5")
        if self.shard_tokens < 1 or self.batch_docs < 1:
            raise ConfigError("--shard-tokens and the batch size must be >= 1")
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a file; name a folder")


@dataclass
class Prepared:
    manifest: Manifest
    files_read: int = 0
    files_reused: int = 0
    input_bytes: int = 0
    notes: list[str] = field(default_factory=list)


#: Called with the number of input bytes just processed.
Progress = Callable[[int], None]


def input_files(options: PrepareOptions) -> list[CorpusFile]:
    """The corpus files, less any inside ``--out`` (an earlier run's shards are no input)."""
    return corpus_files(options.inputs, exclude=options.out)


def input_bytes(options: PrepareOptions) -> int:
    return sum(f.size for f in input_files(options))


def prepare(options: PrepareOptions, progress: Progress = lambda n: None) -> Prepared:
    """Tokenize and shard ``options.inputs`` into ``options.out``; returns the manifest."""
    options.validate()
    files = input_files(options)
    _check_token_widths(files, options.token_dtype)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / STATE_DIR).mkdir(exist_ok=True)
    tokenizer = _tokenizer(options, files)
    _atomic_write(options.out / TOKENIZER_FILE, tokenizer.json_text.encode("utf-8"))
    vocab = tokenizer.vocab_size
    dtype = token_dtype(vocab)
    result_train: list[Shard] = []
    result_val: list[Shard] = []
    done = Prepared(manifest=None)  # type: ignore[arg-type]  # set below
    for index, file in enumerate(files):
        done.input_bytes += file.size
        key = _file_key(file, tokenizer, options)
        state = options.out / STATE_DIR / f"{index:05d}.json"
        shards = _reusable(state, key, options.out, dtype)
        if shards is None:
            shards = _prepare_file(index, file, tokenizer, dtype, options, progress)
            _atomic_write(state, canonical_json({"key": key, **_split_json(shards)}))
            done.files_read += 1
        else:
            progress(file.size)
            done.files_reused += 1
        result_train += shards[0]
        result_val += shards[1]
    if not result_train:
        raise ConfigError("the corpus gave no training tokens; give it documents")
    if options.val_fraction > 0 and not result_val:
        raise ConfigError(
            "no document fell into the validation split; give more documents, a larger "
            "--val-fraction, or --val-fraction 0 (no validation loss)"
        )
    manifest = Manifest(
        root=options.out,
        vocab_size=vocab,
        eod_id=tokenizer.eod_id,
        dtype=dtype,
        tokenizer_file=TOKENIZER_FILE,
        tokenizer_sha256=tokenizer.sha256,
        tokenizer_kind=tokenizer.kind,
        train=tuple(result_train),
        val=tuple(result_val),
    )
    _atomic_write(options.out / MANIFEST_FILE, manifest.canonical())
    done.manifest = manifest
    return done


def _tokenizer(options: PrepareOptions, files: list[CorpusFile]) -> RunTokenizer:
    if options.tokenizer is not None:
        return load_tokenizer(options.tokenizer, options.eod_token)
    if not options.train_vocab:
        return byte_tokenizer()
    texts = [f for f in files if f.kind != "tokens"]
    if len(texts) != len(files):
        raise ConfigError(
            "--train-tokenizer needs text: pre-tokenized files come with their own tokenizer; "
            "give it with --tokenizer"
        )
    # Training reads the whole corpus: reuse the tokenizer trained on these very files.
    key = hashlib.sha256(
        canonical_json(
            {
                "vocab": options.train_vocab,
                "files": [_identity(f) for f in files],
                "field": options.field,
                "doc_split": options.doc_split,
            }
        )
    ).hexdigest()
    state = options.out / STATE_DIR / "tokenizer.json"
    cached = _cached_tokenizer(state, key)
    if cached is not None:
        return cached
    tokenizer = train_tokenizer(_all_texts(texts, options), options.train_vocab)
    record = {"key": key, "json": tokenizer.json_text, "eod_id": tokenizer.eod_id}
    _atomic_write(state, canonical_json(record))
    return tokenizer


def _cached_tokenizer(state: Path, key: str) -> RunTokenizer | None:
    """The tokenizer an earlier run trained on the same files; None when there is none, it
    was trained on others, or its record is damaged (it is trained again, never trusted)."""
    if not state.is_file():
        return None
    try:
        record = json.loads(state.read_text(encoding="utf-8"))
        if record["key"] != key:
            return None
        tokenizer = RunTokenizer(str(record["json"]), int(record["eod_id"]), "trained")
        tokenizer.check()
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        log.warning("%s is damaged (%s); training the tokenizer again", state, exc)
        return None
    return tokenizer


def _all_texts(files: list[CorpusFile], options: PrepareOptions) -> Iterator[str]:
    for file in files:
        for batch in documents(file, options.field, options.doc_split, options.batch_docs):
            yield from batch


def _check_token_widths(files: list[CorpusFile], raw_dtype: str) -> None:
    """All pre-tokenized files of a corpus hold ids of one width."""
    first: tuple[Path, str] | None = None
    for file in files:
        if file.kind != "tokens":
            continue
        width = token_width(token_array(file, raw_dtype))
        if first is None:
            first = (file.path, width)
        elif width != first[1]:
            raise ConfigError(
                f"token file {file.path} holds {width} ids but {first[0]} holds {first[1]}; "
                "give files of one width"
            )


def _prepare_file(
    index: int,
    file: CorpusFile,
    tokenizer: RunTokenizer,
    dtype: str,
    options: PrepareOptions,
    progress: Progress,
) -> tuple[list[Shard], list[Shard]]:
    train = _ShardWriter(options.out, f"train-{index:05d}", dtype, options.shard_tokens)
    val = _ShardWriter(options.out, f"val-{index:05d}", dtype, options.shard_tokens)
    if file.kind == "tokens":
        _copy_tokens(file, tokenizer.vocab_size, options, train, val, progress)
    else:
        eod = np.array([tokenizer.eod_id], dtype=np.int64)
        threshold = int(options.val_fraction * 2**64)
        vocab = tokenizer.vocab_size
        reported = 0
        for batch in documents(file, options.field, options.doc_split, options.batch_docs):
            for text, ids in zip(batch, tokenizer.encode_batch(batch), strict=True):
                if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) < vocab:
                    raise ConfigError(
                        f"the tokenizer gave {file.path} an id outside its vocabulary of "
                        f"{vocab}; give a consistent tokenizer.json"
                    )
                target = val if _hash64(text) < threshold else train
                target.add(np.concatenate((ids, eod)))
            step = min(sum(len(t) for t in batch), file.size - reported)  # characters ~ bytes
            progress(step)
            reported += step
        progress(file.size - reported)
    return train.close(), val.close()


def _copy_tokens(
    file: CorpusFile,
    vocab: int,
    options: PrepareOptions,
    train: _ShardWriter,
    val: _ShardWriter,
    progress: Progress,
) -> None:
    array = token_array(file, options.token_dtype)
    total = len(array)
    val_start = total - int(total * options.val_fraction)
    for start in range(0, total, _TOKEN_CHUNK):
        chunk = np.asarray(array[start : start + _TOKEN_CHUNK], dtype=np.int64)
        top = int(chunk.max())
        if top >= vocab:
            raise ConfigError(
                f"token file {file.path} holds id {top}, outside the tokenizer's vocabulary of "
                f"{vocab}; give its tokenizer with --tokenizer"
            )
        cut = min(max(val_start - start, 0), len(chunk))
        if cut:
            train.add(chunk[:cut])
        if cut < len(chunk):
            val.add(chunk[cut:])
        progress(len(chunk) * array.dtype.itemsize)
    if total == 0:
        progress(file.size)


class _ShardWriter:
    """Whole documents into shards of at least ``shard_tokens`` tokens (the last one smaller).
    Each document is cast to the shard's width as it comes and written straight to the
    shard's temporary file, hashed on the way: a shard is never held in memory."""

    def __init__(self, out: Path, prefix: str, dtype: str, shard_tokens: int) -> None:
        self.out, self.prefix, self.shard_tokens = out, prefix, shard_tokens
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shards: list[Shard] = []
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._tokens = 0

    @property
    def _name(self) -> str:
        return f"{self.prefix}-{len(self.shards):04d}.bin"

    def add(self, ids: np.ndarray) -> None:
        """Append ``ids`` (checked by the caller to lie inside the vocabulary)."""
        if self._file is None:
            self._file = (self.out / (self._name + ".partial")).open("wb")
            self._hash = hashlib.sha256()
        data = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        self._file.write(data)
        self._hash.update(data)
        self._tokens += len(ids)
        if self._tokens >= self.shard_tokens:
            self._finish()

    def close(self) -> list[Shard]:
        if self._file is not None:
            self._finish()
        return self.shards

    def _finish(self) -> None:
        assert self._file is not None
        name = self._name
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.out / (name + ".partial"), self.out / name)
        self.shards.append(Shard(name, self._tokens, self._hash.hexdigest()))
        self._file, self._tokens = None, 0


def _reusable(
    state: Path, key: str, out: Path, dtype: str
) -> tuple[list[Shard], list[Shard]] | None:
    """A file's shards from an earlier run, when its record matches and every shard hashes
    right; None: prepare the file again (a mismatch is redone, never an error)."""
    if not state.is_file():
        return None
    try:
        record = json.loads(state.read_text(encoding="utf-8"))
        if record["key"] != key:
            return None
        splits = tuple(
            [Shard(s["file"], int(s["tokens"]), s["sha256"]) for s in record[name]]
            for name in ("train", "val")
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    width = np.dtype(dtype).itemsize
    for shard in (*splits[0], *splits[1]):
        path = out / shard.file
        if not path.is_file() or path.stat().st_size != shard.tokens * width:
            return None
        if file_sha256(path) != shard.sha256:
            return None
    return splits[0], splits[1]


def _file_key(file: CorpusFile, tokenizer: RunTokenizer, options: PrepareOptions) -> str:
    what = {
        "file": _identity(file),
        "tokenizer": tokenizer.sha256,
        "eod": tokenizer.eod_id,
        "field": options.field,
        "doc_split": options.doc_split,
        "token_dtype": options.token_dtype,
        "val_fraction": options.val_fraction,
        "shard_tokens": options.shard_tokens,
    }
    return hashlib.sha256(canonical_json(what)).hexdigest()


def _identity(file: CorpusFile) -> dict[str, object]:
    stat = file.path.stat()
    return {"path": str(file.path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _split_json(shards: tuple[list[Shard], list[Shard]]) -> dict[str, object]:
    return {"train": [s.as_json() for s in shards[0]], "val": [s.as_json() for s in shards[1]]}


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
