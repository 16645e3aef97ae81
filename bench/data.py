"""How fast ``gwtf-node data prepare`` turns a corpus into a data set, against the ``tokenizers``
library's own batch encoding of the same files (the baseline: the tokenizing alone, nothing
written). Goal: prepare at >= 0.8 of the baseline's MB/s.

The corpus is the shipped Tiny Shakespeare text repeated to ``--mb`` MB, as JSON Lines (one
paragraph a line) and as plain text; the tokenizer is a byte-level BPE of ``--vocab`` tokens
trained on it once, outside the timings. Both sides read the same files and encode the same
documents in batches of 1,024 (``encode_batch_fast``); prepare also splits train from validation,
writes and hashes the shards and the manifest. Best of ``--repeats`` runs each, interleaved.

Usage: python bench/data.py [--mb 8] [--vocab 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gwtf.node.training.corpus_files import corpus_files, documents
from gwtf.node.training.data import DEFAULT_CORPUS
from gwtf.node.training.prepare import PrepareOptions, prepare
from gwtf.node.training.tokenizer import train_tokenizer

BATCH = 1024


def write_corpus(folder: Path, megabytes: float) -> dict[str, Path]:
    shipped = Path(__file__).resolve().parents[1] / "gwtf/node/training/data" / DEFAULT_CORPUS
    text = shipped.read_text(encoding="utf-8")
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    target = int(megabytes * 1e6)
    lines, size, copy = [], 0, 0
    while size < target:
        for p in paragraphs:
            doc = f"{copy}: {p}"
            lines.append(doc)
            size += len(doc.encode())
        copy += 1
    jsonl = folder / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in lines), encoding="utf-8")
    plain = folder / "corpus.txt"
    plain.write_text("\n\n".join(lines), encoding="utf-8")
    return {"jsonl": jsonl, "text": plain}


def baseline(path: Path, tokenizer_file: Path) -> None:
    """The library alone: the same documents, read the same way, encoded in batches."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    for file in corpus_files([path]):
        for batch in documents(file, batch=BATCH):
            tokenizer.encode_batch_fast(batch, add_special_tokens=False)


def ours(path: Path, tokenizer_file: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    prepare(PrepareOptions((path,), out, tokenizer=tokenizer_file, batch_docs=BATCH))


def best(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mb", type=float, default=8.0, help="corpus size in MB")
    parser.add_argument("--vocab", type=int, default=4096, help="the BPE's vocabulary")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-data-") as tmp:
        folder = Path(tmp)
        files = write_corpus(folder, args.mb)
        texts = (d for f in corpus_files([files["jsonl"]]) for b in documents(f) for d in b)
        start = time.perf_counter()
        trained = train_tokenizer(texts, args.vocab)
        train_s = time.perf_counter() - start
        tokenizer_file = folder / "tokenizer.json"
        tokenizer_file.write_text(trained.json_text, encoding="utf-8")
        print(f"corpus {args.mb:g} MB; BPE of {args.vocab} trained in {train_s:.1f} s")
        print(f"{'input':<8}{'MB':>8}{'tokenizers MB/s':>18}{'prepare MB/s':>15}{'ratio':>8}")
        for kind, path in files.items():
            megabytes = path.stat().st_size / 1e6
            base_s, ours_s = float("inf"), float("inf")
            for _ in range(args.repeats):  # interleaved, so load falls on both alike
                base_s = min(base_s, best(lambda p=path: baseline(p, tokenizer_file), 1))
                out = folder / "out"
                ours_s = min(ours_s, best(lambda p=path, o=out: ours(p, tokenizer_file, o), 1))
            print(
                f"{kind:<8}{megabytes:>8.1f}{megabytes / base_s:>18.2f}"
                f"{megabytes / ours_s:>15.2f}{base_s / ours_s:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
