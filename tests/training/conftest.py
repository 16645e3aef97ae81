"""Shared fixtures of the stage-engine tests: one CPU thread, float64 settings, a tiny sampler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.settings import OptimizerSettings, TrainingSettings


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Two cores are shared by every test area; single-threaded CPU kernels are deterministic too.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def sampler() -> MicrobatchSampler:
    return MicrobatchSampler(load_default_corpus(), batch_size=2, seq_len=16)


@pytest.fixture
def exact_settings() -> TrainingSettings:
    """float64 on CPU, a large learning rate and a tight clip so differences would show."""
    return TrainingSettings(
        device="cpu",
        param_dtype="float64",
        optimizer=OptimizerSettings(
            lr=1e-2, min_lr=1e-3, warmup_steps=1, total_steps=4, grad_clip_norm=0.5
        ),
    )
