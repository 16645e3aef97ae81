"""This node's compute time per microbatch, measured from the hops it computes.

The flow protocol's edge costs and the joiners' placement weigh each node's compute time (the
paper's c_i is a measured time). A node starts with the ``node.compute_ms`` of its settings;
every ``REPORT_S`` this meter reads the data plane's compute timings over the hops computed since
the last report and hands the mean to the core, which adopts and announces it when it moved by
more than a quarter (``LivenessMixin.measured_compute``).
"""

from __future__ import annotations

import trio

from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.flow.service import FlowService

REPORT_S = 5.0
#: Hops computed since the last report before a new mean is taken (fewer are too noisy).
MIN_HOPS = 4
#: A microbatch passes a stage twice: its forward hop and its backward hop.
HOPS_PER_MICROBATCH = 2


async def report_compute(plane: DataPlane, flow: FlowService, period_s: float = REPORT_S) -> None:
    """Run forever: measure, and let the flow protocol announce what changed."""
    counted, seconds = plane.timings.computed, plane.timings.compute_s
    while True:
        await trio.sleep(period_s)
        timings = plane.timings
        hops = timings.computed - counted
        if hops < MIN_HOPS:
            continue
        per_hop_ms = (timings.compute_s - seconds) * 1000.0 / hops
        counted, seconds = timings.computed, timings.compute_s
        flow.dispatch(flow.node.measured_compute(HOPS_PER_MICROBATCH * per_hop_ms))
