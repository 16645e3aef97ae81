"""Building and keeping flows: requests, accepts, rejects, cancels, push-backs, cost adverts.

A node with a slot that needs a next hop asks the next-stage peer with spare capacity that
minimises edge cost + advertised cost to a sink; an accepted request becomes a flow. Costs flow
upstream twice: as a general advert (cheapest cost to a sink, for choosing) and per flow (what
this flow costs from here, for the annealing moves). A relay that cannot forward a flow for
``unmatched_timeout_periods`` pushes it back upstream. Every ``reconcile_periods`` a node tells
each upstream peer which of its slots it carries, so any flow orphaned by a race or a lost
message is released (anti-entropy).
"""

from __future__ import annotations

from gwtf.coordinator_free.protocol.base import NodeBase
from gwtf.coordinator_free.protocol.config import DATA, Outbound
from gwtf.coordinator_free.protocol.state import INF, TIME_SLACK_S, InSlot, OutSlot, Peer, SlotState
from gwtf.coordinator_free.wire import (
    CostAdvert,
    FlowAccept,
    FlowCancel,
    FlowCost,
    FlowReject,
    FlowRequest,
    PathReport,
    PathUpdate,
    Pong,
    PushBack,
    Rebind,
    Redirect,
    SlotList,
)

_ADVERT_CHANGE = 0.05  # re-advertise when the cost moves by more than 5% (ours)


