"""The per-node state machine of GWTF's coordinator-free flow routing.

The optimisation problem (Blagoev et al., "Go With The Flow: Churn-Tolerant Decentralized
Training of Large Language Models", IEEE BigData 2025, arXiv 2509.21221): in the layered graph
data nodes -> stage 1 relays -> ... -> stage S relays -> data nodes, with node capacities in
integer microbatches and edge costs d_ij (``coordinator_free.cost``), route as many microbatches
as capacities allow (maximum flow) and, among those routings, make the slowest flow (the largest
sum of edge costs along a path) as cheap as possible. No node sees the graph: each knows its
neighbours in the previous, same and next stage, and the decisions below are local.

``FlowNode.handle(sender, message, now)`` and ``FlowNode.tick(now)`` return the messages to send;
nothing here reads a clock, opens a socket or starts a thread, and all randomness comes from the
``random.Random`` the node was built with, so one seed reproduces one run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from coordinator_free.messages import (
    CostAdvert,
    FlowAccept,
    FlowCancel,
    FlowCost,
    FlowReject,
    FlowRequest,
    Goodbye,
    Hello,
    Message,
    PathReport,
    PathUpdate,
    Ping,
    Pong,
    PushBack,
    Rebind,
    Redirect,
    SlotList,
    SwapAccept,
    SwapProposal,
    SwapReject,
    TableExchange,
    TableRequest,
    TakeOverDeny,
    TakeOverGrant,
    TakeOverRequest,
)
from coordinator_free.protocol.config import FlowConfig, NodeSpec, Outbound
from coordinator_free.protocol.liveness import LivenessMixin
from coordinator_free.protocol.moves import MovesMixin
from coordinator_free.protocol.routing import RoutingMixin
from coordinator_free.protocol.state import INF, SlotState

Handler = Callable[[Any, str, Any, float], list[Outbound]]


class FlowNode(RoutingMixin, MovesMixin, LivenessMixin):
    """One data node or relay running the flow protocol."""

    def __init__(
        self, spec: NodeSpec, config: FlowConfig, rng: random.Random, boot_id: int = 0
    ) -> None:
        super().__init__(spec, config, rng, boot_id)
        self._last_decision_s = -INF
        self._periods = 0
        #: Annealing moves on or off (off while an operator freezes the routing, or in a drain).
        self.moves_enabled = True

    # ---- the two entry points -------------------------------------------------------------------

    def handle(self, sender: str, message: Message, now: float) -> list[Outbound]:
        """React to ``message`` from ``sender``; returns what to send."""
        if self.left:
            return []
        peer = self.peers.get(sender)
        if peer is not None and not peer.alive and not isinstance(message, Goodbye):
            # Crashed nodes send nothing, and a death is declared long after any message could
            # still be in flight: a peer that speaks was only suspected wrongly (slow, not dead).
            self.set_peer_alive(peer, True)
            peer.misses = 0
        self.heard_from(sender, now)
        handler = _HANDLERS.get(type(message))
        if handler is None:
            return []  # data-plane messages are the data plane's business
        return handler(self, sender, message, now)

    def tick(self, now: float) -> list[Outbound]:
        """Timers: keep-alives on every call, and the decision round once per period."""
        if self.left:
            return []
        sends = self.keepalive(now)
        if now - self._last_decision_s < self.period_s:
            return sends
        self._last_decision_s = now
        self._periods += 1
        if self.pending_swaps or self.reserved or self.table_requests or self.handover_slots:
            self.expire_moves(now)
        needing = any(not out.is_carried for out in self.out_slots.values())
        if needing:  # only slots without a next hop need these two
            sends += self.push_back_stale(now)
            sends += self.route_unmatched(now)
        sends += self.advertise(now)
        if self._periods % self.config.reconcile_periods == 0:
            sends += self.reconcile(now)
        chance = (
            self.config.anneal_probability_needing
            if needing
            else self.config.anneal_probability_idle
        )
        if self.rng.random() < chance and self.moves_enabled:
            rerouted = self.try_reroute(now)
            sends += rerouted or self.try_move(now)
        return sends

    # ---- what the data plane asks ---------------------------------------------------------------

    def route(self, upstream: str, upstream_slot: int) -> tuple[str, int] | None:
        """Next hop and this node's slot for the flow that comes in as (upstream, slot)."""
        inflow = self.in_slots.get((upstream, upstream_slot))
        if inflow is None or inflow.out_slot is None:
            return None
        out = self.out_slots[inflow.out_slot]
        return (out.next_hop, out.slot) if out.is_carried and out.next_hop else None

    def source_routes(self) -> dict[int, tuple[str, str]]:
        """A data node's carried flows: its slot -> (flow id, first hop)."""
        return {
            out.slot: (out.flow_id, out.next_hop)
            for out in self.out_slots.values()
            if out.in_key is None and out.is_carried and out.next_hop is not None
        }

    def flow_paths(self) -> dict[str, tuple[tuple[str, ...], float]]:
        """A data node's flows as last reported by their sinks: flow id -> (path, cost ms)."""
        carried = {flow_id for flow_id, _ in self.source_routes().values()}
        return {f: report for f, report in self.flow_reports.items() if f in carried}

    def alternative_next_hop(self, slot: int, exclude: str, now: float) -> str | None:
        """For a re-send after a missed ack: another next-stage replica for ``slot``."""
        out = self.out_slots.get(slot)
        return None if out is None else self.choose_next_hop(out, now, exclude=exclude)

    def carried_count(self) -> int:
        return sum(1 for out in self.out_slots.values() if out.is_carried)

    def check_invariants(self) -> None:
        """The node's local invariants; raises AssertionError naming the broken one."""
        assert len(self.in_slots) + len(self.reserved) <= self.spec.capacity, "capacity exceeded"
        for key, inflow in self.in_slots.items():
            assert inflow.key == key, "in-slot keyed wrongly"
            if self.is_data:
                assert inflow.out_slot is None, "a sink forwards nothing"
            else:
                assert inflow.out_slot in self.out_slots, "an in-flow without its out-slot"
                assert self.out_slots[inflow.out_slot].in_key == key, "out-slot points elsewhere"
        for out in self.out_slots.values():
            if self.is_data:
                assert out.in_key is None, "a source slot has no in-flow"
            else:
                assert out.in_key in self.in_slots, "an out-flow without its in-flow"
            if out.state is not SlotState.UNMATCHED:
                assert out.next_hop is not None, "a routed slot without next hop"
                peer = self.peers.get(out.next_hop)
                assert peer is None or peer.alive, "a flow routed to a dead peer"
        if self.is_data:
            assert len(self.out_slots) == self.spec.capacity, "a source lost a flow slot"


