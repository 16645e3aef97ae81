"""Benchmark of the stage engine (gwtf/node/training), every ratio against a baseline in the same
run:

1. split overhead: one microbatch's forward + backward through the data-node part and S stages
   (direct calls, then also through the wire codec) vs the whole model on the same microbatch;
2. codec throughput: encode / decode of a 4 MiB activation vs a plain copy of the same bytes, and
   the ``bytes(untyped_storage())`` trap for contrast;
3. memory per part: parameters + gradients + AdamW state + tensors autograd saves for one
   microbatch (measured with saved-tensor hooks on CPU, ``max_memory_allocated`` on CUDA).

    .venv/bin/python bench/engine.py [--repeats 20] [--sizes tiny,small] [--stages 2]

Prints tables and writes bench/out/engine.png.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gwtf.node.training.codec import CodecLimits, decode, encode, encode_frames
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.local_pipeline import LocalPipeline
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import PartTrainer, WholeModelTrainer

OUT_DIR = Path(__file__).resolve().parent / "out"
MIB = 1024 * 1024


def median_seconds(action: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def split_overhead(
    family: str, size: str, n_stages: int, repeats: int, batch: int
) -> dict[str, float]:
    config = named_config(family, size)
    plan = plan_partition(config, n_stages)
    settings = TrainingSettings(device="cpu")
    sampler = MicrobatchSampler(load_default_corpus(), batch, config.block_size)
    whole = WholeModelTrainer(plan, settings, seed=0)
    direct = LocalPipeline(plan, settings, 0, sampler, through_codec=False)
    wired = LocalPipeline(plan, settings, 0, sampler, through_codec=True)
    inputs, targets = sampler(0)  # microbatch 0, the one the pipelines run too
    actions: dict[str, Callable[[], object]] = {
        "whole": lambda: whole.train_microbatch(inputs, targets),
        "split": lambda: direct.run_microbatch(0, lambda m, s: 0),
        "split+codec": lambda: wired.run_microbatch(0, lambda m, s: 0),
    }
    for action in actions.values():
        median_seconds(action, 1, warmup=2)
    # Interleave the three so drift in machine load hits each alike.
    times: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            times[name].append(median_seconds(action, 1, warmup=0))
    for trainer in (whole, direct.data_node, wired.data_node):
        trainer.discard_gradients()
    result = {name: statistics.median(samples) for name, samples in times.items()}
    result["params_m"] = sum(p.numel() for p in whole.module.parameters()) / 1e6
    return result


def codec_throughput(repeats: int) -> list[tuple[str, float, float]]:
    """(what, MB/s, ratio to a plain copy of the same bytes)."""
    tensor = torch.randn(8, 128, 1024)  # 4 MiB float32 activation
    limits = CodecLimits()
    payload = tensor.numpy().data
    frame = bytearray(encode(1, tensor, limits))
    frame_bytes = bytes(frame)
    megabytes = tensor.numel() * tensor.element_size() / 1e6

    copy_s = median_seconds(lambda: bytearray(payload), repeats)
    rows = [("plain copy (baseline)", copy_s)]
    rows.append(("encode -> bytes", median_seconds(lambda: encode(1, tensor, limits), repeats)))
    rows.append(
        ("encode_frames (views)", median_seconds(lambda: encode_frames(1, tensor, limits), repeats))
    )
    rows.append(
        ("decode bytearray (zero-copy)", median_seconds(lambda: decode(frame, limits), repeats))
    )
    rows.append(
        ("decode bytes (one copy)", median_seconds(lambda: decode(frame_bytes, limits), repeats))
    )
    bf16 = tensor.to(torch.bfloat16)
    rows.append(
        ("encode bf16 -> bytes", median_seconds(lambda: encode(1, bf16, limits), repeats) * 2)
    )
    # The trap is ~1,000x slower: time it on 1/64 of the tensor and scale to the same bytes.
    small = tensor.reshape(-1)[: tensor.numel() // 64].clone()
    trap_s = median_seconds(lambda: bytes(small.untyped_storage()), 3, warmup=1) * 64
    rows.append(("bytes(untyped_storage()) trap", trap_s))
    return [(name, megabytes / seconds, copy_s / seconds) for name, seconds in rows]


def autograd_saved_bytes(run: Callable[[], object]) -> int:
    """Bytes of distinct tensors autograd saves for backward while ``run`` executes."""
    seen: dict[tuple[int, int], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(seen.values())


def memory_per_part(family: str, size: str, n_stages: int, batch: int) -> list[tuple[str, float]]:
    """(part, MiB) for the whole model and each part: weights, gradients and AdamW moments
    (4 copies of the parameters) plus the activations saved for one microbatch."""
    config = named_config(family, size)
    plan = plan_partition(config, n_stages)
    settings = TrainingSettings(device="cpu")
    sampler = MicrobatchSampler(load_default_corpus(), batch, config.block_size)
    whole = WholeModelTrainer(plan, settings, seed=0)
    pipeline = LocalPipeline(plan, settings, 0, sampler, through_codec=False)

    def state_bytes(trainer: PartTrainer) -> int:
        return 4 * sum(p.numel() * p.element_size() for p in trainer.module.parameters())

    inputs, targets = sampler(0)
    rows = [
        (
            "whole",
            state_bytes(whole) + autograd_saved_bytes(lambda: whole.model(inputs, targets)),
        )
    ]
    data = pipeline.data_node
    outputs: dict[str, torch.Tensor] = {}

    def embed() -> None:
        outputs["x"] = data.embed(0)

    def forward(worker: StageWorker) -> None:
        outputs["x"] = worker.forward(0, outputs["x"])

    data_saved = autograd_saved_bytes(embed)
    for index, (worker,) in enumerate(pipeline.stages):
        saved = autograd_saved_bytes(functools.partial(forward, worker))
        rows.append((f"stage {index}", state_bytes(worker) + saved))
    data_saved += autograd_saved_bytes(lambda: data.loss_and_backward(0, outputs["x"]))
    rows.insert(1, ("data node", state_bytes(data) + data_saved))
    return [(name, value / MIB) for name, value in rows]


def plot(overheads: dict[str, dict[str, float]], codec: list[tuple[str, float, float]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(overheads)
    left.bar(names, [overheads[n]["split"] / overheads[n]["whole"] for n in names], label="split")
    left.axhline(1.05, color="red", linestyle="--", label="goal 1.05")
    left.set_ylabel("split / whole step time")
    left.legend()
    right.barh([row[0] for row in codec], [row[2] for row in codec])
    right.set_xscale("log")
    right.set_xlabel("throughput / plain copy")
    figure.tight_layout()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / "engine.png"
    figure.savefig(path, dpi=100)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    overheads: dict[str, dict[str, float]] = {}
    print(
        f"\n## Split overhead, one microbatch fwd+bwd, CPU, {args.threads} thread(s), "
        f"S={args.stages}"
    )
    print(
        f"{'model':<14}{'params M':>9}{'whole ms':>10}{'split ms':>10}{'ratio':>8}"
        f"{'+codec ms':>11}{'ratio':>8}"
    )
    for family in ("gpt", "llama"):
        for size in args.sizes.split(","):
            r = split_overhead(family, size, args.stages, args.repeats, args.batch)
            key = f"{family}-{size}"
            overheads[key] = r
            print(
                f"{key:<14}{r['params_m']:>9.2f}{r['whole'] * 1e3:>10.2f}{r['split'] * 1e3:>10.2f}"
                f"{r['split'] / r['whole']:>8.3f}{r['split+codec'] * 1e3:>11.2f}"
                f"{r['split+codec'] / r['whole']:>8.3f}"
            )

    codec = codec_throughput(args.repeats)
    print("\n## Codec, 4 MiB float32 activation (8 x 128 x 1024)")
    print(f"{'operation':<32}{'MB/s':>12}{'vs copy':>10}")
    for name, rate, ratio in codec:
        print(f"{name:<32}{rate:>12.1f}{ratio:>10.4g}")

    print(
        f"\n## Memory per part (weights+grads+AdamW + saved activations, one microbatch), "
        f"S={args.stages}"
    )
    print(f"{'model':<14}{'part':<12}{'MiB':>10}{'vs whole':>10}")
    for family in ("gpt", "llama"):
        size = args.sizes.split(",")[-1]
        rows = memory_per_part(family, size, args.stages, args.batch)
        whole_mib = rows[0][1]
        for part, mib in rows:
            print(f"{family + '-' + size:<14}{part:<12}{mib:>10.2f}{mib / whole_mib:>10.3f}")

    print(f"\nplot: {plot(overheads, codec)}")


if __name__ == "__main__":
    main()
