"""A run's model out of its nodes: gathered, checked, mapped to the Hugging Face layout and
written with the run's tokenizer and a model card. ``gwtf-node export`` and the demo call
``export_run``.

The tokenizer is the run's data set's (``training.data``: the ``tokenizer.json`` its manifest
hashes), or the byte tokenizer for the shipped corpus; the model's vocabulary is its. The
validation loss on the model card is the exported model's own, over the data set's fixed
validation windows of the model's full context.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import trio

from gwtf.errors import ConfigError
from gwtf.node.chain.actions import Contracts, RunModel, check_run_dataset
from gwtf.node.export.assembly import whole_tensors
from gwtf.node.export.gather import Gathered, gather_run
from gwtf.node.export.writer import check_out_dir, write_checkpoint
from gwtf.node.training.config import ModelConfig
from gwtf.node.training.dataset import validation_batches
from gwtf.node.training.errors import ModelConfigError
from gwtf.node.training.hf_export import to_hf
from gwtf.node.training.partition import PartitionPlan, model_for_run, plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.shards import Manifest, load_manifest
from gwtf.node.training.tokenizer import RunTokenizer, byte_tokenizer, tokenizer_config
from gwtf.node.training.validation import whole_model_validation_loss

#: Validation windows the exported model is evaluated on (at its full context).
VALIDATION_WINDOWS = 64


def export_run(
    contracts: Contracts,
    run_id: int,
    training: TrainingSettings,
    peers: Sequence[str],
    out: Path,
    timeout_s: float,
    gathering: Callable[[Callable[[], Gathered]], Gathered] = lambda gather: gather(),
) -> dict[str, Any]:
    """Export run ``run_id`` (training ``training.model`` on the data set ``training.data``,
    "" for the shipped corpus, both checked against the run's commitments on chain) from the
    nodes at ``peers`` into ``out``, a new or empty folder; returns what ``gwtf-export.json``
    says, with the files written. ``gathering`` runs the network part (a command shows a
    spinner around it)."""
    check_out_dir(out)
    model = training.model
    plan = run_plan(contracts, run_id, training)
    dataset = load_manifest(training.data) if training.data else None
    gather = functools.partial(gather_run, contracts, run_id, plan, peers, timeout_s)
    gathered = gathering(lambda: trio.run(gather))
    tensors = whole_tensors(plan.config, [p for p, _ in gathered.parts])
    summary = export_summary(run_id, model, plan, gathered)
    return export_model(plan.config, tensors, out, summary, dataset)


def export_model(
    config: ModelConfig,
    tensors: dict[str, torch.Tensor],
    out: Path,
    summary: dict[str, Any],
    dataset: Manifest | None,
    validation_windows: int = VALIDATION_WINDOWS,
) -> dict[str, Any]:
    """Write the whole model ``tensors`` into ``out`` with its tokenizer and model card;
    ``summary`` (``export_summary``) is completed with the architecture, the data set, the
    tokenizer and the validation loss, and returned with the files written."""
    checkpoint = to_hf(config, tensors)
    if dataset is None:
        tokenizer = byte_tokenizer()
    else:
        tokenizer = RunTokenizer(dataset.tokenizer_text(), dataset.eod_id, dataset.tokenizer_kind)
    if tokenizer.vocab_size != config.vocab_size:
        raise ConfigError(
            f"the run's tokenizer has {tokenizer.vocab_size} tokens but the model "
            f"{config.vocab_size}; give the run's data set with --data"
        )
    result = {
        **summary,
        "architecture": checkpoint.config["architectures"][0],
        "dataset_hash": "0x" + dataset.digest if dataset else None,
        "tokenizer_sha256": tokenizer.sha256,
        **_validation(config, tensors, dataset, validation_windows),
    }
    written = write_checkpoint(
        checkpoint,
        out,
        result,
        tokenizer,
        tokenizer_config(tokenizer, config.block_size),
        model_card(result, config.block_size),
    )
    return {**result, "out": str(out), "files": [path.name for path in written]}


def _validation(
    config: ModelConfig,
    tensors: dict[str, torch.Tensor],
    dataset: Manifest | None,
    windows: int,
) -> dict[str, Any]:
    """The exported model's validation loss and the windows it was measured on (as many as
    the split holds, up to ``windows``), and why there is none."""
    if dataset is None or not dataset.val:
        return {"validation_loss": None, "validation_windows": 0, "validation_note": "no split"}
    batches = validation_batches(dataset, 8, config.block_size, windows)
    loss = whole_model_validation_loss(config, tensors, batches)
    return {
        "validation_loss": None if loss is None else round(loss, 6),
        "validation_windows": sum(len(inputs) for inputs, _ in batches),
        "validation_note": "" if batches else "split shorter than the context",
    }


def model_card(result: dict[str, Any], context: int) -> str:
    """The model's ``README.md``: what it is, where it came from, how to load it."""
    loss = result["validation_loss"]
    measured = (
        f"{loss:.4f} (mean token loss over the data set's first {result['validation_windows']} "
        f"validation windows of {context} tokens)"
        if loss is not None
        else "not measured (the data set has no validation split)"
        if result["validation_note"] == "no split"
        else f"not measured (the validation split holds no window of {context + 1} tokens)"
    )
    data = result["dataset_hash"] or "the shipped Tiny Shakespeare text (byte tokenizer)"
    return (
        "---\nlibrary_name: transformers\ntags:\n- gwtf\n---\n\n"
        f"# {result['model']} from GWTF run {result['run']}\n\n"
        f"Pre-trained by a GWTF swarm (run {result['run']}) and gathered from its nodes.\n\n"
        f"| | |\n|---|---|\n"
        f"| run | {result['run']} |\n"
        f"| architecture | {result['architecture']} ({result['parameters']:,} parameters) |\n"
        f"| data set (manifest SHA-256) | {data} |\n"
        f"| tokenizer SHA-256 | {result['tokenizer_sha256']} |\n"
        f"| optimizer steps | {result['step']} |\n"
        f"| validation loss | {measured} |\n\n"
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")\n'
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")\n```\n'
    )


