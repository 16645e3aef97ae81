"""``gwtf-node data prepare|verify``: a sponsor's corpus as a run's data set.

``prepare`` tokenizes plain text, JSON Lines, Parquet or pre-tokenized token files with the run's
tokenizer (a ``tokenizer.json``, one trained on the corpus, or bytes) into hashed token shards and
a manifest (``gwtf.node.training.prepare``); the manifest's SHA-256 is the data set hash a run opens
with (``runs open --data``) and a data node trains on (``training.data``). Interrupted, it picks
up where it stopped. ``verify`` checks a data set's shards against its manifest.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gwtf.node.cli.args import Command, positive
from gwtf.node.cli.output import emit
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    data = sub.add_parser("data", help="prepare a corpus as a run's data set, verify one")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare",
        help="tokenize and shard a corpus into a data set (shards and a hashed manifest)",
        description="Reads .txt/.md (documents: paragraphs, or whole files with --doc-split "
        "file), .jsonl (a text field), .parquet (a text column), and .bin/.npy token files "
        "(nanoGPT style), or folders of them; writes token shards, tokenizer.json and "
        "manifest.json into --out. Run it again to resume.",
    )
    prepare.add_argument("inputs", nargs="+", type=Path, help="corpus files or folders")
    prepare.add_argument("--out", type=Path, required=True, help="the data set's folder")
    tokenizer = prepare.add_mutually_exclusive_group()
    tokenizer.add_argument("--tokenizer", type=Path, help="a Hugging Face tokenizer.json")
    tokenizer.add_argument(
        "--train-tokenizer",
        type=positive,
        default=0,
        metavar="VOCAB",
        help="train a byte-level BPE of VOCAB tokens on the corpus (default: byte tokenizer)",
    )
    prepare.add_argument("--eod-token", help="the tokenizer's end-of-document token")
    prepare.add_argument("--field", default="text", help="JSON Lines field / Parquet column")
    prepare.add_argument(
        "--doc-split",
        choices=("paragraph", "file"),
        default="paragraph",
        help="a plain text file's documents (default: paragraphs)",
    )
    prepare.add_argument(
        "--token-dtype",
        choices=("uint16", "uint32"),
        default="uint16",
        help="width of .bin token files (default uint16)",
    )
    prepare.add_argument(
        "--val-fraction",
        type=float,
        default=0.01,
        help="share of documents held out for validation (default 0.01)",
    )
    prepare.add_argument(
        "--shard-tokens", type=positive, default=100_000_000, help="tokens per shard (default 10^8)"
    )
    verify = actions.add_parser("verify", help="check a data set's shards against its manifest")
    verify.add_argument("manifest", type=Path, help="the manifest.json or its folder")
    return {"data": cmd_data}


def cmd_data(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    if args.data_command == "verify":
        return _verify(args, console)
    return _prepare(args, console)


def _prepare(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from gwtf.node.training.prepare import PrepareOptions, input_bytes, prepare

    options = PrepareOptions(
        inputs=tuple(args.inputs),
        out=args.out,
        tokenizer=args.tokenizer,
        train_vocab=args.train_tokenizer,
        eod_token=args.eod_token,
        field=args.field,
        doc_split=args.doc_split,
        token_dtype=args.token_dtype,
        val_fraction=args.val_fraction,
        shard_tokens=args.shard_tokens,
    )
    options.validate()
    total = input_bytes(options)
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=bool(args.json), transient=True) as bar:
        task = bar.add_task("preparing", total=total)
        result = prepare(options, lambda n: bar.advance(task, n))
    manifest = result.manifest
    summary = {
        "manifest": str(args.out / "manifest.json"),
        "dataset_hash": "0x" + manifest.digest,
        "vocab_size": manifest.vocab_size,
        "dtype": manifest.dtype,
        "eod_id": manifest.eod_id,
        "tokenizer": manifest.tokenizer_kind,
        "tokenizer_sha256": manifest.tokenizer_sha256,
        "train_tokens": manifest.train_tokens,
        "val_tokens": manifest.val_tokens,
        "shards": len(manifest.train) + len(manifest.val),
        "files_read": result.files_read,
        "files_reused": result.files_reused,
    }
    return emit(args, console, summary, functools.partial(_render, summary))


def _render(summary: dict[str, Any], console: Console) -> None:
    console.print(
        f"{summary['train_tokens']:,} training and {summary['val_tokens']:,} validation tokens "
        f"in {summary['shards']} shards ({summary['dtype']}, vocabulary "
        f"{summary['vocab_size']:,}, {summary['tokenizer']} tokenizer); "
        f"{summary['files_read']} files read, {summary['files_reused']} already prepared",
        highlight=False,
    )
    console.print(f"manifest: {summary['manifest']}", highlight=False)
    console.print(f"data set hash: {summary['dataset_hash']}", highlight=False)


def _verify(args: argparse.Namespace, console: Console) -> int:
    from gwtf.node.training.shards import load_manifest

    manifest = load_manifest(args.manifest)
    manifest.verify()
    summary = {
        "dataset_hash": "0x" + manifest.digest,
        "shards": len(manifest.train) + len(manifest.val),
        "train_tokens": manifest.train_tokens,
        "val_tokens": manifest.val_tokens,
    }
    return emit(
        args,
        console,
        summary,
        lambda c: c.print(
            f"{summary['shards']} shards match the manifest; data set hash "
            f"{summary['dataset_hash']}",
            highlight=False,
        ),
    )
