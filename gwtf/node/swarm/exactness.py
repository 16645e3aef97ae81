"""How closely a swarm's run trained like the whole model on the same microbatch ids.

The first data node's own settings file (``<out>/data.toml``) says what was trained; the whole
model is trained alone on the same microbatches (``gwtf.node.training.reference``) and compared
iteration by iteration. A swarm that loses no work differs only by summation order (~1e-7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gwtf.node.settings import load_settings
from gwtf.node.training.reference import whole_model_run, worst_relative_difference


def against_whole_model(out_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The whole model's loss per iteration and the worst relative difference from the run's;
    with ``training.validation_every``, the whole model's validation loss every that many
    iterations too, as [iteration, loss] pairs."""
    training = load_settings(env={}, config_file=out_dir / "data.toml").training
    losses = summary["loss_per_iteration"]
    reference = whole_model_run(training, len(losses))
    return {
        "whole_model_loss_per_iteration": [round(loss, 8) for loss in reference.losses],
        "whole_model_validation_loss": [[i, round(v, 8)] for i, v in reference.validation],
        "worst_relative_difference": worst_relative_difference(losses, reference.losses),
    }
