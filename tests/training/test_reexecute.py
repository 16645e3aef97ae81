"""Re-executing hops from kept evidence: a real stage's forward and backward, replayed from
the frames and the state file a relay keeps (``EvidenceArchive``), are bit-identical on CPU;
an output off by the ``wrong-tensor`` cheat's 1e-3 is wrong, one off by float32 summation
order is not; evidence that is not the receipt's is refused."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gwtf.contracts.encoding import BACKWARD, FORWARD, HopReceipt
from gwtf.errors import ProtocolError
from gwtf.node.audit.reexecute import CPU_FLOAT32, CUDA_BF16, HopEvidence, Replayer, compare
from gwtf.node.receipts.cheats import WRONG_TENSOR_SCALE
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import (
    holds_state_of,
    save_part_state,
    snapshot_part_state,
    verified_digest,
)
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.errors import CheckpointError
from gwtf.node.training.partition import PartitionPlan, plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

SETTINGS = TrainingSettings(device="cpu")
LIMITS = CodecLimits()
ITERATION, MICROBATCH = 3, 7


def receipt(direction: int, input_frame: bytes, output_frame: bytes) -> HopReceipt:
    return HopReceipt(
        runId=1, epoch=0, dataNode="0x" + "11" * 20, iteration=ITERATION,
        microbatchId=MICROBATCH, stage=2, direction=direction, attempt=0,
        worker="0x" + "22" * 20, counterparty="0x" + "33" * 20,
        inputDigest=hashlib.sha256(input_frame).digest(),
        outputDigest=hashlib.sha256(output_frame).digest(), units=100,
    )  # fmt: skip


def stage_with_kept_state(evidence_dir: Path) -> tuple[PartitionPlan, StageWorker, EvidenceArchive]:
    """A stage-2 relay of gpt-tiny at iteration ITERATION whose archive keeps its weights."""
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    worker = StageWorker(plan, 1, SETTINGS, seed=5)
    worker.step_count = ITERATION
    archive = EvidenceArchive(evidence_dir, keep_epochs=2)
    archive.keep_state(
        0,
        ITERATION,
        lambda: snapshot_part_state(worker, weights_only=True),
        lambda kept: holds_state_of(kept, worker, weights_only=True),
    )
    return plan, worker, archive


@pytest.fixture(scope="module")
def hops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Replayer, EvidenceArchive, dict]:
    """A stage-2 relay's forward and backward of one microbatch at iteration 3, kept."""
    plan, worker, archive = stage_with_kept_state(tmp_path_factory.mktemp("evidence"))
    generator = torch.Generator().manual_seed(1)
    activation = torch.randn(2, 16, plan.config.d_model, generator=generator)
    grad = torch.randn(2, 16, plan.config.d_model, generator=generator)
    frames = {"activation": codec.encode(MICROBATCH, activation, LIMITS)}
    output = worker.forward(MICROBATCH, activation)
    frames["output"] = codec.encode(MICROBATCH, output, LIMITS)
    frames["grad"] = codec.encode(MICROBATCH, grad, LIMITS)
    frames["input_grad"] = codec.encode(MICROBATCH, worker.backward(MICROBATCH, grad), LIMITS)
    frames["wrong"] = codec.encode(MICROBATCH, output * (1 + WRONG_TENSOR_SCALE), LIMITS)
    for frame in frames.values():
        archive.keep_frame(0, frame)
    return Replayer(plan, SETTINGS), archive, frames


def evidence(
    archive: EvidenceArchive, r: HopReceipt, forward_input: bytes | None = None
) -> HopEvidence:
    state = archive.state(0, ITERATION)
    frame_in, frame_out = archive.frame(0, r.inputDigest), archive.frame(0, r.outputDigest)
    assert state is not None and frame_in is not None and frame_out is not None
    return HopEvidence(r, frame_in, frame_out, state, forward_input)


def test_an_honest_forward_and_backward_replay_bit_identical(hops: tuple) -> None:
    replayer, archive, f = hops
    forward = replayer.replay(evidence(archive, receipt(FORWARD, f["activation"], f["output"])))
    assert forward.exact and not forward.wrong and forward.relative_error == 0.0
    backward_receipt = receipt(BACKWARD, f["grad"], f["input_grad"])
    backward = replayer.replay(evidence(archive, backward_receipt, f["activation"]))
    assert backward.exact and not backward.wrong
    assert forward.state_digest == backward.state_digest
    assert forward.compute_s > 0


def test_the_wrong_tensor_cheats_output_is_wrong(hops: tuple) -> None:
    replayer, archive, f = hops
    replay = replayer.replay(evidence(archive, receipt(FORWARD, f["activation"], f["wrong"])))
    assert replay.wrong and not replay.exact
    assert replay.relative_error == pytest.approx(WRONG_TENSOR_SCALE, rel=1e-2)
    assert replay.relative_error > 10 * CPU_FLOAT32.max_relative_error


