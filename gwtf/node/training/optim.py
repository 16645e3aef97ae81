"""AdamW, its learning-rate schedule and gradient clipping, shared by every part and by the
whole-model reference so that both take exactly the same step."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from gwtf.node.training.settings import OptimizerSettings


def lr_at(step: int, settings: OptimizerSettings) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``min_lr`` at ``total_steps``."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    if step >= settings.total_steps:
        return settings.min_lr
    span = max(1, settings.total_steps - settings.warmup_steps)
    progress = (step - settings.warmup_steps) / span
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return settings.min_lr + cosine * (settings.lr - settings.min_lr)


def build_adamw(
    named_params: Sequence[tuple[str, nn.Parameter]], settings: OptimizerSettings
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings only (not on norms and biases)."""
    decayed = [param for _, param in named_params if param.dim() >= 2]
    plain = [param for _, param in named_params if param.dim() < 2]
    groups = [
        {"params": decayed, "weight_decay": settings.weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    # foreach=False: the single-tensor kernel gives a part and the whole model the same
    # arithmetic per element however parameters are grouped.
    return torch.optim.AdamW(
        groups,
        lr=settings.lr,
        betas=(settings.beta1, settings.beta2),
        eps=settings.eps,
        foreach=False,
    )


def optimizer_param_names(named_params: Sequence[tuple[str, nn.Parameter]]) -> list[str]:
    """Parameter names in the order ``build_adamw`` numbers them in its state dict."""
    decayed = [name for name, param in named_params if param.dim() >= 2]
    return decayed + [name for name, param in named_params if param.dim() < 2]


def clip_gradients(params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Scale gradients so their joint L2 norm is at most ``max_norm``; returns the norm before."""
    with_grad = [param for param in params if param.grad is not None]
    if not with_grad:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(with_grad, max_norm, foreach=False)
    return float(norm)
