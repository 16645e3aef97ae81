"""Splitting a model into the data-node part and S relay stages of contiguous blocks.

Pure: a function of the config and the request, computed from analytic parameter counts without
building any weights, so every node of a run derives the same plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gwtf.node.training.config import (
    ModelConfig,
    block_param_count,
    data_part_param_count,
    named_config,
    validate_config,
)
from gwtf.node.training.errors import ModelConfigError


@dataclass(frozen=True)
class StageSpan:
    """Stage ``index`` holds blocks ``first_layer .. end_layer - 1``."""

    index: int
    first_layer: int
    end_layer: int
    param_count: int

    @property
    def n_layers(self) -> int:
        return self.end_layer - self.first_layer


@dataclass(frozen=True)
class PartitionPlan:
    config: ModelConfig
    data_param_count: int
    stages: tuple[StageSpan, ...]

    @property
    def n_stages(self) -> int:
        return len(self.stages)


def balance_contiguous(weights: Sequence[int], n_parts: int) -> tuple[int, ...]:
    """Sizes of ``n_parts`` non-empty contiguous groups of ``weights`` that minimise the heaviest
    group (the linear partition problem, by dynamic programming; ties go to earlier cuts)."""
    n_items = len(weights)
    if not 1 <= n_parts <= n_items:
        raise ModelConfigError(f"cannot split {n_items} layers into {n_parts} non-empty stages")
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    infinity = prefix[-1] + 1
    # best[k][i]: the smallest possible heaviest group when the first i items form k groups.
    best = [[infinity] * (n_items + 1) for _ in range(n_parts + 1)]
    cut = [[0] * (n_items + 1) for _ in range(n_parts + 1)]
    best[0][0] = 0
    for k in range(1, n_parts + 1):
        for i in range(k, n_items + 1):
            for j in range(k - 1, i):
                heaviest = max(best[k - 1][j], prefix[i] - prefix[j])
                if heaviest < best[k][i]:
                    best[k][i], cut[k][i] = heaviest, j
    sizes: list[int] = []
    end = n_items
    for k in range(n_parts, 0, -1):
        start = cut[k][end]
        sizes.append(end - start)
        end = start
    return tuple(reversed(sizes))


def plan_partition(
    config: ModelConfig, n_stages: int, layers_per_stage: Sequence[int] | None = None
) -> PartitionPlan:
    """The data-node part plus ``n_stages`` relay stages, balanced by parameter count unless
    ``layers_per_stage`` gives each stage's block count explicitly."""
    validate_config(config)
    if n_stages < 1:
        raise ModelConfigError(f"a run needs at least one relay stage, got n_stages={n_stages}")
    per_layer = block_param_count(config)
    if layers_per_stage is None:
        sizes = balance_contiguous([per_layer] * config.n_layer, n_stages)
    else:
        sizes = tuple(layers_per_stage)
        if len(sizes) != n_stages or any(size < 1 for size in sizes):
            raise ModelConfigError(
                f"layers_per_stage={list(sizes)} must list {n_stages} counts, each at least 1"
            )
        if sum(sizes) != config.n_layer:
            raise ModelConfigError(
                f"layers_per_stage={list(sizes)} sums to {sum(sizes)}, "
                f"but the model has {config.n_layer} layers"
            )
    stages = []
    first = 0
    for index, size in enumerate(sizes):
        stages.append(StageSpan(index, first, first + size, size * per_layer))
        first += size
    return PartitionPlan(config, data_part_param_count(config), tuple(stages))


def model_for_run(
    model: str, seq_len: int, stages: int, vocab_size: int | None = None
) -> ModelConfig:
    """The config a run's settings name ("family-size"), checked against the run's ``seq_len``
    and ``stages``: either mistake would otherwise surface only once a node builds its part.
    ``vocab_size``: the run's tokenizer's (None: the byte tokenizer's, every size's default)."""
    family, _, size = model.partition("-")
    config = named_config(family, size)
    if vocab_size is not None:
        config = dataclasses.replace(config, vocab_size=vocab_size)
    if seq_len > config.block_size:
        raise ModelConfigError(
            f"seq_len={seq_len} is longer than {model}'s context of {config.block_size} tokens; "
            "lower it"
        )
    plan_partition(config, stages)
    return config
