"""Validation loss: a fixed, unshuffled list of held-out windows (``dataset.validation_batches``)
evaluated without gradients, the mean token loss over all of them. Evaluated every
``training.validation_every`` iterations, it is comparable across iterations, runs and nodes
because the windows never change."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from gwtf.node.training.config import ModelConfig
from gwtf.node.training.dataset import validation_batches
from gwtf.node.training.model import WholeModel
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.shards import load_manifest

Batch = tuple[torch.Tensor, torch.Tensor]
#: (inputs, targets) -> the mean token loss of a microbatch (a tensor or a float).
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor | float]


def run_validation_batches(training: TrainingSettings) -> list[Batch]:
    """The run's validation windows ([] without a data set or a validation split)."""
    if not training.data:
        return []
    manifest = load_manifest(training.data)
    return validation_batches(
        manifest, training.batch_size, training.seq_len, training.validation_windows
    )


def validation_loss(loss_of: LossFn, batches: Sequence[Batch]) -> float | None:
    """The mean token loss over ``batches`` (each microbatch weighted by its rows); None when
    there are none."""
    if not batches:
        return None
    total, rows = 0.0, 0
    with torch.no_grad():
        for inputs, targets in batches:
            total += float(loss_of(inputs, targets)) * len(inputs)
            rows += len(inputs)
    return total / rows


def due(training: TrainingSettings, iteration: int) -> bool:
    """Whether the validation loss is evaluated after iteration ``iteration`` (0-based)."""
    every = training.validation_every
    return every > 0 and (iteration + 1) % every == 0


def whole_model_validation_loss(
    config: ModelConfig, tensors: Mapping[str, torch.Tensor], batches: Sequence[Batch]
) -> float | None:
    """The validation loss of the whole model ``tensors`` (``WholeModel`` names, as
    ``gwtf.node.export.assembly.whole_tensors`` gives them; a tied head may be left out)."""
    if not batches:
        return None
    model = WholeModel(config, 0).to(next(iter(tensors.values())).dtype)
    missing, unexpected = model.load_state_dict(dict(tensors), strict=False)
    tied = {"data.head.weight"} if config.tie_embeddings else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"not the whole model's tensors: {missing} missing, {unexpected} extra")
    model.eval()
    return validation_loss(model, batches)
