"""``gwtf-node export``: a run's trained model out of the swarm, as one Hugging Face checkpoint.

It reads the run from the chain (its stage count, and that ``--model`` is the model it trains),
gathers the weights of the data part and of every stage at the last optimizer step all of them
have taken from the nodes given with ``--peer`` (``node.export.gather``: only from the run's own
nodes, each download digest-checked), checks that they make one model (``node.export.assembly``)
and writes ``config.json`` and ``model.safetensors`` in the GPT-2 (``GPT2LMHeadModel``) or Llama
(``LlamaForCausalLM``) layout (``node.training.hf_export``), with ``gwtf-export.json`` naming the
run, the step and where each part came from. Nothing is written unless all of it checks out.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

from gwtf.errors import ConfigError
from node.chain.actions import Contracts, model_config_hash
from node.cli.args import Command, positive, whole
from node.cli.output import emit, table
from node.composition import open_contracts
from node.export.assembly import whole_tensors
from node.export.gather import Gathered, gather_run
from node.export.writer import check_out_dir, write_checkpoint
from node.settings import Settings
from node.training.config import ModelConfig, named_config
from node.training.hf_export import to_hf
from node.training.partition import PartitionPlan, plan_partition


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
    export.add_argument("--timeout-s", type=positive, default=20, help="per request to a node")
    return {"export": cmd_export}


def cmd_export(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    out = Path(args.out)
    check_out_dir(out)
    if not args.peer:
        raise ConfigError(
            "give the run's nodes to fetch from: --peer /ip4/HOST/tcp/PORT/p2p/PEER_ID, a data "
            "node and a relay of each stage (the chain holds no node's network address)"
        )
    contracts, _ = open_contracts(settings)
    model = args.model or settings.training.model
    plan = run_plan(contracts, args.run, model)
    gather = functools.partial(
        gather_run, contracts, args.run, plan, args.peer, float(args.timeout_s)
    )
    if args.json:
        gathered = trio.run(gather)
    else:
        with console.status(f"gathering run {args.run}'s parts"):
            gathered = trio.run(gather)
    checkpoint = to_hf(plan.config, whole_tensors(plan.config, [p for p, _ in gathered.parts]))
    architecture = checkpoint.config["architectures"][0]
    result = export_summary(args.run, model, architecture, plan, gathered)
    written = write_checkpoint(checkpoint, out, result)
    result = {**result, "out": str(out), "files": [path.name for path in written]}
    return emit(args, console, result, functools.partial(_render, result))


def run_plan(contracts: Contracts, run_id: int, model: str) -> PartitionPlan:
    """The run's partition of ``model``, once the chain says the run trains that model."""
    run = contracts.port().run_info(run_id)
    if run is None:
        raise ConfigError(f"there is no run {run_id} on this chain; see `gwtf-node runs list`")
    config = model_config(model)
    on_chain = bytes(contracts.ledger.functions.getRun(run_id).call()[11])
    if model_config_hash(model, run.stage_count) != on_chain:
        raise ConfigError(
            f"run {run_id} trains another model than {model!r} in {run.stage_count} stages; "
            "give the run's with --model"
        )
    return plan_partition(config, run.stage_count)


def model_config(model: str) -> ModelConfig:
    family, _, size = model.partition("-")
    return named_config(family, size)


def export_summary(
    run_id: int, model: str, architecture: str, plan: PartitionPlan, got: Gathered
) -> dict[str, Any]:
    """What ``gwtf-export.json`` and ``--json`` say of an export."""
    parts = []
    for stage, (part, node) in enumerate(got.parts):
        layers = part.layers
        parts.append({
            "stage": stage,
            "layers": None if layers is None else [layers.start, layers.stop - 1],
            "node": node,
            "digest": part.digest,
        })  # fmt: skip
    return {
        "run": run_id,
        "model": model,
        "architecture": architecture,
        "step": got.step,
        "parameters": plan.data_param_count + sum(s.param_count for s in plan.stages),
        "parts": parts,
        "peers": got.peers,
    }


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
