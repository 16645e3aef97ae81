"""``gwtf-node export``: a run's trained model out of the swarm, as one Hugging Face checkpoint.

It reads the run from the chain (its stage count, and that ``--model`` is the model it trains),
gathers the weights of the data part and of every stage at the last optimizer step all of them
have taken from the nodes given with ``--peer`` (``gwtf.node.export.gather``: only from the run's
own nodes, each download digest-checked), checks that they make one model
(``gwtf.node.export.assembly``) and writes ``config.json`` and ``model.safetensors`` in the GPT-2
(``GPT2LMHeadModel``) or Llama (``LlamaForCausalLM``) layout (``gwtf.node.training.hf_export``), the
run's tokenizer (``tokenizer.json``, ``tokenizer_config.json``), a model card (``README.md``: the
run, the data set hash, the steps, the validation loss) and ``gwtf-export.json`` naming the run, the
step and where each part came from. Nothing is written unless all of it checks out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gwtf.errors import ConfigError
from gwtf.node.cli.args import Command, positive, whole
from gwtf.node.cli.output import emit, table
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console

    from gwtf.node.export.gather import Gathered


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    export = sub.add_parser(
        "export", help="gather a run's trained model from its nodes into a Hugging Face checkpoint"
    )
    export.add_argument("--run", type=whole, required=True, help="run id")
    export.add_argument("--out", required=True, help="a new or empty directory to write into")
    export.add_argument(
        "--peer", action="append", default=[], metavar="ADDR",
        help="a node of the run to fetch from, /ip4/HOST/tcp/PORT/p2p/PEER_ID (repeat it; give "
        "a data node and a relay of each stage)",
    )  # fmt: skip
    export.add_argument("--model", help="the run's model, e.g. gpt-tiny (default training.model)")
    export.add_argument(
        "--data", help="the run's data set, its manifest.json or folder: its tokenizer is "
        "written beside the weights and its validation windows give the model card's loss "
        "(default training.data; none: the shipped corpus and the byte tokenizer)",
    )  # fmt: skip
    export.add_argument("--timeout-s", type=positive, default=20, help="per request to a node")
    return {"export": cmd_export}


def cmd_export(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.export.run import export_run
    from gwtf.node.export.writer import check_out_dir

    out = Path(args.out)
    check_out_dir(out)  # before anything is asked of the chain or the nodes
    if not args.peer:
        raise ConfigError(
            "give the run's nodes to fetch from: --peer /ip4/HOST/tcp/PORT/p2p/PEER_ID, a data "
            "node and a relay of each stage (the chain holds no node's network address)"
        )
    contracts, _ = open_contracts(settings)
    model = args.model or settings.training.model

    def gathering(gather: Callable[[], Gathered]) -> Gathered:
        if args.json:
            return gather()
        with console.status(f"gathering run {args.run}'s parts from {len(args.peer)} nodes"):
            return gather()

    data = settings.training.data if args.data is None else args.data
    training = dataclasses.replace(settings.training, model=model, data=data)
    result = export_run(
        contracts, args.run, training, args.peer, out, float(args.timeout_s), gathering
    )
    return emit(args, console, result, functools.partial(_render, result))


def _render(result: dict[str, Any], console: Console) -> None:
    rows = [
        [
            "data part" if p["stage"] == 0 else f"stage {p['stage']}",
            "" if p["layers"] is None else f"{p['layers'][0]}-{p['layers'][1]}",
            p["node"],
            p["digest"][:16],
        ]
        for p in result["parts"]
    ]
    console.print(
        table(f"run {result['run']} at step {result['step']}", ["part", "layers", "from", "digest"],
              rows, right_from=4)
    )  # fmt: skip
    for node, why in result["peers"].items():
        if why != "ok":
            console.print(f"peer {node}: {why}")
    console.print(
        f"{result['architecture']} with {result['parameters']:,} parameters written to "
        f"{result['out']} ({', '.join(result['files'])})"
    )
