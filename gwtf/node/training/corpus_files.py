"""A sponsor's corpus files, read as documents or as tokens, one bounded batch at a time.

Kinds, by file name: plain text (``.txt``, ``.md``, ``.text``: documents are paragraphs, split
at blank lines, or whole files), JSON Lines (``.jsonl``, ``.ndjson``: one document per line, in
a text field), Parquet (``.parquet``: one document per row of a text column) and pre-tokenized
nanoGPT-style token files (``.bin``: flat little-endian uint16 or uint32 ids, the width given;
``.npy``: a one-dimensional uint16/uint32 array, its width in its header). A folder stands for
the files of those kinds under it, in name order.

Every error names the file (and the line of a JSON Lines file): a corpus is checked as it is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gwtf.errors import ConfigError

TEXT_SUFFIXES = (".txt", ".md", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
TOKEN_SUFFIXES = (".bin", ".npy")
TOKEN_DTYPES = ("uint16", "uint32")
#: A JSON Lines record longer than this is refused (a runaway line, not a document).
MAX_LINE_BYTES = 256 * 1024 * 1024
DOC_SPLITS = ("paragraph", "file")


@dataclass(frozen=True)
class CorpusFile:
    path: Path
    kind: str  # "text" | "jsonl" | "parquet" | "tokens"

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def corpus_files(inputs: Sequence[Path], exclude: Path | None = None) -> list[CorpusFile]:
    """The files ``inputs`` name (a folder: its files of a known kind, in name order), less
    those inside ``exclude`` (the data set's own folder: its shards are no input)."""
    found: list[CorpusFile] = []
    skipped = exclude.resolve() if exclude is not None else None
    for path in inputs:
        if skipped is not None and path.resolve().is_relative_to(skipped):
            raise ConfigError(f"corpus input {path} lies inside --out {exclude}; name another")
        if path.is_dir():
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and _kind(p) is not None
                and not (skipped is not None and p.resolve().is_relative_to(skipped))
            )
            if not files:
                raise ConfigError(
                    f"corpus folder {path} holds no text, JSON Lines, Parquet or token files"
                )
            found += [CorpusFile(p, _kind(p) or "") for p in files]
        elif not path.is_file():
            raise ConfigError(f"corpus file {path} does not exist; check the path")
        else:
            kind = _kind(path)
            if kind is None:
                raise ConfigError(
                    f"corpus file {path}: unknown kind; name it .txt/.md, .jsonl, .parquet, "
                    ".bin or .npy"
                )
            found.append(CorpusFile(path, kind))
    if not found:
        raise ConfigError("no corpus files given; name files or folders to prepare")
    return found


def _kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    for kind, suffixes in (
        ("text", TEXT_SUFFIXES),
        ("jsonl", JSONL_SUFFIXES),
        ("parquet", PARQUET_SUFFIXES),
        ("tokens", TOKEN_SUFFIXES),
    ):
        if suffix in suffixes:
            return kind
    return None


def documents(
    file: CorpusFile, field: str = "text", doc_split: str = "paragraph", batch: int = 1024
) -> Iterator[list[str]]:
    """The documents of a text, JSON Lines or Parquet file, ``batch`` at a time."""
    if file.kind == "text":
        yield from _batched(_text_documents(file.path, doc_split), batch)
    elif file.kind == "jsonl":
        yield from _batched(_jsonl_documents(file.path, field), batch)
    elif file.kind == "parquet":
        yield from _parquet_documents(file.path, field, batch)
    else:
        raise ConfigError(f"corpus file {file.path} holds tokens, not documents")


def _text_documents(path: Path, doc_split: str) -> Iterator[str]:
    if doc_split not in DOC_SPLITS:
        raise ConfigError(f"--doc-split {doc_split!r} is not one of {', '.join(DOC_SPLITS)}")
    try:
        with path.open(encoding="utf-8") as handle:
            if doc_split == "file":
                text = handle.read()
                if text.strip():
                    yield text
                return
            paragraph: list[str] = []
            for line in handle:
                if line.strip():
                    paragraph.append(line)
                elif paragraph:
                    yield "".join(paragraph)
                    paragraph = []
            if paragraph:
                yield "".join(paragraph)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"corpus file {path} is not UTF-8 text ({exc.reason})") from None


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if len(line) > MAX_LINE_BYTES:
                raise ConfigError(f"{path}:{number}: a line over {MAX_LINE_BYTES} bytes")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ConfigError(f"{path}:{number}: not a JSON object; fix the line") from None
            if not isinstance(record, dict) or field not in record:
                raise ConfigError(
                    f"{path}:{number}: no text field {field!r}; name the field with --field"
                )
            text = record[field]
            if not isinstance(text, str):
                raise ConfigError(f"{path}:{number}: field {field!r} is not a string")
            if text:
                yield text


def _parquet_documents(path: Path, column: str, batch: int) -> Iterator[list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigError(f"corpus file {path} is not a Parquet file ({exc})") from None
    names = parquet.schema_arrow.names
    if column not in names:
        raise ConfigError(
            f"{path}: no text column {column!r} (it has {', '.join(names)}); name it with --field"
        )
    kind = parquet.schema_arrow.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"{path}: column {column!r} holds {kind}, not text")
    for record_batch in parquet.iter_batches(batch_size=batch, columns=[column]):
        texts = [t for t in record_batch.column(0).to_pylist() if t]
        if texts:
            yield texts


def _batched(items: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def token_array(file: CorpusFile, raw_dtype: str) -> np.ndarray:
    """A token file's ids as a read-only memory map (``.bin``: ``raw_dtype`` wide)."""
    path = file.path
    if file.path.suffix.lower() == ".npy":
        try:
            array: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise ConfigError(f"token file {path} is not a .npy array ({exc})") from None
        if array.ndim != 1 or array.dtype.newbyteorder("<") not in (np.uint16, np.uint32):
            raise ConfigError(
                f"token file {path} holds {array.dtype} of shape {array.shape}; "
                "a one-dimensional uint16 or uint32 array is needed"
            )
        return array
    if raw_dtype not in TOKEN_DTYPES:
        raise ConfigError(f"--token-dtype {raw_dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
    width = np.dtype(raw_dtype).itemsize
    if file.size % width:
        raise ConfigError(
            f"token file {path} is {file.size} bytes, not a whole number of {raw_dtype} ids; "
            "check --token-dtype"
        )
    if file.size == 0:
        return np.zeros(0, dtype=np.dtype(raw_dtype).newbyteorder("<"))
    return np.memmap(path, dtype=np.dtype(raw_dtype).newbyteorder("<"), mode="r")


def token_width(array: np.ndarray) -> str:
    return "uint16" if array.dtype.itemsize == 2 else "uint32"
