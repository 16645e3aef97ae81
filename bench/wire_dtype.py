"""What a half-precision wire costs in loss: activations and gradients sent as bf16 or fp16
(``training.wire_dtype``) against the exact wire (float32), the same model, data and seed.

In process (``LocalPipeline``: the node's own stage workers, the network replaced by the codec's
round trip), CPU, one thread. Printed per wire dtype: the bytes of one activation frame against
float32's, the mean loss of the last ``--window`` iterations, its difference from float32's
(absolute and relative), the largest per-microbatch loss difference, and the CPU time against
float32's. No goal is set for the loss; the table says what the choice costs.

Usage: python bench/wire_dtype.py [--model gpt-tiny] [--iterations 40] [--window 10]
"""

from __future__ import annotations

import argparse
import time

import torch

from gwtf.node.training import codec
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.local_pipeline import LocalPipeline, round_robin
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import OptimizerSettings, TrainingSettings

WIRES = ("param", "bfloat16", "float16")
MICROBATCHES = 4


def train(model: str, wire: str, iterations: int, seq_len: int) -> tuple[list[float], int, float]:
    """Per-microbatch losses, one activation frame's bytes, and the CPU time."""
    family, _, size = model.partition("-")
    settings = TrainingSettings(
        device="cpu",
        wire_dtype=wire,  # type: ignore[arg-type]
        optimizer=OptimizerSettings(warmup_steps=2, total_steps=iterations),
    )
    sampler = MicrobatchSampler(load_default_corpus(), batch_size=4, seq_len=seq_len)
    plan = plan_partition(named_config(family, size), 2)
    pipeline = LocalPipeline(plan, settings, 7, sampler)
    frame_bytes = len(codec.encode(0, pipeline.data_node.embed(0), CodecLimits()))
    pipeline.data_node.drop(0)
    losses = []
    started = time.process_time()
    for step in range(iterations):
        ids = range(step * MICROBATCHES, (step + 1) * MICROBATCHES)
        losses += [pipeline.run_microbatch(m, lambda m, s: round_robin(m, s, 1)) for m in ids]
        pipeline.finish_iteration()
    return losses, frame_bytes, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--window", type=int, default=10, help="last iterations averaged")
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = {w: train(args.model, w, args.iterations, args.seq_len) for w in WIRES}
    exact_losses, exact_bytes, exact_s = runs["param"]
    tail = args.window * MICROBATCHES

    def mean(xs: list[float]) -> float:
        return sum(xs[-tail:]) / len(xs[-tail:])

    print(f"{args.model}, 2 stages, {args.iterations} iterations x {MICROBATCHES} microbatches "
          f"of 4 x {args.seq_len} tokens, CPU, 1 thread; loss = mean of the last "
          f"{args.window} iterations")  # fmt: skip
    print("| wire | frame bytes | vs float32 | loss | Δ loss | Δ/loss | max |Δ| per microbatch "
          "| CPU time vs float32 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for wire, (losses, frame_bytes, seconds) in runs.items():
        delta = mean(losses) - mean(exact_losses)
        worst = max(abs(a - b) for a, b in zip(losses, exact_losses, strict=True))
        name = "float32 (param)" if wire == "param" else wire
        print(f"| {name} | {frame_bytes:,} | {frame_bytes / exact_bytes:.3f} | "
              f"{mean(losses):.5f} | {delta:+.1e} | {delta / mean(exact_losses):+.3%} | "
              f"{worst:.1e} | {seconds / exact_s:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
