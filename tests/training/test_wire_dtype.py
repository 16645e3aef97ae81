"""A half-precision wire (``training.wire_dtype``): activations and gradients travel in bf16 or
fp16, half the bytes, while every part computes in its master dtype. Training stays close to the
exact wire, a part refuses a frame in another dtype than the run's, the run commits to the wire,
and an auditor replays a half-precision hop bit for bit whatever its own setting."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from gwtf.contracts.encoding import BACKWARD, FORWARD
from gwtf.node.audit.reexecute import CPU_FLOAT32, HopEvidence, Replayer
from gwtf.node.chain.actions import RunModel
from gwtf.node.receipts.cheats import WRONG_TENSOR_SCALE
from gwtf.node.training import codec
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler
from gwtf.node.training.errors import ActivationError, ModelConfigError
from gwtf.node.training.local_pipeline import LocalPipeline, round_robin
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from tests.training.test_reexecute import ITERATION, MICROBATCH, receipt, stage_with_kept_state

LIMITS = CodecLimits()
STEPS, MICROBATCHES = 3, 4


def train(wire: str, sampler: MicrobatchSampler) -> tuple[list[float], int]:
    """Losses of STEPS iterations of gpt-tiny in 2 stages, and the bytes of one activation."""
    settings = TrainingSettings(device="cpu", wire_dtype=wire)  # type: ignore[arg-type]
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    pipeline = LocalPipeline(plan, settings, 7, sampler)
    losses = []
    for step in range(STEPS):
        ids = range(step * MICROBATCHES, (step + 1) * MICROBATCHES)
        losses += [pipeline.run_microbatch(m, lambda m, s: round_robin(m, s, 1)) for m in ids]
        pipeline.finish_iteration()
    activation = LocalPipeline(plan, settings, 7, sampler).data_node.embed(0)
    return losses, len(codec.encode(0, activation, LIMITS))


def test_a_half_wire_halves_the_bytes_and_stays_close_to_the_exact_one(
    sampler: MicrobatchSampler,
) -> None:
    exact, exact_bytes = train("param", sampler)
    for wire in ("bfloat16", "float16"):
        losses, wire_bytes = train(wire, sampler)
        assert wire_bytes < 0.55 * exact_bytes
        assert losses == pytest.approx(exact, abs=2e-2)
        # Rounding is real: a half wire is not the exact one.
        assert losses != exact


def test_a_part_refuses_a_frame_in_another_dtype_than_the_runs(
    sampler: MicrobatchSampler,
) -> None:
    settings = TrainingSettings(device="cpu", wire_dtype="bfloat16")
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    pipeline = LocalPipeline(plan, settings, 7, sampler)
    activation = pipeline.data_node.embed(0)
    assert activation.dtype == torch.bfloat16
    stage = pipeline.stages[0][0]
    with pytest.raises(ActivationError, match=r"dtype torch\.float32, expected torch\.bfloat16"):
        stage.forward(0, activation.to(torch.float32))
    output = stage.forward(0, activation)
    with pytest.raises(ActivationError, match=r"expected torch\.bfloat16"):
        stage.backward(0, torch.zeros_like(output, dtype=torch.float16))


def test_the_run_commits_to_its_wire_and_a_wire_no_one_knows_is_refused() -> None:
    exact = RunModel.of(TrainingSettings())
    assert "wire" not in exact.describe()  # runs opened with the exact wire keep their hash
    half = RunModel.of(TrainingSettings(wire_dtype="bfloat16"))
    assert half.describe().endswith(", wire bfloat16")
    assert half.config_hash != exact.config_hash
    with pytest.raises(ModelConfigError, match=r"training\.wire_dtype='int8' is not one of"):
        TrainingSettings(wire_dtype="int8").validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("auditor_wire", ["param", "bfloat16"])
def test_an_auditor_replays_a_bf16_hop_bit_for_bit_whatever_its_own_setting(
    tmp_path: Path, auditor_wire: str
) -> None:
    plan, worker, archive = stage_with_kept_state(tmp_path)
    worker.device.wire_dtype = torch.bfloat16  # the relay of a bf16-wire run
    generator = torch.Generator().manual_seed(3)
    activation = torch.randn(2, 16, plan.config.d_model, generator=generator)
    activation, grad = activation.to(torch.bfloat16), torch.randn_like(activation).bfloat16()
    frames = {"activation": codec.encode(MICROBATCH, activation, LIMITS)}
    output = worker.forward(MICROBATCH, activation)
    frames["output"] = codec.encode(MICROBATCH, output, LIMITS)
    frames["grad"] = codec.encode(MICROBATCH, grad, LIMITS)
    frames["input_grad"] = codec.encode(MICROBATCH, worker.backward(MICROBATCH, grad), LIMITS)
    # The wrong-tensor cheat's 1e-3 is below bf16's rounding (2**-9): its output rounds back to
    # the honest one, harmless and unseen. A 1 % error survives the wire.
    assert torch.equal(output * (1 + WRONG_TENSOR_SCALE), output)
    frames["wrong"] = codec.encode(MICROBATCH, output * 1.01, LIMITS)
    state = archive.state(0, ITERATION)
    assert state is not None
    settings = TrainingSettings(device="cpu", wire_dtype=auditor_wire)  # type: ignore[arg-type]
    replayer = Replayer(plan, settings)

    def replay(direction: int, frame_in: str, frame_out: str, forward_input: str | None = None):  # type: ignore[no-untyped-def]
        r = receipt(direction, frames[frame_in], frames[frame_out])
        kept = frames[forward_input] if forward_input else None
        return replayer.replay(HopEvidence(r, frames[frame_in], frames[frame_out], state, kept))

    assert replay(FORWARD, "activation", "output").exact
    assert replay(BACKWARD, "grad", "input_grad", "activation").exact
    wrong = replay(FORWARD, "activation", "wrong")
    assert wrong.wrong and not wrong.exact
    assert hashlib.sha256(frames["output"]).digest() != hashlib.sha256(frames["wrong"]).digest()


def test_an_honest_half_wire_hop_from_another_sum_order_is_within_the_cpu_tolerance(
    tmp_path: Path,
) -> None:
    """Another machine's float32 differs in the last bits; rounded to bf16 a few elements land a
    step apart. The CPU tolerance alone (1e-5) would call that wrong; the half wire's floor does
    not, and still sees a 1 % error."""
    plan, worker, archive = stage_with_kept_state(tmp_path)
    generator = torch.Generator().manual_seed(4)
    activation = torch.randn(2, 16, plan.config.d_model, generator=generator).bfloat16()
    exact = worker.forward(MICROBATCH, activation.float())  # float32 wire: the unrounded output
    worker.drop(MICROBATCH)
    noise = 1 + 1e-5 * torch.randn(exact.shape, generator=generator)  # 100x float32 sum order
    elsewhere = (exact * noise).bfloat16()
    assert not torch.equal(elsewhere, exact.bfloat16())  # some elements did cross a boundary
    state = archive.state(0, ITERATION)
    assert state is not None
    replayer = Replayer(plan, TrainingSettings(device="cpu"))  # CPU_FLOAT32
    frames = {"activation": codec.encode(MICROBATCH, activation, LIMITS)}
    for name, output in (("honest", elsewhere), ("wrong", elsewhere.float() * 1.01)):
        frames[name] = codec.encode(MICROBATCH, output.bfloat16(), LIMITS)
    for name, wrong in (("honest", False), ("wrong", True)):
        r = receipt(FORWARD, frames["activation"], frames[name])
        replay = replayer.replay(HopEvidence(r, frames["activation"], frames[name], state))
        assert not replay.exact and replay.wrong == wrong, (name, replay)
        if name == "honest":  # beyond the CPU tolerance: only the floor keeps it honest
            assert replay.relative_error > CPU_FLOAT32.max_relative_error
