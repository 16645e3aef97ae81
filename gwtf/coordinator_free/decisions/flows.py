"""Which free flow a data node starts its next microbatch on.

A flow counts as free when it is carried (routed to a first hop) and no microbatch of the node
is on it: an own slot not lent, or a slot a data peer lent it. Its own free flows first, the
one whose path its sink last reported cheapest first (a flow not reported yet last), then a
free flow a data peer lent it, the nearest first hop first; ties by (owner, slot). Cheap flows
taken first finish their microbatches first, so an iteration whose last microbatches leave flows
idle leaves the dear ones idle. None: every flow is busy; the microbatch waits for one.

A slot not carried is no flow: a microbatch started on it goes off any flow at its first hop,
so it is taken only by a node that carries no flow at all (own or lent, busy or not: start-up,
or every flow lost) once the microbatch has waited ``FLOWLESS_PATIENCE_PERIODS`` decision
periods for one; flows take a few periods to build, and a microbatch sent off-flow meanwhile
competes with the flows' own for the relays' room.

A data node whose microbatch has waited ``RECALL_PERIODS`` decision periods for a flow takes back
every slot it lent (``take_back_loans``): a borrower should have given them back once its own
microbatches were all started, and one that lost track of a loan would otherwise hold it for good.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gwtf.coordinator_free.protocol.node import FlowNode

FlowKey = tuple[str, int]  # (whose slot it is: this data node or its lender, slot)

#: Decision periods a microbatch waits at a data node carrying no flow before it starts on a
#: slot not carried, off any flow (ours).
FLOWLESS_PATIENCE_PERIODS = 10
#: Decision periods a data node's microbatch waits for a flow before the node takes back the
#: slots it lent (ours).
RECALL_PERIODS = 10


@dataclass(frozen=True, slots=True)
class FreeFlow:
    """A free flow as the data node sees it."""

    key: FlowKey
    lent: bool  # a data peer's slot lent to this node
    cost_ms: float  # own: the path cost its sink reported (inf: none); lent: to its first hop
    carried: bool = True  # routed to a first hop (a loan always is)


def choose_flow(
    free: Iterable[FreeFlow], carries_none: bool = False, waited_periods: float = 0.0
) -> FlowKey | None:
    """The flow the next microbatch takes among the node's slots not in use (module
    docstring): ``carries_none``, the node carries no flow at all; ``waited_periods``, how long
    the microbatch has waited for one. None: it waits."""
    best: tuple[bool, bool, float, FlowKey] | None = None
    flowless = carries_none and waited_periods >= FLOWLESS_PATIENCE_PERIODS
    for flow in free:
        if not (flow.carried or flowless):
            continue
        rank = (not flow.carried, flow.lent, flow.cost_ms, flow.key)
        if best is None or rank < best:
            best = rank
    return None if best is None else best[3]


def own_flow(node: FlowNode, slot: int, flow_id: str | None) -> FreeFlow:
    """``node``'s own flow on ``slot`` (``flow_id``: its id, None while not carried), priced by
    its sink's last report of its path."""
    report = None if flow_id is None else node.flow_reports.get(flow_id)
    cost = math.inf if report is None else report[1]
    return FreeFlow((node.node_id, slot), False, cost, flow_id is not None)


def lent_flow(node: FlowNode, lender: str, slot: int, first_hop: str) -> FreeFlow:
    """``lender``'s slot lent to ``node``, priced by the edge to its first hop."""
    return FreeFlow((lender, slot), True, node.edge_cost_ms(first_hop))


def take_back_loans(waited_periods: float) -> bool:
    """Whether a data node whose microbatch has waited ``waited_periods`` for a flow takes back
    the slots it lent (module docstring)."""
    return waited_periods >= RECALL_PERIODS
