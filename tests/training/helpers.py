"""Comparing a split model's parameters with the whole model's, by layer index."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import WholeModelTrainer


def whole_name(part: StageWorker | DataNodeWorker, name: str) -> str:
    """The whole model's name of a part's parameter (stages number their blocks from 0)."""
    if isinstance(part, DataNodeWorker):
        return f"data.{name}"
    _, local, rest = name.split(".", 2)
    return f"body.blocks.{int(local) + part.span.first_layer}.{rest}"


def max_param_difference(
    whole: WholeModelTrainer, parts: Sequence[StageWorker | DataNodeWorker]
) -> float:
    reference = whole.parameters_by_name()
    seen: set[str] = set()
    worst = 0.0
    for part in parts:
        for name, value in part.parameters_by_name().items():
            key = whole_name(part, name)
            seen.add(key)
            worst = max(worst, float((reference[key] - value).abs().max()))
    assert seen == set(reference), "the parts must cover every parameter of the whole model"
    return worst


def params_equal(a: StageWorker | DataNodeWorker, b: StageWorker | DataNodeWorker) -> bool:
    pa, pb = a.parameters_by_name(), b.parameters_by_name()
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def grad_of(param: torch.Tensor) -> torch.Tensor:
    assert param.grad is not None, "backward must have reached this parameter"
    return param.grad