class RoutingMixin(NodeBase):
    _last_advert: tuple[float, bool] | None = None
    _last_advert_at_s: float = -INF
    _advert_refresh_at_s: float = -INF  # when the last advert is to be refreshed

    # ---- handlers -------------------------------------------------------------------------------

    def handle_flow_request(self, sender: str, msg: FlowRequest, now: float) -> list[Outbound]:
        key = (sender, msg.slot)
        peer = self.peers.get(sender)
        if key in self.in_slots:  # a repeated request: answer the same again
            return [Outbound(sender, FlowAccept(msg.slot, self._suffix_for(self.in_slots[key])))]
        known = peer is not None and peer.alive and peer.stage == self.previous_stage
        if not known or self.spare <= 0 or len(msg.path) > self.config.stages + 1:
            return [Outbound(sender, FlowReject(msg.slot, max(self.spare, 0) if known else 0))]
        inflow = InSlot(sender, msg.slot, msg.flow_id, msg.path, msg.prefix_cost_ms, now)
        self.in_slots[key] = inflow
        if self.is_data:
            inflow.reported_suffix_ms = 0.0
            return [Outbound(sender, FlowAccept(msg.slot, 0.0)), *self.report_path(inflow)]
        out = OutSlot(self.new_slot_number(), msg.flow_id, key, since_s=now)
        self.out_slots[out.slot] = out
        inflow.out_slot = out.slot
        return [Outbound(sender, FlowAccept(msg.slot, INF)), *self.route_slot(out, now)]

    def handle_flow_accept(self, sender: str, msg: FlowAccept, now: float) -> list[Outbound]:
        out = self.out_slots.get(msg.slot)
        if out is not None and out.pending_move == (sender, sender):
            return self.finish_reroute(out, sender, msg.suffix_cost_ms, now)
        if out is None or out.state is not SlotState.PENDING or out.next_hop != sender:
            return [Outbound(sender, FlowCancel(msg.slot))]  # nobody here wants it any more
        out.state = SlotState.MATCHED
        out.suffix_cost_ms = msg.suffix_cost_ms
        out.since_s = now
        return self.report_suffix(out)

    def handle_flow_reject(self, sender: str, msg: FlowReject, now: float) -> list[Outbound]:
        peer = self.peers.get(sender)
        if peer is not None:
            self.set_peer_view(peer, msg.spare)
        out = self.out_slots.get(msg.slot)
        if out is not None and out.pending_move == (sender, sender):  # a reroute was refused
            out.state, out.pending_move = SlotState.MATCHED, None
            self.pending_swaps.pop(out.slot, None)
            out.excluded_until_s[sender] = now + self.config.exclusion_periods * self.period_s
            return []
        if out is None or out.state is not SlotState.PENDING or out.next_hop != sender:
            return []
        out.state = SlotState.UNMATCHED
        out.excluded_until_s[sender] = now + self.config.exclusion_periods * self.period_s
        out.next_hop = None
        return self.route_slot(out, now)

    def handle_flow_cancel(self, sender: str, msg: FlowCancel, now: float) -> list[Outbound]:
        return self.drop_in_slot((sender, msg.slot))

    def handle_push_back(self, sender: str, msg: PushBack, now: float) -> list[Outbound]:
        out = self.out_slots.get(msg.slot)
        if out is None or out.next_hop != sender or out.state is SlotState.UNMATCHED:
            return []
        return self.unmatch(out, now, self.config.exclusion_periods * self.period_s)

    def handle_flow_cost(self, sender: str, msg: FlowCost, now: float) -> list[Outbound]:
        out = self.out_slots.get(msg.slot)
        if out is None or out.next_hop != sender or not out.is_carried:
            return []
        out.suffix_cost_ms = msg.suffix_cost_ms
        return self.report_suffix(out)

    def handle_path_update(self, sender: str, msg: PathUpdate, now: float) -> list[Outbound]:
        inflow = self.in_slots.get((sender, msg.slot))
        if inflow is None or len(msg.path) > self.config.stages + 1:
            return []
        inflow.flow_id, inflow.path, inflow.prefix_cost_ms = (
            msg.flow_id,
            msg.path,
            msg.prefix_cost_ms,
        )
        if inflow.out_slot is not None:
            self.out_slots[inflow.out_slot].flow_id = msg.flow_id
        return self.announce_path(inflow)

    def handle_rebind(self, sender: str, msg: Rebind, now: float) -> list[Outbound]:
        """The current upstream hands this flow to a same-stage peer of its own (a move)."""
        inflow = self.in_slots.get((sender, msg.old_slot))
        new_key = (msg.new_upstream, msg.new_slot)
        if new_key in self.in_slots or len(msg.path) > self.config.stages + 1:
            return []
        if inflow is None:
            # A concurrent move took this flow away; the new upstream must not count on us.
            return [Outbound(msg.new_upstream, PushBack(msg.new_slot))]
        del self.in_slots[inflow.key]
        inflow.upstream, inflow.upstream_slot = new_key
        inflow.flow_id, inflow.path, inflow.prefix_cost_ms = (
            msg.flow_id,
            msg.path,
            msg.prefix_cost_ms,
        )
        inflow.since_s = now
        inflow.reported_suffix_ms = INF
        self.in_slots[new_key] = inflow
        if inflow.out_slot is None:
            inflow.reported_suffix_ms = 0.0
            return [
                Outbound(msg.new_upstream, FlowCost(msg.new_slot, 0.0)),
                *self.report_path(inflow),
            ]
        out = self.out_slots[inflow.out_slot]
        out.in_key, out.flow_id = new_key, msg.flow_id
        return self.report_suffix(out) + self.announce_path(inflow)

    def handle_redirect(self, sender: str, msg: Redirect, now: float) -> list[Outbound]:
        """The next hop handed this flow to a same-stage peer (a take-over)."""
        out = self.out_slots.get(msg.slot)
        if out is None or out.next_hop != sender or not out.is_carried:
            if out is None or out.next_hop != msg.new_next:
                # A concurrent move changed this slot first: release it where it was handed.
                return [Outbound(msg.new_next, FlowCancel(msg.slot))]
            return []
        known = self.peers.get(msg.new_next)
        if known is not None and not known.alive:
            return self.unmatch(out, now, 0.0)
        if known is None:
            old = self.peers[sender]
            self.add_peer(Peer(msg.new_next, old.role, old.stage, 0, old.compute_ms, 0, now))
        out.next_hop = msg.new_next
        out.edge_ms = self.edge_cost_ms(msg.new_next)
        out.since_s = now
        out.state = SlotState.MATCHED
        out.pending_move = None
        return self.report_suffix(out)

    def handle_cost_advert(self, sender: str, msg: CostAdvert, now: float) -> list[Outbound]:
        peer = self.peers.get(sender)
        if peer is not None:
            self.set_peer_view(peer, msg.spare, msg.cost_to_sink_ms)
        return []

    def handle_path_report(self, sender: str, msg: PathReport, now: float) -> list[Outbound]:
        owned = any(out.flow_id == msg.flow_id for out in self.out_slots.values())
        if self.is_data and owned and msg.path and msg.path[-1] == sender:
            self.flow_reports[msg.flow_id] = (msg.path, msg.cost_ms)
        return []

    def handle_slot_list(self, sender: str, msg: SlotList, now: float) -> list[Outbound]:
        """Reconcile with a downstream peer's view of which of my slots it carries."""
        peer = self.peers.get(sender)
        if peer is not None:
            peer.last_slot_list_s = now
        held = set(msg.slots)
        sends: list[Outbound] = [] if msg.nonce == 0 else [Outbound(sender, Pong(msg.nonce))]
        for slot in msg.slots:
            out = self.out_slots.get(slot)
            if out is None or out.next_hop != sender or out.state is SlotState.UNMATCHED:
                sends.append(Outbound(sender, FlowCancel(slot)))
        grace_s = 2 * self.period_s
        for out in list(self.out_slots.values()):
            stale = out.since_s < now - grace_s
            if out.next_hop == sender and out.is_carried and out.slot not in held and stale:
                self.state_changed()
                sends += self.unmatch(out, now, 0.0)
        return sends

    # ---- periodic work --------------------------------------------------------------------------

    def route_unmatched(self, now: float) -> list[Outbound]:
        sends: list[Outbound] = []
        for out in list(self.out_slots.values()):
            if out.slot not in self.handover_slots:  # that one waits for a data peer's flow
                sends += self.route_slot(out, now)
        return sends

    def push_back_stale(self, now: float) -> list[Outbound]:
        """Give back flows this relay could not forward for ``unmatched_timeout_periods``."""
        if self.is_data:
            return []
        limit_s = self.config.unmatched_timeout_periods * self.period_s
        sends: list[Outbound] = []
        for out in list(self.out_slots.values()):
            if out.is_carried or now - out.since_s <= limit_s or out.in_key is None:
                continue
            inflow = self.in_slots[out.in_key]
            sends += self.drop_in_slot(inflow.key)
            sends.append(Outbound(inflow.upstream, PushBack(inflow.upstream_slot)))
        return sends

    def advertise(self, now: float) -> list[Outbound]:
        """Tell previous-stage peers my cheapest cost to a sink, when it changed or to refresh."""
        if not self.advert_due(now):
            return []
        cost, spare = self.cost_to_sink_ms(), max(self.spare, 0)
        if self._last_advert is None and cost == INF:
            # No way to a sink known yet: upstream peers assume infinity for a peer that never
            # advertised, and my Hello told them my spare, so there is nothing to say yet.
            return []
        self._last_advert, self._last_advert_at_s = (cost, spare > 0), now
        self._advert_refresh_at_s = now + self.config.advert_refresh_periods * self.period_s
        advert = CostAdvert(cost, spare)
        return [Outbound(p.peer_id, advert) for p in self.alive_peers(self.previous_stage)]

    def advert_due(self, now: float) -> bool:
        """Whether the advert changed enough to be sent again, or its refresh is due."""
        last = self._last_advert
        if last is None or now >= self._advert_refresh_at_s - TIME_SLACK_S:
            return True
        # Asked after most messages (``next_tick_s``): the cached cost and spare read directly.
        cost = self._sink_cost_ms
        if cost is None or self.is_data:
            cost = self.cost_to_sink_ms()
        spare = self.spare
        return last[1] != (spare > 0) or (last[0] != cost and _moved(last[0], cost))

    def next_advert_refresh_s(self) -> float:
        return self._advert_refresh_at_s

    def reconcile(self, now: float) -> list[Outbound]:
        """Send each upstream peer the list of its slots I carry; drop silent downstream slots.

        The slot list doubles as the keep-alive ping to a peer quiet for about an interval
        (``keepalive`` then has no ping to send it for an interval), so a flow's two ends
        exchange one message each way per period instead of a slot list plus a ping and its
        answer, and one message alone while the data plane shows the peer alive.
        """
        by_upstream: dict[str, list[int]] = {}
        for inflow in self.in_slots.values():
            by_upstream.setdefault(inflow.upstream, []).append(inflow.upstream_slot)
        sends = [
            Outbound(up, SlotList(tuple(sorted(slots)), self._keepalive_nonce(up, now)))
            for up, slots in by_upstream.items()
        ]
        silent_s = 3 * self.config.reconcile_periods * self.period_s
        for out in list(self.out_slots.values()):
            if not out.is_carried or out.next_hop is None:
                continue
            peer = self.peers.get(out.next_hop)
            heard_s = -INF if peer is None else peer.last_slot_list_s
            if now - max(heard_s, out.since_s) > silent_s:
                sends += self.unmatch(out, now, 0.0)
        return sends

    def _keepalive_nonce(self, peer_id: str, now: float) -> int:
        """The ping nonce a slot list to ``peer_id`` carries: 0 (no answer wanted) for a peer
        not watched or heard from within the keep-alive interval less one period (a busy link
        needs no ping: TCP's keep-alive goes only on idle connections; ``keepalive`` pings the
        peer should it fall quiet for an interval before the next slot list)."""
        peer = self.peers.get(peer_id)
        if peer is None or not peer.alive:
            return 0
        if peer.ping_nonce is None:  # a new ping; an outstanding one keeps its deadline
            quiet_s = now - max(peer.last_heard_s, peer.last_ping_s)
            if quiet_s < self.config.keepalive_interval_s - self.period_s:
                return 0  # heard from lately (a message, or an ack via ``heard_from``)
            peer.ping_nonce, peer.ping_sent_s = self.new_nonce(), now
        peer.last_ping_s = now
        return peer.ping_nonce

    def _suffix_for(self, inflow: InSlot) -> float:
        if inflow.out_slot is None:
            return 0.0
        out = self.out_slots[inflow.out_slot]
        return out.edge_ms + out.suffix_cost_ms if out.is_carried else INF


def _moved(old: float, new: float) -> bool:
    if old == new:
        return False
    if old == INF or new == INF:
        return True
    return abs(new - old) > _ADVERT_CHANGE * max(abs(old), 1e-9)


__all__ = ["DATA", "RoutingMixin"]
