"""One model from the states of its parts, as an export takes it: every part at one optimizer
step, the data part once, every block once, all of the run's model. Pure: states in, the whole
model's tensors (named as ``WholeModel`` names them) out, or an ``ExportError`` saying which
part does not fit."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gwtf.node.training.checkpoint import PartState
from gwtf.node.training.config import ModelConfig
from gwtf.node.training.errors import ExportError

_PARAM = "param/"
_OPTIMIZER = "optim/"


def whole_tensors(config: ModelConfig, parts: Sequence[PartState]) -> dict[str, torch.Tensor]:
    """The whole model's weights from ``parts`` (optimizer state, if any, left out)."""
    check_one_model(config, parts)
    tensors: dict[str, torch.Tensor] = {}
    for part in parts:
        tensors |= _renamed(part)
    return tensors


def check_one_model(config: ModelConfig, parts: Sequence[PartState]) -> None:
    """Refuse parts of another model, of different steps, or that miss or repeat a layer."""
    for part in parts:
        if part.config != config:
            raise ExportError(
                f"the {part.part} state is of another model ({part.config}) than the run's "
                f"({config}); it is not this run's part"
            )
        if part.part == "whole":
            raise ExportError("a whole-model state is no part of a run; export the run's parts")
    steps = sorted({part.step for part in parts})
    if len(steps) > 1:
        at = ", ".join(f"{part.part} at {part.step}" for part in parts)
        raise ExportError(
            f"the parts are of different optimizer steps ({at}); export once every stage has "
            "taken the same step"
        )
    data_parts = sum(part.layers is None for part in parts)
    if data_parts != 1:
        raise ExportError(f"{data_parts} data parts (embedding and head) gathered; need exactly 1")
    holders: list[list[str]] = [[] for _ in range(config.n_layer)]
    for part in parts:
        layers = part.layers
        if layers is None:
            continue
        if layers.stop > config.n_layer:
            raise ExportError(
                f"the {part.part} state holds layers beyond the model's {config.n_layer}"
            )
        for layer in layers:
            holders[layer].append(part.part)
    twice = [f"{layer} ({', '.join(held)})" for layer, held in enumerate(holders) if len(held) > 1]
    if twice:
        raise ExportError(f"layers held by more than one part: {'; '.join(twice)}")
    missing = [str(layer) for layer, held in enumerate(holders) if not held]
    if missing:
        raise ExportError(
            f"layers {', '.join(missing)} are held by no part gathered; give a node of each stage"
        )


def _renamed(part: PartState) -> dict[str, torch.Tensor]:
    """The part's weights under the whole model's names (a stage numbers its blocks from 0)."""
    renamed: dict[str, torch.Tensor] = {}
    layers = part.layers
    for name, tensor in part.tensors.items():
        if name.startswith(_OPTIMIZER):
            continue
        if not name.startswith(_PARAM):
            raise ExportError(f"the {part.part} state holds an unknown tensor {name[:60]!r}")
        name = name.removeprefix(_PARAM)
        if layers is None:
            renamed[f"data.{name}"] = tensor
            continue
        blocks, local, rest = [*name.split(".", 2), "", ""][:3]
        if blocks != "blocks" or not (local.isascii() and local.isdigit()) or not rest:
            raise ExportError(f"the {part.part} state holds an unknown tensor {name[:60]!r}")
        if int(local) >= len(layers):
            raise ExportError(f"the {part.part} state holds a block beyond its layers: {name}")
        renamed[f"body.blocks.{layers[int(local)]}.{rest}"] = tensor
    return renamed
