"""What this machine can offer a run: its GPU (or CPU) and its measured stage throughput.

``measure_capacity`` builds a relay stage of the run's model on the device training would use
and times forward + backward passes of one microbatch, with a progress bar; the figure
registered is microbatches per hour of that stage. It is a starting estimate: the flow protocol
measures each node's compute time again as it works.

The figure must not depend on the moment it was measured, or the same machine registers
capacities many times apart. What made it move (gpt-tiny on a shared two-core machine: the
median of 6 single passes ranged 1.8-7.9 ms over five runs):

* torch's intra-op threads: with every core's thread waiting on the others, a core taken by
  another process stalls every pass (3.5x slower with one busy process on two cores). A node
  process trains on one thread (``gwtf.node.process``), so the CPU is measured on one thread too,
  as it will be used (``CPU_THREADS``), and by the thread's CPU time, which a process that
  takes the core for a while does not add to;
* a pass that another process interrupts comes out slow, even in CPU time (the caches are
  cold after the switch), and a round of many passes is interrupted every time on a busy
  machine: each pass is timed on its own, for ``MEASURE_S``, and the figure is the fastest
  tenth of them (``FASTEST``), not their median, because other work on the machine only ever
  makes a pass slower: the median measures that work as much as the machine;
* the first passes allocate, and CUDA launches asynchronously: a warm-up of ``WARMUP_S``, and
  on CUDA each pass ends with a ``synchronize`` and is timed by the wall clock, or it would
  time the launches, not the work.

A machine busy for the whole measurement still measures slower (another process's compute
competing for the caches and memory makes every pass slower): measure on a quiet machine.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from rich.progress import Progress

from gwtf.node.training.device import resolve_device
from gwtf.node.training.partition import model_for_run, plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

#: Passes before timing, and at least this long: first-call allocations and caches.
WARMUP_PASSES, WARMUP_S = 3, 0.2
#: Passes timed: at least ``MIN_PASSES``, then more while the time lasts, up to ``MAX_PASSES``.
MIN_PASSES, MAX_PASSES, MEASURE_S = 10, 2000, 2.0
#: The figure is the pass at this quantile: the fastest tenth.
FASTEST = 0.1
#: The threads a CPU is measured on: a node process trains on one.
CPU_THREADS = 1


@dataclass(frozen=True)
class MeasuredCapacity:
    gpu_model: str  # the CUDA device's name, or "cpu (1 thread)"
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
    threads = f"{CPU_THREADS} thread" + ("s" if CPU_THREADS > 1 else "")
    return f"cpu ({threads})", int(ram)


def measure_capacity(
    model: str, stages: int, settings: TrainingSettings, quiet: bool = False
) -> MeasuredCapacity:
    """Time one relay stage of ``model`` split into ``stages`` on this machine: forward +
    backward passes of one microbatch, each timed, after a warm-up (about 2.5 s)."""
    name, memory_mib = detect_device(settings)
    device = resolve_device(settings.device)
    with _measuring_threads(device):
        config = model_for_run(model, settings.seq_len, stages)
        partition = plan_partition(config, stages)
        worker = StageWorker(partition, 0, settings, seed=0, replica_id="bench")
        shape = (settings.batch_size, settings.seq_len, config.d_model)  # (B, T, C)
        activation = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        microbatch = iter(range(1 << 62))

        def one_pass() -> None:
            m = next(microbatch)
            output = worker.forward(m, activation)
            worker.backward(m, torch.ones_like(output))

        if device.type == "cuda":
            sync, clock = (lambda: torch.cuda.synchronize(device)), time.perf_counter
        else:
            sync, clock = _nothing, time.thread_time
        with Progress(disable=quiet, transient=True) as progress:
            task = progress.add_task(f"benchmarking a stage of {model} on {name}", total=None)
            per_pass_s = _pass_s(one_pass, sync, clock, lambda: progress.advance(task))
    return MeasuredCapacity(name, memory_mib, max(1, int(3600 / per_pass_s)), round(per_pass_s, 6))


def _pass_s(
    one_pass: Callable[[], None],
    sync: Callable[[], None],
    clock: Callable[[], float],
    tick: Callable[[], None],
) -> float:
    """One pass's time (seconds) by ``clock``: the fastest tenth of the timed passes."""
    started = time.perf_counter()
    passes = 0
    while passes < WARMUP_PASSES or time.perf_counter() - started < WARMUP_S:
        one_pass()
        passes += 1
    sync()
    timed: list[float] = []
    began = time.perf_counter()
    gc.collect()
    gc.disable()  # a collection inside one pass only would be timed as that pass's compute
    try:
        while len(timed) < MIN_PASSES or (
            len(timed) < MAX_PASSES and time.perf_counter() - began < MEASURE_S
        ):
            pass_start = clock()
            one_pass()
            sync()
            timed.append(clock() - pass_start)
            tick()
    finally:
        gc.enable()
    return statistics.quantiles(timed, n=round(1 / FASTEST), method="inclusive")[0]


@contextmanager
def _measuring_threads(device: torch.device) -> Iterator[None]:
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _nothing() -> None:
    pass
