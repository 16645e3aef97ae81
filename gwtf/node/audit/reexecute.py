"""Re-executing a hop: the worker's stage, with its weights at the hop's iteration, run on the
hop's input, compared with the output the worker signed.

A forward is the stage on the input activation; a backward is the stage's forward on the
forward hop's input, then its backward on the output gradient it was sent, giving the gradient
for upstream. Both run on CPU in float32. The frames are the bytes the receipts' digests name,
checked here before anything runs, so a replay never runs on other data than what was signed.

The comparison: **exact** when the re-executed frame has the signed output digest (CPU float32
with the same kernels and thread count is bitwise reproducible); otherwise within ``tolerance``
(relative L2 error and cosine similarity), which covers another thread count or BLAS blocking
on CPU (``CPU_FLOAT32``) and, for a worker that computed in bf16 autocast on CUDA, the rounding of
bf16 (``CUDA_BF16``). A replay outside the tolerance is a wrong tensor.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gwtf.contracts.encoding import FORWARD, HopReceipt
from gwtf.errors import ProtocolError
from gwtf.node.audit.tolerance import CPU_FLOAT32, CUDA_BF16, HALF_WIRE, TOLERANCES, Tolerance
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import load_part_state
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

#: Half-precision wire dtypes (``training.wire_dtype``) a hop's output may travel in.
WIRE_HALVES = (torch.bfloat16, torch.float16)

__all__ = [
    "CPU_FLOAT32",
    "CUDA_BF16",
    "TOLERANCES",
    "HopEvidence",
    "Replay",
    "Replayer",
    "Tolerance",
    "compare",
]


@dataclass(frozen=True)
class HopEvidence:
    """What a replay needs of one hop, as fetched: the frames its receipt's digests name, the
    forward's input for a backward, and the stage's state file at the iteration."""

    receipt: HopReceipt
    input_frame: bytes
    output_frame: bytes
    state: bytes
    forward_input_frame: bytes | None = None


@dataclass(frozen=True)
class Replay:
    """The outcome of re-executing one hop."""

    exact: bool
    relative_error: float
    cosine: float
    wrong: bool
    compute_s: float  # the stage's forward (and backward) alone
    state_digest: str

    def describe(self) -> str:
        if self.exact:
            return "re-executed: bit-identical"
        return f"re-executed: relative error {self.relative_error:.2e}, cosine {self.cosine:.8f}"


class Replayer:
    """Re-executes hops of one run's model on CPU; keeps one stage worker per state loaded."""

    def __init__(
        self,
        plan: PartitionPlan,
        settings: TrainingSettings,
        tolerance: Tolerance = CPU_FLOAT32,
        limits: CodecLimits | None = None,
    ) -> None:
        self.plan = plan
        # An auditor needs no GPU, and replays at full precision: each hop's output is rounded
        # to the dtype the worker sent it in (the run's wire dtype) before it is compared.
        self.settings = replace(settings, device="cpu", wire_dtype="param")
        self.tolerance = tolerance
        self.limits = limits or CodecLimits()
        # Keyed by the state file itself: a dict compares the very object by identity, and
        # bytes cache their hash, so the hops of one iteration find their worker at no cost.
        self._loaded: dict[tuple[int, bytes], tuple[StageWorker, str]] = {}

    def replay(self, evidence: HopEvidence) -> Replay:
        """Re-execute ``evidence``'s hop; raises ``ProtocolError`` on evidence that is not the
        receipt's (a frame with another digest or microbatch, a state of another part)."""
        r = evidence.receipt
        _check_digest(evidence.input_frame, r.inputDigest, "input")
        _check_digest(evidence.output_frame, r.outputDigest, "output")
        if not 1 <= r.stage <= self.plan.n_stages:
            raise ProtocolError(f"stage {r.stage} is outside the run's 1..{self.plan.n_stages}")
        worker, digest = self._worker(r.stage, evidence.state)
        if worker.step_count != r.iteration:
            raise ProtocolError(
                f"the state is at step {worker.step_count}, the hop of iteration {r.iteration}"
            )
        grad_in = self._tensor(evidence.input_frame, r.microbatchId)
        sent = self._decoded(evidence.output_frame, r.microbatchId)
        claimed = sent.to(torch.float32)
        started = time.perf_counter()
        try:
            if r.direction == FORWARD:
                replayed = worker.forward(r.microbatchId, grad_in)
            else:
                if evidence.forward_input_frame is None:
                    raise ProtocolError("a backward replays only with its forward's input")
                activation = self._tensor(evidence.forward_input_frame, r.microbatchId)
                worker.forward(r.microbatchId, activation)
                replayed = worker.backward(r.microbatchId, grad_in)
        finally:
            worker.drop(r.microbatchId)
            worker.discard_gradients()
        compute_s = time.perf_counter() - started
        if sent.dtype in WIRE_HALVES:  # the receiver accepted it: the run's wire dtype
            replayed = replayed.to(sent.dtype)
        frame = codec.encode(r.microbatchId, replayed, self.limits)
        exact = hashlib.sha256(frame).digest() == r.outputDigest
        error, cosine = compare(claimed, replayed.to(torch.float32))
        tolerance = wire_tolerance(self.tolerance, sent.dtype)
        within = error <= tolerance.max_relative_error and cosine >= tolerance.min_cosine
        return Replay(exact, error, cosine, not (exact or within), compute_s, digest)

    def _worker(self, stage: int, state: bytes) -> tuple[StageWorker, str]:
        key = (stage, state)
        if key not in self._loaded:
            worker = StageWorker(self.plan, stage - 1, self.settings, seed=0)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "state.safetensors"
                path.write_bytes(state)
                try:
                    digest = load_part_state(worker, path)
                except Exception as exc:  # a peer's bytes: any failure is its
                    raise ProtocolError(f"the stage state does not load: {exc}") from exc
            if len(self._loaded) >= 4:
                self._loaded.pop(next(iter(self._loaded)))
            self._loaded[key] = (worker, digest)
        return self._loaded[key]

    def _tensor(self, frame: bytes, microbatch_id: int) -> torch.Tensor:
        return self._decoded(frame, microbatch_id).to(torch.float32)

    def _decoded(self, frame: bytes, microbatch_id: int) -> torch.Tensor:
        decoded = codec.decode(bytearray(frame), self.limits)
        if decoded.microbatch_id != microbatch_id:
            raise ProtocolError(
                f"a frame of microbatch {decoded.microbatch_id}, the hop's is {microbatch_id}"
            )
        return decoded.tensor


