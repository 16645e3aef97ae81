"""What this machine can offer a run: its GPU (or CPU) and its measured stage throughput.

``measure_capacity`` builds a relay stage of the run's model on the device training would use
and times forward + backward passes of one microbatch (after a warm-up), with a progress bar;
the figure registered is microbatches per hour of that stage. It is a starting estimate: the
flow protocol measures each node's compute time again as it works.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
from rich.progress import Progress

from node.training.device import resolve_device
from node.training.partition import model_for_run, plan_partition
from node.training.settings import TrainingSettings
from node.training.stage_worker import StageWorker

WARMUP = 2
MEASURED = 6


@dataclass(frozen=True)
class MeasuredCapacity:
    gpu_model: str  # the CUDA device's name, or "cpu (N threads)"
    memory_mib: int  # the GPU's memory, or the machine's RAM
    microbatches_per_hour: int
    seconds_per_microbatch: float


def detect_device(settings: TrainingSettings) -> tuple[str, int]:
    """The device training would use: its name and memory in MiB."""
    device = resolve_device(settings.device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, props.total_memory // 2**20
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return f"cpu ({torch.get_num_threads()} threads)", int(ram)


def measure_capacity(
    model: str, stages: int, settings: TrainingSettings, quiet: bool = False
) -> MeasuredCapacity:
    """Time one relay stage of ``model`` split into ``stages`` on this machine."""
    name, memory_mib = detect_device(settings)
    config = model_for_run(model, settings.seq_len, stages)
    worker = StageWorker(plan_partition(config, stages), 0, settings, seed=0, replica_id="bench")
    shape = (settings.batch_size, settings.seq_len, config.d_model)  # (B, T, C)
    activation = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    elapsed: list[float] = []
    with Progress(disable=quiet, transient=True) as progress:
        task = progress.add_task(
            f"benchmarking a stage of {model} on {name}", total=WARMUP + MEASURED
        )
        for i in range(WARMUP + MEASURED):
            started = time.perf_counter()
            output = worker.forward(i, activation)
            worker.backward(i, torch.ones_like(output))
            if i >= WARMUP:
                elapsed.append(time.perf_counter() - started)
            progress.advance(task)
    per_microbatch_s = sorted(elapsed)[len(elapsed) // 2]  # the median
    return MeasuredCapacity(
        name, memory_mib, max(1, int(3600 / per_microbatch_s)), round(per_microbatch_s, 4)
    )