def _handlers() -> dict[type[Any], Handler]:
    table: dict[type[Any], Handler] = {
        Hello: FlowNode.handle_hello,
        CostAdvert: FlowNode.handle_cost_advert,
        FlowRequest: FlowNode.handle_flow_request,
        FlowAccept: FlowNode.handle_flow_accept,
        FlowReject: FlowNode.handle_flow_reject,
        FlowCancel: FlowNode.handle_flow_cancel,
        PushBack: FlowNode.handle_push_back,
        FlowCost: FlowNode.handle_flow_cost,
        PathUpdate: FlowNode.handle_path_update,
        Rebind: FlowNode.handle_rebind,
        Redirect: FlowNode.handle_redirect,
        TableExchange: FlowNode.handle_table,
        TableRequest: FlowNode.handle_table_request,
        SwapProposal: FlowNode.handle_swap_proposal,
        SwapAccept: FlowNode.handle_swap_accept,
        SwapReject: FlowNode.handle_swap_reject,
        TakeOverRequest: FlowNode.handle_take_over_request,
        TakeOverGrant: FlowNode.handle_take_over_grant,
        TakeOverDeny: FlowNode.handle_take_over_deny,
        PathReport: FlowNode.handle_path_report,
        Ping: FlowNode.handle_ping,
        Pong: FlowNode.handle_pong,
        Goodbye: FlowNode.handle_goodbye,
        SlotList: FlowNode.handle_slot_list,
    }
    return table


_HANDLERS = _handlers()