def wire_tolerance(tolerance: Tolerance, sent: torch.dtype) -> Tolerance:
    """``tolerance``, or for an output sent in a half dtype no tighter than that dtype's
    rounding allows an honest hop (``HALF_WIRE``)."""
    if sent not in WIRE_HALVES:
        return tolerance
    floor = HALF_WIRE[str(sent).removeprefix("torch.")]
    return Tolerance(
        max(tolerance.max_relative_error, floor.max_relative_error),
        min(tolerance.min_cosine, floor.min_cosine),
    )


def compare(claimed: torch.Tensor, replayed: torch.Tensor) -> tuple[float, float]:
    """(relative L2 error, cosine similarity) of ``claimed`` against ``replayed``; a shape
    mismatch is as wrong as can be (inf, 0)."""
    if claimed.shape != replayed.shape:
        return math.inf, 0.0
    a = claimed.double().reshape(-1)
    b = replayed.double().reshape(-1)
    norm = float(b.norm())
    error = (
        float((a - b).norm()) / norm if norm > 0 else (0.0 if float(a.norm()) == 0 else math.inf)
    )
    denominator = float(a.norm()) * norm
    cosine = float(a @ b) / denominator if denominator > 0 else (1.0 if error == 0 else 0.0)
    return error, cosine


def _check_digest(frame: bytes, digest: bytes, what: str) -> None:
    if hashlib.sha256(frame).digest() != digest:
        raise ProtocolError(f"the {what} frame is not the one the receipt names")