def run_plan(contracts: Contracts, run_id: int, training: TrainingSettings) -> PartitionPlan:
    """The run's partition of its model, once the chain says the run trains the model and the
    data set ``training`` names."""
    run = contracts.port().run_info(run_id)
    if run is None:
        raise ConfigError(f"there is no run {run_id} on this chain; see `gwtf-node runs list`")
    ours = RunModel.of(training, run.stage_count)
    if ours.config_hash != run.model_config_hash:
        raise ConfigError(
            f"run {run_id} trains another model than {ours.describe()}; give the run's with "
            "--model and training.seq_len, batch_size and seed"
        )
    check_run_dataset(run_id, run.dataset_hash, training.data)
    try:
        config = model_for_run(ours.model, ours.seq_len, ours.stages, ours.vocab_size)
    except ModelConfigError as exc:
        raise ConfigError(f"--model {ours.model}: {exc}") from None
    return plan_partition(config, run.stage_count)


def export_summary(run_id: int, model: str, plan: PartitionPlan, got: Gathered) -> dict[str, Any]:
    """What ``gwtf-export.json`` and ``--json`` say of an export."""
    parts = []
    for stage, (part, node) in enumerate(got.parts):
        layers = part.layers
        parts.append(
            {
                "stage": stage,
                "layers": None if layers is None else [layers.start, layers.stop - 1],
                "node": node,
                "digest": part.digest,
            }
        )
    return {
        "run": run_id,
        "model": model,
        "step": got.step,
        "parameters": plan.data_param_count + sum(s.param_count for s in plan.stages),
        "parts": parts,
        "peers": got.peers,
    }
