"""A run's model out of its nodes: gathered, checked, mapped to the Hugging Face layout and
written. ``gwtf-node export`` and the demo call ``export_run``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from gwtf.errors import ConfigError
from node.chain.actions import Contracts, model_config_hash
from node.export.assembly import whole_tensors
from node.export.gather import Gathered, gather_run
from node.export.writer import check_out_dir, write_checkpoint
from node.training.config import ModelConfig, named_config
from node.training.hf_export import to_hf
from node.training.partition import PartitionPlan, plan_partition


def export_run(
    contracts: Contracts,
    run_id: int,
    model: str,
    peers: Sequence[str],
    out: Path,
    timeout_s: float,
    gathering: Callable[[Callable[[], Gathered]], Gathered] = lambda gather: gather(),
) -> dict[str, Any]:
    """Export run ``run_id`` (training ``model``) from the nodes at ``peers`` into ``out``, a
    new or empty folder; returns what ``gwtf-export.json`` says, with the files written.
    ``gathering`` runs the network part (a command shows a spinner around it)."""
    check_out_dir(out)
    plan = run_plan(contracts, run_id, model)
    gather = functools.partial(gather_run, contracts, run_id, plan, peers, timeout_s)
    gathered = gathering(lambda: trio.run(gather))
    checkpoint = to_hf(plan.config, whole_tensors(plan.config, [p for p, _ in gathered.parts]))
    architecture = checkpoint.config["architectures"][0]
    result = export_summary(run_id, model, architecture, plan, gathered)
    written = write_checkpoint(checkpoint, out, result)
    return {**result, "out": str(out), "files": [path.name for path in written]}


def run_plan(contracts: Contracts, run_id: int, model: str) -> PartitionPlan:
    """The run's partition of ``model``, once the chain says the run trains that model."""
    run = contracts.port().run_info(run_id)
    if run is None:
        raise ConfigError(f"there is no run {run_id} on this chain; see `gwtf-node runs list`")
    config = model_config(model)
    if model_config_hash(model, run.stage_count) != run.model_config_hash:
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
