"""What a data node's resume point costs (``gwtf/node/training/resume_points.py``).

For the data part (embedding and head) of each size: the state's size on disk, the copy taken
in the compute thread (``snapshot``: the only part on the training path), and the durable
write done beside training (``write_point``: temporary file, fsync, rename), each against the
part's own AdamW step, which the compute thread runs at the same moment of every iteration.

    OMP_NUM_THREADS=1 .venv/bin/python bench/resume_points.py [--sizes gpt-tiny,gpt-125m]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gwtf.node.training.config import named_config
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.resume_points import snapshot, write_point
from gwtf.node.training.settings import TrainingSettings

#: GPT-2's tokenizer: the vocabulary a real run's embedding and head have.
VOCAB = 50257


def worker_of(name: str) -> DataNodeWorker:
    family, size = name.split("-")
    config = dataclasses.replace(named_config(family, size), vocab_size=VOCAB)
    plan = plan_partition(config, 2)

    def batch(microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        seeded = torch.Generator().manual_seed(microbatch)
        tokens = torch.randint(0, VOCAB, (1, 33), generator=seeded)
        return tokens[:, :-1], tokens[:, 1:]

    worker = DataNodeWorker(plan, TrainingSettings(device="cpu"), 0, batch)
    activation = worker.embed(0)
    worker.loss_and_backward(0, activation.detach())
    worker.drop(0)
    worker.step()  # AdamW's moments exist from here on
    return worker


def timed_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def step_ms(worker: DataNodeWorker, repeats: int) -> float:
    """The part's AdamW step alone (its microbatch computed before each)."""
    times = []
    for _ in range(repeats):
        activation = worker.embed(1)
        worker.loss_and_backward(1, activation.detach())
        worker.drop(1)
        started = time.perf_counter()
        worker.step()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def row(name: str, repeats: int) -> str:
    worker = worker_of(name)
    step = step_ms(worker, repeats)
    snap = timed_ms(lambda: snapshot(worker, "bench", 1), repeats)
    taken = snapshot(worker, "bench", 1)
    with tempfile.TemporaryDirectory() as folder:
        write = timed_ms(lambda: write_point(Path(folder), taken), repeats)
        size_mb = sum(p.stat().st_size for p in Path(folder).iterdir()) / 1e6  # one point
    return (
        f"| {name} | {size_mb:.1f} | {step:.1f} | {snap:.1f} | {snap / step:.2f} "
        f"| {write:.1f} | {write / step:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="gpt-tiny,gpt-125m")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    columns = ("file MB", "step ms", "snapshot ms", "/ step", "write ms", "/ step")
    print(f"| data part (vocab {VOCAB}) | " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|")
    for name in args.sizes.split(","):
        print(row(name, args.repeats))


if __name__ == "__main__":
    main()