def test_float32_summation_order_is_within_the_tolerance() -> None:
    """The same product summed in another order (what another thread count does) differs in
    the last bits only: far inside CPU_FLOAT32."""
    generator = torch.Generator().manual_seed(2)
    a, b = torch.randn(64, 256, generator=generator), torch.randn(256, 64, generator=generator)
    blocked = sum(a[:, i : i + 32] @ b[i : i + 32] for i in range(0, 256, 32))
    error, cosine = compare(blocked, a @ b)
    assert 0 < error < CPU_FLOAT32.max_relative_error / 10
    assert cosine > CPU_FLOAT32.min_cosine


def test_evidence_that_is_not_the_receipts_is_refused(hops: tuple) -> None:
    replayer, archive, f = hops
    r = receipt(FORWARD, f["activation"], f["output"])
    good = evidence(archive, r)
    with pytest.raises(ProtocolError, match="input frame is not the one"):
        replayer.replay(replace(good, input_frame=f["grad"]))
    with pytest.raises(ProtocolError, match="state is at step"):
        replayer.replay(replace(good, receipt=replace(r, iteration=ITERATION + 1)))
    with pytest.raises(ProtocolError, match="does not load"):
        replayer.replay(replace(good, state=b"not a state file"))
    backward = receipt(BACKWARD, f["grad"], f["input_grad"])
    with pytest.raises(ProtocolError, match="forward's input"):
        replayer.replay(evidence(archive, backward))
    other = codec.encode(
        MICROBATCH + 1, codec.decode(bytearray(f["activation"]), LIMITS).tensor, LIMITS
    )
    with pytest.raises(ProtocolError, match="microbatch"):
        replayer.replay(
            HopEvidence(receipt(FORWARD, other, f["output"]), other, f["output"], good.state)
        )


def test_the_archive_keeps_a_frame_under_its_digest_until_its_epoch_is_done(
    tmp_path: Path,
) -> None:
    archive = EvidenceArchive(tmp_path, keep_epochs=2)
    digest = archive.keep_frame(0, b"frame of epoch 0")
    assert archive.frame(0, digest) == b"frame of epoch 0"
    assert archive.frame(1, digest) is None and archive.bytes_of(0) == 16
    for epoch in (1, 2, 3):
        archive.keep_frame(epoch, f"frame of epoch {epoch}".encode())
    assert archive.frame(0, digest) is not None  # later epochs' hops delete nothing
    # Epoch 1 is under dispute: it stays while epoch 0 goes.
    assert archive.prune_settled(lambda epoch: epoch in (0, 2)) == [0, 2]
    assert archive.frame(0, digest) is None and archive.bytes_of(0) == 0
    assert archive.kept_epochs() == [1, 3]
    assert not list(tmp_path.rglob("*.tmp"))


def test_two_saves_of_one_state_differ_in_bytes_but_not_in_verified_digest(tmp_path: Path) -> None:
    """safetensors writes its header's keys in no fixed order: replicas' weights are compared
    by their checked content digest, and a file whose content is not its header's is refused."""
    worker = StageWorker(plan_partition(named_config("gpt", "tiny"), 2), 0, SETTINGS, seed=4)
    blobs = []
    for name in ("a", "b", "c"):
        save_part_state(worker, tmp_path / name, weights_only=True)
        blobs.append((tmp_path / name).read_bytes())
    assert len({verified_digest(blob) for blob in blobs}) == 1
    tampered = bytearray(blobs[0])
    tampered[-1] ^= 1
    with pytest.raises(CheckpointError, match="not the digest"):
        verified_digest(bytes(tampered))
    with pytest.raises(CheckpointError, match="not a state file"):
        verified_digest(b"\xff" * 16)


def test_with_a_clock_a_made_up_epoch_is_never_kept(tmp_path: Path) -> None:
    now = [5]
    archive = EvidenceArchive(tmp_path, keep_epochs=2, epoch_now=lambda: now[0])
    kept = archive.keep_frame(5, b"frame of epoch 5")
    archive.keep_frame(2**62, b"a hop a peer stamped with a far epoch")
    archive.keep_frame(3, b"a hop of an epoch past keeping")
    assert archive.frame(5, kept) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["5"]
    chunk = archive.frame_chunk(5, kept, 6, 5)
    assert chunk is not None and (chunk.total, chunk.data) == (16, b"of ep")
    now[0] = 7  # epoch 5 is past its window: no new hop of it is kept, the kept ones stay
    archive.keep_frame(7, b"frame of epoch 7")
    archive.keep_frame(5, b"a late hop of epoch 5")
    assert archive.frame(5, kept) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["5", "7"] and archive.bytes_of(5) == 16


def test_under_the_bf16_tolerance_a_1e3_error_is_honest_rounding(hops: tuple) -> None:
    """What a GPU relay's honest bf16 hop looks like replayed on CPU is within CUDA_BF16, so an
    auditor that cannot tell how relays computed accuses none of them for it."""
    replayer, archive, f = hops
    lenient = Replayer(replayer.plan, SETTINGS, CUDA_BF16)
    replay = lenient.replay(evidence(archive, receipt(FORWARD, f["activation"], f["wrong"])))
    assert not replay.exact and not replay.wrong
