"""The per-node state machine of GWTF's coordinator-free flow routing.

The optimisation problem (Blagoev et al., "Go With The Flow: Churn-Tolerant Decentralized
Training of Large Language Models", IEEE BigData 2025, arXiv 2509.21221): in the layered graph
data nodes -> stage 1 relays -> ... -> stage S relays -> data nodes, with node capacities in
integer microbatches and edge costs d_ij (``gwtf.coordinator_free.cost``), route as many
microbatches as capacities allow (maximum flow) and, among those routings, make the slowest flow
(the largest sum of edge costs along a path) as cheap as possible. No node sees the graph: each
knows its neighbours in the previous, same and next stage, and the decisions below are local.

``FlowNode.handle(sender, message, now)`` and ``FlowNode.tick(now)`` return the messages to send;
nothing here reads a clock, opens a socket or starts a thread, and all randomness comes from the
``random.Random`` the node was built with, so one seed reproduces one run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from gwtf.coordinator_free.protocol.config import FlowConfig, NodeSpec, Outbound
from gwtf.coordinator_free.protocol.lending import LendingMixin
from gwtf.coordinator_free.protocol.liveness import LivenessMixin
from gwtf.coordinator_free.protocol.moves import MovesMixin
from gwtf.coordinator_free.protocol.routing import RoutingMixin
from gwtf.coordinator_free.protocol.state import INF, TIME_SLACK_S, SlotState
from gwtf.coordinator_free.wire import (
    CostAdvert,
    FlowAccept,
    FlowCancel,
    FlowCost,
    FlowLoan,
    FlowLoanReturn,
    FlowReject,
    FlowRequest,
    FlowWanted,
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

Handler = Callable[[Any, str, Any, float], list[Outbound]]


class FlowNode(RoutingMixin, MovesMixin, LendingMixin, LivenessMixin):
    """One data node or relay running the flow protocol."""

    def __init__(
        self, spec: NodeSpec, config: FlowConfig, rng: random.Random, boot_id: int = 0
    ) -> None:
        super().__init__(spec, config, rng, boot_id)
        self._last_decision_s = -INF
        self._last_reconcile_s = -INF
        #: When the next annealing move of an idle node is due (drawn ahead, see ``_idle_move``).
        self._idle_move_at_s: float | None = None
        #: ``next_tick_s`` as last computed; None once anything that could bring it forward ran.
        self._next_tick_cache_s: float | None = None
        #: Annealing moves on or off (off while an operator freezes the routing, or in a drain).
        self.moves_enabled = True

    # ---- the two entry points -------------------------------------------------------------------

    def handle(self, sender: str, message: Message, now: float) -> list[Outbound]:
        """React to ``message`` from ``sender``; returns what to send."""
        if self.left:
            return []
        peer = self.peers.get(sender)
        kind = type(message)
        cached_s = self._next_tick_cache_s
        peer_was_alive = peer is not None and peer.alive
        if (kind not in _ANSWER_ONLY and kind is not CostAdvert) or peer is None or not peer.alive:
            self._next_tick_cache_s = None
        if peer is not None and not peer.alive and not isinstance(message, Goodbye):
            # Crashed nodes send nothing, and a death is declared long after any message could
            # still be in flight: a peer that speaks was only suspected wrongly (slow, not dead).
            self.set_peer_alive(peer, True)
            peer.misses = 0
        if peer is not None and peer.alive:  # ``heard_from``, inlined on the hot path
            peer.last_heard_s = now
        handler = _HANDLERS.get(kind)
        if handler is None:
            return []  # data-plane messages are the data plane's business
        sends = handler(self, sender, message, now)
        if cached_s is not None and (
            cached_s <= now or cached_s <= self._last_decision_s + self.period_s
        ):
            # No tick has work before the next decision round may run, and the time kept is no
            # later than that: whatever this message changed, the time is still not late.
            self._next_tick_cache_s = cached_s
            return sends
        if kind is CostAdvert and self._next_tick_cache_s is not None and self.advert_due(now):
            # A peer's advert changes nothing a tick waits for but this node's own advert.
            self._next_tick_cache_s = None
        elif (
            (kind is Pong or (kind is TableExchange and not sends))
            and peer_was_alive
            and cached_s is not None
            and not self.advert_due(now)
        ):
            # Likewise a pong: it measures the link (a cost, so only the advert may be due
            # sooner) and answers a ping (the next keep-alive comes later, not sooner); and a
            # table that started no move: it told the peer's room (a cost again) and ended the
            # wait for that table (whose expiry only comes later).
            self._next_tick_cache_s = cached_s
        return sends

    def tick(self, now: float) -> list[Outbound]:
        """Timers: keep-alives on every call, and the decision round once per period."""
        if self.left:
            return []
        self._next_tick_cache_s = None
        if now - self._last_decision_s < self.period_s - TIME_SLACK_S:
            return self.keepalive(now)
        if self._last_decision_s == -INF:  # the first round: reconcile 9 periods from now
            self._last_reconcile_s = now - self.period_s
        self._last_decision_s = now
        sends: list[Outbound] = []
        reconcile_s = self.config.reconcile_periods * self.period_s
        if now - self._last_reconcile_s >= reconcile_s - TIME_SLACK_S:
            # Before the keep-alives: the slot lists are this round's pings to upstream peers.
            self._last_reconcile_s = now
            sends += self.reconcile(now)
        sends += self.keepalive(now)
        if self.pending_swaps or self.reserved or self.table_requests or self.handover_slots:
            self.expire_moves(now)
        needing = self.needs_next_hops()
        if needing:  # only slots without a next hop need these two
            sends += self.push_back_stale(now)
            sends += self.route_unmatched(now)
        sends += self.advertise(now)
        if needing:
            self._idle_move_at_s = None
            moving = self.rng.random() < self.config.anneal_probability_needing
        else:
            if self.idle_backoff > 1 and self.flow_signature() != self._fruitless_signature:
                # Its flows or neighbours changed since the rounds that found nothing: the
                # next idle move comes at the full rate again (drawn afresh).
                self.idle_backoff, self._idle_move_at_s = 1, None
            moving = self._idle_move(now)
        if moving and self.moves_enabled:
            rerouted = self.try_reroute(now)
            sends += rerouted or self.try_move(now)
        if self._idle_move_at_s is None and not self.needs_next_hops():
            self._idle_move_at_s = now + self.period_s * (1 + self._periods_until_idle_move())
        return sends

    def peer_dead(self, peer_id: str, now: float) -> list[Outbound]:
        """Hook: ``peer_id`` is gone; its flows are re-routed or released, its loans end."""
        self.forget_loans(peer_id)
        return super().peer_dead(peer_id, now)

    def needs_next_hops(self) -> bool:
        """Whether a slot lacks a next hop (then every decision round has routing to do)."""
        matched, locked = SlotState.MATCHED, SlotState.LOCKED
        for out in self.out_slots.values():
            state = out.state
            if state is not matched and state is not locked:
                return True
        return False

    def state_changed(self) -> None:
        """Hook for a driver that changed the node's state from outside (a link measured, a peer
        declared dead): ``next_tick_s`` is computed afresh."""
        self._next_tick_cache_s = None

    def _idle_move(self, now: float) -> bool:
        """Whether an idle node tries a move this round (chance ``anneal_probability_idle``).

        The chance per round is drawn ahead as the number of rounds until the next move (a
        geometric draw, the same distribution as one Bernoulli draw per round), so an idle
        node knows when it next has work and need not be woken every period for nothing.
        """
        if self._idle_move_at_s is None:
            self._idle_move_at_s = now + self.period_s * self._periods_until_idle_move()
        if now < self._idle_move_at_s - TIME_SLACK_S:
            return False
        self._idle_move_at_s = None
        return True

    def _periods_until_idle_move(self) -> float:
        """Rounds that pass before the next idle move (0: this one), geometric in the chance."""
        chance = self.config.anneal_probability_idle / self.idle_backoff
        if chance >= 1.0:
            return 0.0
        if chance <= 0.0:
            return INF
        return float(math.floor(math.log1p(-self.rng.random()) / math.log1p(-chance)))

    def next_round_s(self, now: float) -> float:
        """When the next decision round may run (now, if one is overdue)."""
        return max(now, self._last_decision_s + self.period_s)

    def next_tick_s(self, now: float) -> float:
        """The earliest time a ``tick`` has anything to do; a tick before it changes nothing.

        A driver may call ``tick`` at any time (the live node does, on a fixed period); one that
        wakes the node only at this time (the simulator) saves the idle rounds. Call it again
        after every ``handle``, ``tick`` or hook, which may make work due sooner. The answer is
        kept until the state changes; news that only delays work (a peer heard from, a pong)
        keeps it, and so does any news while it is no later than the next round may run, so it
        may be early (``state_changed`` then asks afresh), never late by more than this: while a
        decision round is due, a keep-alive due before it is reported at the round (a driver
        ticking once per period, as the simulator does, sees no difference).
        """
        if self.left:
            return INF
        if self._next_tick_cache_s is None:
            self._next_tick_cache_s = self._compute_next_tick_s(now)
        return self._next_tick_cache_s

    def _compute_next_tick_s(self, now: float) -> float:
        last_decision_s, period_s = self._last_decision_s, self.period_s
        next_round_s = last_decision_s + period_s  # ``next_round_s``, inlined (hot path)
        if next_round_s < now:
            next_round_s = now
        move_s = self._idle_move_at_s
        if (
            last_decision_s == -INF
            or move_s is None  # the next round draws when the idle move comes
            or self.needs_next_hops()
            or self.advert_due(now)
        ):
            return next_round_s  # a keep-alive due sooner waits for it too (docstring above)
        round_s = self._last_reconcile_s + self.config.reconcile_periods * period_s
        if move_s < round_s:
            round_s = move_s
        refresh_s = self.next_advert_refresh_s()
        if refresh_s < round_s:
            round_s = refresh_s
        if self.pending_swaps or self.reserved or self.table_requests or self.handover_slots:
            round_s = min(round_s, self.next_expiry_s())  # inf when nothing is pending
        if round_s <= next_round_s:
            # Round work is due at the next round, and no keep-alive is reported before it.
            return next_round_s
        keepalive_s = self.next_keepalive_s(now, next_round_s)
        return keepalive_s if keepalive_s < round_s else round_s

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
        matched, locked = SlotState.MATCHED, SlotState.LOCKED  # ``is_carried``, inlined
        return {
            out.slot: (out.flow_id, out.next_hop)
            for out in self.out_slots.values()
            if out.in_key is None
            and (out.state is matched or out.state is locked)
            and out.next_hop is not None
        }

    def flow_paths(self) -> dict[str, tuple[tuple[str, ...], float]]:
        """A data node's flows as last reported by their sinks: flow id -> (path, cost ms)."""
        carried = {flow_id for flow_id, _ in self.source_routes().values()}
        return {f: report for f, report in self.flow_reports.items() if f in carried}

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
        FlowWanted: FlowNode.handle_flow_wanted,
        FlowLoan: FlowNode.handle_flow_loan,
        FlowLoanReturn: FlowNode.handle_flow_loan_return,
    }
    return table


_HANDLERS = _handlers()
#: Messages whose handling (from a live peer) brings no work forward: they answer, only tell
#: that the peer lives (which delays a keep-alive), or update a flow's recorded cost or path or
#: a loan between data nodes (which no timer reads). Where their handler does change the state
#: (a Pong that measures the link, a slot list that drops a flow) it calls ``state_changed``.
_ANSWER_ONLY: frozenset[type[Any]] = frozenset(
    {
        Ping,
        TableRequest,
        Pong,
        SlotList,
        FlowCost,
        PathUpdate,
        PathReport,
        FlowWanted,
        FlowLoan,
        FlowLoanReturn,
    }
)
