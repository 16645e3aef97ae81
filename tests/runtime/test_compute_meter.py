"""A node measures its compute time per microbatch from the hops it computes (stretched by an
emulated slower GPU), and the flow
protocol adopts it (``gwtf/node/runtime/dataplane/compute_meter.py``)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.node.runtime.dataplane.compute_meter import MIN_HOPS, report_compute
from gwtf.node.runtime.dataplane.exchange import DataPlane, _Job
from gwtf.node.runtime.flow.service import FlowService


def test_the_measured_time_per_microbatch_replaces_the_configured_one() -> None:
    node = FlowNode(
        NodeSpec("relay", "relay", 1, 2, 100.0),
        FlowConfig(stages=2, activation_bytes=1e6),
        random.Random(0),
    )
    unused: Any = None  # neither serves nor sends here: the node has no peers to tell
    plane = DataPlane(unused, "relay", 1, 2, 1.0, 1 << 20)
    flow = FlowService(unused, node, tick_s=1.0)
    plane.timings.computed, plane.timings.compute_s = 10, 5.0  # before the meter starts
    seen: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_compute, plane, flow, 1.0)
            await trio.sleep(0.5)
            plane.timings.computed += 10
            plane.timings.compute_s += 0.2  # 20 ms a hop: 40 ms a microbatch
            await trio.sleep(1.0)
            seen.append(node.spec.compute_ms)
            plane.timings.computed += MIN_HOPS - 1
            plane.timings.compute_s += 10.0  # too few hops to judge by
            await trio.sleep(1.0)
            seen.append(node.spec.compute_ms)
            plane.timings.computed += 1
            await trio.sleep(1.0)
            seen.append(node.spec.compute_ms)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen[0] == pytest.approx(40.0)
    assert seen[1] == seen[0]
    assert seen[2] > 1000.0  # the slow hops, once there were enough of them


@pytest.mark.parametrize(("hop_s", "done_s"), [(0.0, [2.0, 4.0]), (3.0, [6.0, 12.0])])
def test_an_emulated_slower_gpu_stretches_each_hop_and_holds_the_queue_meanwhile(
    hop_s: float, done_s: list[float]
) -> None:
    """``emulated_speed`` 0.5: a hop that computes in 1 s takes 2 s, and the next one waits;
    with ``emulated_hop_s`` 3 it lasts 3 s before the speed stretches it."""
    unused: Any = None
    plane = DataPlane(unused, "relay", 1, 2, 1.0, 1 << 20, emulated_speed=0.5, emulated_hop_s=hop_s)

    async def compute(header: Any, frame: bytes) -> None:
        await trio.sleep(1.0)

    plane.compute = compute
    finished: list[float] = []

    async def main() -> None:
        send, receive = trio.open_memory_channel[_Job](2)
        jobs = [_Job("peer", unused, b"") for _ in range(2)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(plane._compute_loop, receive)
            for job in jobs:
                await send.send(job)
            for job in jobs:
                await job.done.wait()
                finished.append(trio.current_time())
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert finished == done_s
    assert plane.timings.compute_s == pytest.approx(done_s[-1])  # what the meter reports
