"""The capacity a node registers: measured on the thread count it trains with, and not moved by
other work that interrupts some of the timed passes."""

from __future__ import annotations

import pytest
import torch

from gwtf.node.training import capacity
from gwtf.node.training.capacity import measure_capacity
from gwtf.node.training.settings import TrainingSettings


def test_passes_slowed_by_other_work_do_not_move_the_figure() -> None:
    # A pass costs 1 ms of the clock; six in ten are interrupted by 50 ms of other work (the
    # clock a preempted or cache-cold pass reads). Their median would be slow.
    now = [0.0]
    passes = [0]

    def one_pass() -> None:
        passes[0] += 1
        now[0] += 0.001 + (0.05 if passes[0] % 10 < 6 else 0.0)

    timed = [0]

    def tick() -> None:
        timed[0] += 1

    seconds = capacity._pass_s(one_pass, lambda: None, lambda: now[0], tick)
    assert timed[0] >= capacity.MIN_PASSES
    assert seconds == pytest.approx(0.001)


def test_a_cpu_is_measured_on_one_thread_and_the_caller_s_threads_are_restored() -> None:
    torch.set_num_threads(2)  # the test area's fixture sets one; the caller's may differ
    measured = measure_capacity("gpt-tiny", 2, TrainingSettings(device="cpu"), quiet=True)
    assert torch.get_num_threads() == 2
    assert measured.gpu_model == "cpu (1 thread)" and measured.memory_mib > 0
    assert 0 < measured.seconds_per_microbatch < 1
    per_hour = 3600 / measured.seconds_per_microbatch
    assert measured.microbatches_per_hour == pytest.approx(per_hour, rel=1e-3)
