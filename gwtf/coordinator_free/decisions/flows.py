"""Which free flow a data node starts its next microbatch on.

Its own free flows first, the one whose path its sink last reported cheapest first (a flow not
reported yet last), then a free flow a data peer lent it, the nearest first hop first; ties by
(owner, slot). Cheap flows taken first finish their microbatches first, so an iteration whose
last microbatches leave flows idle leaves the dear ones idle. None: every flow is busy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gwtf.coordinator_free.protocol.node import FlowNode

FlowKey = tuple[str, int]  # (whose slot it is: this data node or its lender, slot)


@dataclass(frozen=True, slots=True)
class FreeFlow:
    """A free flow as the data node sees it."""

    key: FlowKey
    lent: bool  # a data peer's slot lent to this node
    cost_ms: float  # own: the path cost its sink reported (inf: none); lent: to its first hop


def choose_flow(free: Iterable[FreeFlow]) -> FlowKey | None:
    """The flow the next microbatch takes (module docstring)."""
    best: tuple[bool, float, FlowKey] | None = None
    for flow in free:
        rank = (flow.lent, flow.cost_ms, flow.key)
        if best is None or rank < best:
            best = rank
    return None if best is None else best[2]


def own_flow(node: FlowNode, slot: int, flow_id: str | None) -> FreeFlow:
    """``node``'s own flow on ``slot`` (``flow_id``: its id, None while not carried), priced by
    its sink's last report of its path."""
    report = None if flow_id is None else node.flow_reports.get(flow_id)
    return FreeFlow((node.node_id, slot), False, math.inf if report is None else report[1])


def lent_flow(node: FlowNode, lender: str, slot: int, first_hop: str) -> FreeFlow:
    """``lender``'s slot lent to ``node``, priced by the edge to its first hop."""
    return FreeFlow((lender, slot), True, node.edge_cost_ms(first_hop))
