"""The capacity a node registers: measured on the thread count it trains with, and not moved by
other work that interrupts some of the timed rounds."""

from __future__ import annotations

import pytest
import torch

from node.training import capacity
from node.training.capacity import measure_capacity
from node.training.settings import TrainingSettings


def test_rounds_slowed_by_other_work_do_not_move_the_figure() -> None:
    # A pass costs 1 ms of the clock; six rounds in ten are interrupted by 50 ms of other work
    # (the clock a preempted or cache-cold round reads). The median round would be slow.
    now = [0.0]
    rounds = [0]
    interrupted = [False]

    def one_pass() -> None:
        now[0] += 0.001
        if interrupted[0]:
            now[0] += 0.05
            interrupted[0] = False

    def tick() -> None:
        rounds[0] += 1
        interrupted[0] = rounds[0] % 10 < 6

    seconds = capacity._pass_s(one_pass, lambda: None, lambda: now[0], tick)
    assert rounds[0] >= capacity.MIN_ROUNDS
    assert seconds == pytest.approx(0.001)


def test_a_cpu_is_measured_on_one_thread_and_the_caller_s_threads_are_restored() -> None:
    torch.set_num_threads(2)  # the test area's fixture sets one; the caller's may differ
    measured = measure_capacity("gpt-tiny", 2, TrainingSettings(device="cpu"), quiet=True)
    assert torch.get_num_threads() == 2
    assert measured.gpu_model == "cpu (1 thread)" and measured.memory_mib > 0
    assert 0 < measured.seconds_per_microbatch < 1
    per_hour = 3600 / measured.seconds_per_microbatch
    assert measured.microbatches_per_hour == pytest.approx(per_hour, rel=1e-3)
