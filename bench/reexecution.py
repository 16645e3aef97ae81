"""What re-executing a hop costs an auditor, against the hop's own compute, and the disk a relay
spends keeping the evidence.

For each model (a stage of a two-stage split, batch 2, sequence 32, CPU float32, one thread):

* the hop's own compute: a live relay's forward (or forward kept for backward, then backward)
  of one microbatch, its output encoded to a frame (the baseline);
* re-executing it with ``gwtf.node.audit.reexecute.Replayer`` from the kept frames and state file,
  warm (the stage state of that iteration already loaded) and cold (the state file loaded into
  a fresh stage worker first, as for the first hop of each iteration);
* the error between a replay on one thread and on all of the machine's threads (what the CPU
  float32 tolerance has to cover) against that tolerance;
* the evidence kept per hop (input + output frame) and per iteration (the stage's weights), and
  per epoch for ``--iterations`` iterations of ``--microbatches`` microbatches, for one relay
  that computes ``1 / --replicas`` of its stage's hops.

Usage: python bench/reexecution.py [--iterations 60] [--microbatches 8] [--replicas 2]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gwtf.contracts.encoding import BACKWARD, FORWARD, HopReceipt
from gwtf.node.audit.reexecute import CPU_FLOAT32, HopEvidence, Replayer, compare
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import save_part_state
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

SETTINGS = TrainingSettings(device="cpu")
LIMITS = CodecLimits()
BATCH, SEQ, MICROBATCH, REPEATS = 2, 32, 1, 20


def receipt(direction: int, input_frame: bytes, output_frame: bytes) -> HopReceipt:
    return HopReceipt(
        runId=1, epoch=0, dataNode="0x" + "11" * 20, iteration=0, microbatchId=MICROBATCH,
        stage=1, direction=direction, attempt=0, worker="0x" + "22" * 20,
        counterparty="0x" + "33" * 20, inputDigest=hashlib.sha256(input_frame).digest(),
        outputDigest=hashlib.sha256(output_frame).digest(), units=1,
    )  # fmt: skip


def median_s(fn: object, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(family: str, size: str, tmp: Path) -> dict[str, float]:
    plan = plan_partition(named_config(family, size), 2)
    worker = StageWorker(plan, 0, SETTINGS, seed=1)
    generator = torch.Generator().manual_seed(0)
    activation = torch.randn(BATCH, SEQ, plan.config.d_model, generator=generator)
    grad = torch.randn(BATCH, SEQ, plan.config.d_model, generator=generator)

    def forward() -> bytes:
        out = codec.encode(MICROBATCH, worker.forward(MICROBATCH, activation), LIMITS)
        worker.drop(MICROBATCH)
        return out

    def forward_backward() -> bytes:
        worker.forward(MICROBATCH, activation)
        out = codec.encode(MICROBATCH, worker.backward(MICROBATCH, grad), LIMITS)
        worker.discard_gradients()
        return out

    frames = {
        "activation": codec.encode(MICROBATCH, activation, LIMITS),
        "grad": codec.encode(MICROBATCH, grad, LIMITS),
        "output": forward(),
        "input_grad": forward_backward(),
    }
    state_path = tmp / f"{family}-{size}.safetensors"
    save_part_state(worker, state_path, weights_only=True)
    state = state_path.read_bytes()
    fwd = HopEvidence(
        receipt(FORWARD, frames["activation"], frames["output"]), frames["activation"],
        frames["output"], state,
    )  # fmt: skip
    bwd = HopEvidence(
        receipt(BACKWARD, frames["grad"], frames["input_grad"]), frames["grad"],
        frames["input_grad"], state, frames["activation"],
    )  # fmt: skip
    replayer = Replayer(plan, SETTINGS)
    assert replayer.replay(fwd).exact and replayer.replay(bwd).exact
    row = {
        "forward_s": median_s(forward),
        "backward_s": median_s(forward_backward) - median_s(forward),
        "replay_forward_s": median_s(lambda: replayer.replay(fwd)),
        "replay_backward_s": median_s(lambda: replayer.replay(bwd)),
        "replay_cold_s": median_s(lambda: Replayer(plan, SETTINGS).replay(fwd), 5),
        "frame_bytes": len(frames["activation"]),
        "state_bytes": len(state),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one = worker.forward(MICROBATCH, activation).clone()
    worker.drop(MICROBATCH)
    torch.set_num_threads(max(threads, 1) * 4)  # another blocking of the same sums
    many = worker.forward(MICROBATCH, activation).clone()
    worker.drop(MICROBATCH)
    torch.set_num_threads(1)
    row["thread_error"], row["thread_cosine"] = compare(many, one)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60, help="iterations per epoch")
    parser.add_argument("--microbatches", type=int, default=8, help="per iteration")
    parser.add_argument("--replicas", type=int, default=2, help="relays per stage")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'model (stage 1 of 2)':<22}{'measure':<46}{'value':>12}  vs")
    with tempfile.TemporaryDirectory() as tmp:
        for family, size in (("gpt", "tiny"), ("gpt", "small"), ("llama", "small")):
            r = measure(family, size, Path(tmp))
            own = r["forward_s"] + r["backward_s"]
            hops_per_relay = 2 * args.microbatches * args.iterations / args.replicas
            per_epoch = hops_per_relay * 2 * r["frame_bytes"] + args.iterations * r["state_bytes"]
            rows = [
                ("forward hop, own compute (ms)", f"{1e3 * r['forward_s']:.2f}", "baseline"),
                ("forward re-executed, warm (ms)", f"{1e3 * r['replay_forward_s']:.2f}",
                 f"{r['replay_forward_s'] / r['forward_s']:.2f}x the hop"),
                ("backward hop, own compute (ms)", f"{1e3 * r['backward_s']:.2f}", "baseline"),
                ("backward re-executed, warm (ms)", f"{1e3 * r['replay_backward_s']:.2f}",
                 f"{r['replay_backward_s'] / max(r['backward_s'], 1e-9):.2f}x the hop"),
                ("forward re-executed, state loaded first (ms)",
                 f"{1e3 * r['replay_cold_s']:.2f}", f"{r['replay_cold_s'] / own:.1f}x fwd+bwd"),
                ("1 vs many threads: relative error", f"{r['thread_error']:.1e}",
                 f"tolerance {CPU_FLOAT32.max_relative_error:.0e}"),
                ("evidence per hop: two frames (kB)", f"{2 * r['frame_bytes'] / 1e3:.1f}", ""),
                ("evidence per iteration: stage weights (kB)", f"{r['state_bytes'] / 1e3:.1f}", ""),
                (f"evidence per epoch, one relay (MB, {args.iterations} it.)",
                 f"{per_epoch / 1e6:.1f}", ""),
            ]  # fmt: skip
            for label, value, versus in rows:
                print(f"{family + '-' + size:<22}{label:<46}{value:>12}  {versus}")


if __name__ == "__main__":
    main()
