"""Training data, checkpoints, the optimizer schedule, settings and the device choice."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gwtf.errors import ConfigError
from gwtf.node.training.checkpoint import load_part_state, save_part_state, state_digest
from gwtf.node.training.config import named_config
from gwtf.node.training.data import (
    ByteTokenizer,
    Corpus,
    MicrobatchSampler,
    load_default_corpus,
    sample_offsets,
)
from gwtf.node.training.device import DeviceContext, resolve_device
from gwtf.node.training.errors import CheckpointError, ModelConfigError
from gwtf.node.training.optim import lr_at
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import OptimizerSettings, TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

PLAN = plan_partition(named_config("gpt", "tiny"), 2)


def test_byte_tokenizer_round_trips_text() -> None:
    tokenizer = ByteTokenizer()
    tokens = tokenizer.encode("To be, or not — to be")
    assert tokens.dtype == torch.int64 and int(tokens.max()) < tokenizer.vocab_size
    assert tokenizer.decode(tokens) == "To be, or not — to be"


def test_default_corpus_is_shipped_and_hashed() -> None:
    corpus = load_default_corpus()
    assert len(corpus.tokens) > 1_000_000
    assert ByteTokenizer().decode(corpus.tokens[:9]) == "First Cit"
    assert len(corpus.digest) == 64


def test_microbatch_tokens_are_a_pure_function_of_hash_and_id() -> None:
    corpus = load_default_corpus()
    a, b = MicrobatchSampler(corpus, 4, 32), MicrobatchSampler(corpus, 4, 32)
    inputs, targets = a(17)
    again, _ = b(17)
    assert torch.equal(inputs, again)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert not torch.equal(inputs, a(18)[0])
    offsets = sample_offsets("ab" * 32, 5, 1000, 100, 2000)
    assert all(0 <= offset <= 1900 for offset in offsets) and len(set(offsets)) > 300
    assert sample_offsets("cd" * 32, 5, 8, 100, 2000) != sample_offsets("ab" * 32, 5, 8, 100, 2000)


def test_sampler_refuses_another_data_set_and_a_short_corpus() -> None:
    corpus = load_default_corpus()
    with pytest.raises(ConfigError, match="data set hash"):
        MicrobatchSampler(corpus, 2, 8, expected_digest="00" * 32)
    with pytest.raises(ConfigError, match="too short"):
        MicrobatchSampler(Corpus.from_bytes(b"tiny"), 1, 8)(0)


def settings() -> TrainingSettings:
    return TrainingSettings(device="cpu", optimizer=OptimizerSettings(lr=1e-2, warmup_steps=1))


def train_step(worker: StageWorker, microbatch_id: int) -> None:
    generator = torch.Generator().manual_seed(microbatch_id)
    x = torch.randn(2, 8, 64, generator=generator)
    worker.forward(microbatch_id, x)
    worker.backward(microbatch_id, torch.randn(2, 8, 64, generator=generator))
    worker.step()


def test_a_joining_replica_loads_a_peers_state_and_stays_bit_identical(tmp_path: Path) -> None:
    peer = StageWorker(PLAN, 1, settings(), seed=1)
    for m in range(3):
        train_step(peer, m)
    digest = save_part_state(peer, tmp_path / "peer.safetensors")
    joiner = StageWorker(PLAN, 1, settings(), seed=2)  # different start on purpose
    assert state_digest(joiner) != digest
    assert load_part_state(joiner, tmp_path / "peer.safetensors") == digest
    assert state_digest(joiner) == digest and joiner.step_count == 3
    for m in range(3, 6):
        train_step(peer, m)
        train_step(joiner, m)
    assert state_digest(joiner) == state_digest(peer)


def test_a_tampered_checkpoint_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    peer = StageWorker(PLAN, 1, settings(), seed=1)
    train_step(peer, 0)
    path = tmp_path / "peer.safetensors"
    save_part_state(peer, path)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01  # a bit of the last tensor's data
    path.write_bytes(bytes(raw))
    victim = StageWorker(PLAN, 1, settings(), seed=2)
    before = state_digest(victim)
    with pytest.raises(CheckpointError, match="digest mismatch"):
        load_part_state(victim, path)
    assert state_digest(victim) == before
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_part_state(victim, tmp_path / "junk.safetensors")


def test_a_checkpoint_of_another_part_is_refused(tmp_path: Path) -> None:
    stage0 = StageWorker(PLAN, 0, settings(), seed=1)
    save_part_state(stage0, tmp_path / "s0.safetensors")
    with pytest.raises(CheckpointError, match="same part"):
        load_part_state(StageWorker(PLAN, 1, settings(), seed=1), tmp_path / "s0.safetensors")


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    schedule = OptimizerSettings(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=14)
    rates = [lr_at(step, schedule) for step in range(16)]
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0]
    assert rates[4] == 1.0 and rates[9] == pytest.approx(0.55)
    assert all(a >= b for a, b in itertools.pairwise(rates[4:]))
    assert rates[14] == rates[15] == 0.1


@pytest.mark.parametrize(
    "bad",
    [
        TrainingSettings(device="tpu"),  # type: ignore[arg-type]
        TrainingSettings(param_dtype="int8"),  # type: ignore[arg-type]
        TrainingSettings(max_in_flight=0),
        TrainingSettings(codec_max_ndim=0),
        TrainingSettings(optimizer=OptimizerSettings(lr=1e-4, min_lr=1e-3)),
        TrainingSettings(optimizer=OptimizerSettings(grad_clip_norm=0.0)),
        TrainingSettings(optimizer=OptimizerSettings(beta2=1.0)),
    ],
)
def test_bad_settings_are_refused_by_name(bad: TrainingSettings) -> None:
    with pytest.raises(ModelConfigError, match="training"):
        bad.validate()


def test_device_choice() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    context = DeviceContext(replace(settings(), device="auto"))
    assert context.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")
        cpu = DeviceContext(settings())
        assert not cpu.uses_autocast
        tensor = torch.ones(3)
        assert cpu.to_device(tensor) is tensor
