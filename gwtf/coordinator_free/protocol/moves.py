"""Same-stage improvement: table exchange and the two annealing moves (swap, take-over).

A node tries a move with probability 0.3 per period while it has flows without a next hop and 0.1
otherwise (GWTF prototype): it pulls the table of a random same-stage peer, evaluates every swap
and take-over with it, and starts the best one, or a random worse one if ``is_accepted`` takes it.

Swap: node a and same-stage peer b exchange the next hops of one flow each (and so the rest of the
two paths). a locks its slot and proposes; b moves its slot to a's old next hop and hands its old
next hop to a (``Rebind``); a, on ``SwapAccept``, does the same the other way. Take-over: a, with
spare capacity, asks b for one of b's flows; b gives it up, points the upstream at a
(``Redirect``) and the next hop at a (``Rebind``), and a carries it. Capacity is checked before a
flow is taken, so no move ever exceeds a capacity, and no move creates or ends a flow.
"""

from __future__ import annotations

from gwtf.coordinator_free.protocol.annealing import (
    FlowView,
    SwapMove,
    TakeOverMove,
    is_accepted,
    swap_gain_ms,
    take_over_gain_ms,
)
from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.protocol.like_speed import swap_speed_gain_ms, take_over_speed_gain_ms
from gwtf.coordinator_free.protocol.sharing import SharingMixin
from gwtf.coordinator_free.protocol.state import INF, InSlot, OutSlot, Peer, SlotState
from gwtf.coordinator_free.wire import (
    EdgeEntry,
    FlowCancel,
    FlowCost,
    FlowRequest,
    PathUpdate,
    PushBack,
    Rebind,
    Redirect,
    SwapAccept,
    SwapProposal,
    SwapReject,
    TableEntry,
    TableExchange,
    TableRequest,
    TakeOverDeny,
    TakeOverGrant,
    TakeOverRequest,
)

Move = SwapMove | TakeOverMove
# Ours: a reroute must save at least this much, so flows do not flap between near-equal hops.
_REROUTE_MIN_GAIN_MS = 1.0
_REROUTE_MIN_GAIN_SHARE = 0.05
# Ours: a flow whose hop changed within this many decision periods is not rerouted. An advert is
# the cost of a new flow through the peer, which the flows already moving there will raise: a
# flow that just moved must see the costs settle before it moves again, or reroutes chase each
# other round a large swarm without end (seen with 1,000 nodes: ~4,000 adverts/s for good).
_REROUTE_HOLD_PERIODS = 15
_MAX_TABLE_ENTRIES = 128


class MovesMixin(SharingMixin):
    #: Divides the idle move chance (``note_round``); 1 is the prototype's rate.
    idle_backoff: int = 1
    _fruitless_signature: tuple[object, ...] | None = None

    # ---- tables ---------------------------------------------------------------------------------

    def table(self) -> TableExchange:
        entries = [
            self._entry(out) for out in self.out_slots.values() if out.state is SlotState.MATCHED
        ]
        edges = self._table_edges
        if edges is None:  # kept until a next-stage peer or a link estimate changes
            edges = self._table_edges = tuple(
                EdgeEntry(p.peer_id, self.edge_cost_to(p))
                for p in self.alive_peers(self.next_stage)
            )
        return TableExchange(max(self.spare, 0), tuple(entries[:_MAX_TABLE_ENTRIES]), edges)

    def _entry(self, out: OutSlot) -> TableEntry:
        assert out.next_hop is not None
        inflow = None if out.in_key is None else self.in_slots[out.in_key]
        return TableEntry(
            slot=out.slot,
            flow_id=out.flow_id,
            upstream="" if inflow is None else inflow.upstream,
            next_hop=out.next_hop,
            prefix_cost_ms=self.prefix_of(out),
            edge_in_ms=0.0 if inflow is None else self.edge_cost_ms(inflow.upstream),
            edge_out_ms=out.edge_ms,
            suffix_cost_ms=out.suffix_cost_ms,
        )

    def handle_table_request(self, sender: str, msg: TableRequest, now: float) -> list[Outbound]:
        peer = self.peers.get(sender)
        if peer is None or peer.stage != self.spec.stage:
            return []
        return [Outbound(sender, self.table())]

    def handle_table(self, sender: str, msg: TableExchange, now: float) -> list[Outbound]:
        peer = self.peers.get(sender)
        if peer is None or peer.stage != self.spec.stage:
            return []
        peer.table, peer.table_at_s = msg, now
        self.set_peer_view(peer, msg.spare)
        asked_s = self.table_requests.pop(sender, None)
        if asked_s is None or now - asked_s > self.config.table_max_age_periods * self.period_s:
            return []
        return self.plan_move(peer, now)

    # ---- planning -------------------------------------------------------------------------------

    def try_move(self, now: float) -> list[Outbound]:
        """Start one annealing round: ask a random same-stage peer for its table.

        Tables are pulled when a move is tried rather than pushed every period: the same
        information, at a fraction of the messages.
        """
        has_flow = any(o.state is SlotState.MATCHED for o in self.out_slots.values())
        if not has_flow and not self.is_data and self.spare <= 0:
            return []  # nothing to swap, and no room to take a flow over
        same = self.alive_peers(self.spec.stage)
        if not same:
            return []
        peer = self.rng.choice(same)
        self.table_requests[peer.peer_id] = now
        return [Outbound(peer.peer_id, TableRequest())]

    def try_reroute(self, now: float) -> list[Outbound]:
        """Move one of my flows to a next-stage peer with spare capacity that is clearly cheaper.

        Make before break: the new hop is asked while the old one still carries the flow, and
        released only once the new one accepted. A sink's cost is its advertised wait, and
        taking a flow there adds one more share of it.

        The move goes only when the same flow and peer are the best at two looks in a row (ours).
        A cost is the cheapest way on through peers *with room*, so it jumps whenever one of
        them fills or frees; a gain seen once may be such a jump, soon undone, and moving on it
        fills and frees peers along two paths, which upstream nodes see as new jumps. Without
        the second look the swarm's reroutes fed on each other: at a 10 % advert threshold
        they never settled (bench/README.md, sim_scale); with it they do, with 9-17 % fewer
        messages at the 5 % threshold and the grid's training times within noise or shorter.
        """
        best: tuple[float, int, str] | None = None
        settled_s = now - _REROUTE_HOLD_PERIODS * self.period_s
        # What a new flow would cost through each next-stage peer with room, in peer order
        # (the same for every flow of this node; None until a flow is due to be looked at).
        targets: list[tuple[str, float]] | None = None
        penalties: dict[str, float] = {}  # the speed gaps' extra ms (like_speed.py)
        cheapest_ms = INF
        for out in self.out_slots.values():
            if out.state is not SlotState.MATCHED or out.next_hop is None:
                continue
            if out.since_s > settled_s:
                continue
            current = self.peers.get(out.next_hop)
            if current is None:
                continue
            if targets is None:
                penalties = self.hop_penalties_ms(self.alive_peers(self.next_stage))
                targets = self._reroute_targets(penalties)
                cheapest_ms = min((cost for _, cost in targets), default=INF)
            suffix = current.cost_to_sink_ms if current.role == "data" else out.suffix_cost_ms
            now_ms = out.edge_ms + suffix + penalties.get(out.next_hop, 0.0)
            threshold = max(_REROUTE_MIN_GAIN_MS, _REROUTE_MIN_GAIN_SHARE * now_ms)
            if not now_ms - cheapest_ms > threshold:
                continue  # not even the cheapest peer saves enough
            excluded = out.excluded_until_s
            for peer_id, cost in targets:
                if peer_id == out.next_hop:
                    continue
                if excluded and excluded.get(peer_id, -INF) > now:
                    continue
                gain = now_ms - cost
                if gain > threshold and (best is None or (-gain, out.slot, peer_id) < best):
                    best = (-gain, out.slot, peer_id)
        if best is None:
            self.reroute_seen = None
            return []
        _, slot, target = best
        if self.reroute_seen != (slot, target):
            self.reroute_seen = (slot, target)  # look again next time before moving
            return []
        self.reroute_seen = None
        out = self.out_slots[slot]
        out.state, out.pending_move, out.since_s = SlotState.LOCKED, (target, target), now
        self.pending_swaps[slot] = (target, target, now)
        prefix = self.prefix_of(out) + self.edge_cost_ms(target)
        return [Outbound(target, FlowRequest(slot, out.flow_id, self.path_of(out), prefix))]

    def _reroute_targets(self, penalties: dict[str, float]) -> list[tuple[str, float]]:
        """Next-stage peers with room a flow may be rerouted to, with what a new flow through
        each would cost from here (a sink's cost grows by one more share of its wait), plus
        the peer's speed-gap penalty."""
        targets = []
        to_sink = self.next_stage == 0
        for peer in self.alive_peers(self.next_stage):
            if peer.spare <= 0 or (to_sink and peer.role != "data"):
                continue
            added = peer.compute_ms / max(peer.capacity, 1) if peer.role == "data" else 0.0
            cost = self.cost_through_ms(peer) + added + penalties.get(peer.peer_id, 0.0)
            targets.append((peer.peer_id, cost))
        return targets

    def plan_move(self, peer: Peer, now: float) -> list[Outbound]:
        """Plan one annealing move with ``peer``'s table and start it if it is accepted."""
        handover = self.plan_handover(peer, now)
        if handover:
            return handover
        moves = self._candidate_moves(peer)
        self.note_round(found_moves=bool(moves))
        if not moves:
            return []
        best = max(moves, key=lambda move: move.gain_ms)
        chosen = best if best.gain_ms > 0 else self.rng.choice(moves)
        if not is_accepted(chosen.gain_ms, chosen.scale_ms, self.temperature, self.rng):
            return []
        self.temperature *= self.config.cooling
        self.moves_done += 1
        if isinstance(chosen, SwapMove):
            return self._propose_swap(peer, chosen, now)
        return self._request_take_over(peer, chosen, now)

    def note_round(self, found_moves: bool) -> None:
        """Annealing's end: an idle node whose rounds keep finding no move at all, while its own
        flows and neighbours stay as they were, tries its idle moves less often (the expected
        wait doubles per such round after the first, up to ``anneal_backoff_max`` times the
        prototype's); a round that finds any move, or a change of its flows or neighbours
        (``FlowNode.tick`` checks), restores the full rate."""
        if found_moves:
            self.idle_backoff, self._fruitless_signature = 1, None
            return
        signature = self.flow_signature()
        if signature == self._fruitless_signature:
            self.idle_backoff = min(2 * self.idle_backoff, self.config.anneal_backoff_max)
        else:
            self.idle_backoff, self._fruitless_signature = 1, signature

    def flow_signature(self) -> tuple[object, ...]:
        """What decides which moves this node can make: its flows and next hops, its load, and
        how many live peers it knows in the three stages it deals with."""
        return (
            tuple((out.slot, out.next_hop, out.state) for out in self.out_slots.values()),
            len(self.in_slots) + len(self.reserved),
            len(self.alive_peers(self.previous_stage)),
            len(self.alive_peers(self.spec.stage)),
            len(self.alive_peers(self.next_stage)),
        )

    def _candidate_moves(self, peer: Peer) -> list[Move]:
        assert peer.table is not None
        theirs = [
            e for e in peer.table.entries if e.suffix_cost_ms < INF and e.next_hop != self.node_id
        ]
        their_edges = {edge.peer: edge.cost_ms for edge in peer.table.next_edges}
        next_ids = {p.peer_id for p in self.alive_peers(self.next_stage)}
        # Moves that part like GPUs count against them (like_speed.py); 0 when all are alike.
        like_weight, my_ms = self.config.like_speed_weight, self.spec.compute_ms
        moves: list[Move] = []
        # Their flows whose next hop I can reach, with my edge to it (the same for all mine).
        reachable = [(e, self.edge_cost_ms(e.next_hop)) for e in theirs if e.next_hop in next_ids]
        for out in self.out_slots.values() if reachable else ():
            if (
                out.state is not SlotState.MATCHED
                or out.suffix_cost_ms == INF
                or out.next_hop is None
                or out.next_hop not in their_edges  # they cannot reach my next hop
            ):
                continue
            their_edge_ms = their_edges[out.next_hop]
            my_next = self.peers.get(out.next_hop)
            mine = FlowView(
                out.slot, out.next_hop, self.prefix_of(out), out.edge_ms, out.suffix_cost_ms
            )
            for entry, my_edge_ms in reachable:
                if entry.next_hop == out.next_hop:
                    continue
                gain = swap_gain_ms(mine, entry, my_edge_ms, their_edge_ms)
                if like_weight > 0 and my_next is not None:
                    gain += swap_speed_gain_ms(
                        my_ms,
                        peer.compute_ms,
                        my_next.compute_ms,
                        self.peers[entry.next_hop].compute_ms,
                        like_weight,
                    )
                moves.append(SwapMove(mine, entry, gain))
        if self.is_data or self.spare <= 0:
            return moves
        previous_ids = {p.peer_id for p in self.alive_peers(self.previous_stage)}
        for entry in theirs:
            if entry.upstream in previous_ids and entry.next_hop in next_ids:
                edge_in, edge_out = (
                    self.edge_cost_ms(entry.upstream),
                    self.edge_cost_ms(entry.next_hop),
                )
                gain = take_over_gain_ms(entry, edge_in, edge_out)
                if like_weight > 0:
                    gain += take_over_speed_gain_ms(
                        self.peers[entry.upstream].compute_ms,
                        peer.compute_ms,
                        my_ms,
                        self.peers[entry.next_hop].compute_ms,
                        like_weight,
                    )
                moves.append(TakeOverMove(entry, edge_in, edge_out, gain))
        return moves

    def _propose_swap(self, peer: Peer, move: SwapMove, now: float) -> list[Outbound]:
        out = self.out_slots[move.mine.slot]
        out.state = SlotState.LOCKED
        out.pending_move = (peer.peer_id, move.theirs.next_hop)
        out.since_s = now
        self.pending_swaps[out.slot] = (peer.peer_id, move.theirs.next_hop, now)
        proposal = SwapProposal(
            proposer_slot=out.slot,
            proposer_next=move.mine.next_hop,
            target_slot=move.theirs.slot,
            target_next=move.theirs.next_hop,
            flow_id=out.flow_id,
            path=self.path_of(out),
            prefix_cost_ms=self.prefix_of(out) + self.edge_cost_ms(move.theirs.next_hop),
            suffix_cost_ms=out.suffix_cost_ms,
        )
        return [Outbound(peer.peer_id, proposal)]

    def _request_take_over(self, peer: Peer, move: TakeOverMove, now: float) -> list[Outbound]:
        new_slot = self.new_slot_number()
        until_s = now + self.config.move_timeout_periods * self.period_s
        self.reserved[new_slot] = (peer.peer_id, move.theirs.slot, until_s)
        return [Outbound(peer.peer_id, TakeOverRequest(move.theirs.slot, new_slot))]

    def expire_moves(self, now: float) -> None:
        """Forget moves whose answer never came: unlock slots, release reservations."""
        limit_s = self.config.move_timeout_periods * self.period_s
        for out in self.out_slots.values():
            if out.state is SlotState.LOCKED and now - out.since_s > limit_s:
                out.state, out.pending_move = SlotState.MATCHED, None
        for slot, (_, _, until_s) in list(self.reserved.items()):
            if until_s < now:
                del self.reserved[slot]
        for slot, asked_s in list(self.handover_slots.items()):
            if now - asked_s > limit_s:
                del self.handover_slots[slot]
        max_age_s = self.config.table_max_age_periods * self.period_s
        for peer_id, asked_s in list(self.table_requests.items()):
            if now - asked_s > max_age_s:
                del self.table_requests[peer_id]
        # A swap answer can still arrive after the lock is gone; remember it a while longer.
        for slot, (_, _, started_s) in list(self.pending_swaps.items()):
            if now - started_s > 5 * limit_s:
                del self.pending_swaps[slot]

    def next_expiry_s(self) -> float:
        """When ``expire_moves`` next has something to forget (inf when nothing is pending)."""
        if not (self.pending_swaps or self.reserved or self.table_requests or self.handover_slots):
            return INF  # then the node does not run expire_moves at all
        limit_s = self.config.move_timeout_periods * self.period_s
        due = [o.since_s + limit_s for o in self.out_slots.values() if o.state is SlotState.LOCKED]
        due += [until_s for _, _, until_s in self.reserved.values()]
        due += [asked_s + limit_s for asked_s in self.handover_slots.values()]
        max_age_s = self.config.table_max_age_periods * self.period_s
        due += [asked_s + max_age_s for asked_s in self.table_requests.values()]
        due += [started_s + 5 * limit_s for _, _, started_s in self.pending_swaps.values()]
        return min(due, default=INF)

    # ---- swap handlers --------------------------------------------------------------------------

    def handle_swap_proposal(self, sender: str, msg: SwapProposal, now: float) -> list[Outbound]:
        out = self.out_slots.get(msg.target_slot)
        peer = self.peers.get(sender)
        valid = (
            out is not None
            and peer is not None
            and peer.stage == self.spec.stage
            and out.state is SlotState.MATCHED
            and out.next_hop == msg.target_next
            and msg.proposer_next in self.peers
            and msg.proposer_next != msg.target_next
            and len(msg.path) <= self.config.stages + 1
        )
        if not valid or out is None:
            return [Outbound(sender, SwapReject(msg.proposer_slot))]
        old_next, old_suffix = msg.target_next, out.suffix_cost_ms
        out.next_hop, out.suffix_cost_ms = msg.proposer_next, msg.suffix_cost_ms
        out.edge_ms, out.since_s = self.edge_cost_ms(msg.proposer_next), now
        rebind = Rebind(
            msg.target_slot, sender, msg.proposer_slot, msg.flow_id, msg.path, msg.prefix_cost_ms
        )
        accept = SwapAccept(
            proposer_slot=msg.proposer_slot,
            target_slot=msg.target_slot,
            flow_id=out.flow_id,
            path=self.path_of(out),
            prefix_cost_ms=self.prefix_of(out) + out.edge_ms,
            suffix_cost_ms=old_suffix,
        )
        return [Outbound(old_next, rebind), Outbound(sender, accept), *self.report_suffix(out)]

    def handle_swap_accept(self, sender: str, msg: SwapAccept, now: float) -> list[Outbound]:
        pending = self.pending_swaps.pop(msg.proposer_slot, None)
        if pending is None or pending[0] != sender:
            return []
        new_next = pending[1]  # the peer already bound its old next hop to our slot
        out = self.out_slots.get(msg.proposer_slot)
        if out is None:  # the flow ended meanwhile: release it at the hop we were given
            return [Outbound(new_next, FlowCancel(msg.proposer_slot))]
        sends: list[Outbound] = []
        old_next = out.next_hop
        if out.is_carried and old_next is not None:
            rebind = Rebind(
                msg.proposer_slot,
                sender,
                msg.target_slot,
                msg.flow_id,
                msg.path,
                msg.prefix_cost_ms,
            )
            sends.append(Outbound(old_next, rebind))
        elif out.state is SlotState.PENDING and old_next is not None:
            # The slot lost its next hop while the move was in flight and asked another peer;
            # keep the hop the move gave us and withdraw that request. The peer's side of the
            # swap is repaired by reconciliation.
            sends.append(Outbound(old_next, FlowCancel(out.slot)))
        out.next_hop, out.suffix_cost_ms = new_next, msg.suffix_cost_ms
        out.edge_ms, out.state, out.pending_move, out.since_s = (
            self.edge_cost_ms(new_next),
            SlotState.MATCHED,
            None,
            now,
        )
        return sends + self.report_suffix(out)

    def handle_swap_reject(self, sender: str, msg: SwapReject, now: float) -> list[Outbound]:
        self.pending_swaps.pop(msg.proposer_slot, None)
        out = self.out_slots.get(msg.proposer_slot)
        if out is not None and out.state is SlotState.LOCKED and out.pending_move is not None:
            out.state, out.pending_move = SlotState.MATCHED, None
        return []

    # ---- take-over handlers ---------------------------------------------------------------------

    def handle_take_over_request(
        self, sender: str, msg: TakeOverRequest, now: float
    ) -> list[Outbound]:
        if self.is_data:
            return self.hand_over_source(sender, msg, now)
        out = self.out_slots.get(msg.target_slot)
        peer = self.peers.get(sender)
        ok = (
            out is not None
            and out.in_key is not None
            and out.state is SlotState.MATCHED
            and peer is not None
            and peer.stage == self.spec.stage
        )
        if not ok or out is None or out.in_key is None or out.next_hop is None:
            return [Outbound(sender, TakeOverDeny(msg.target_slot, msg.new_slot))]
        inflow = self.in_slots.pop(out.in_key)
        del self.out_slots[out.slot]
        upstream_prefix = inflow.prefix_cost_ms - self.edge_cost_ms(inflow.upstream)
        grant = TakeOverGrant(
            target_slot=msg.target_slot,
            new_slot=msg.new_slot,
            upstream=inflow.upstream,
            upstream_slot=inflow.upstream_slot,
            next_hop=out.next_hop,
            flow_id=out.flow_id,
            path=inflow.path,
            upstream_prefix_cost_ms=max(upstream_prefix, 0.0),
            suffix_cost_ms=out.suffix_cost_ms,
        )
        rebind = Rebind(
            out.slot,
            sender,
            msg.new_slot,
            out.flow_id,
            (*inflow.path, sender),
            inflow.prefix_cost_ms,
        )
        return [
            Outbound(inflow.upstream, Redirect(inflow.upstream_slot, sender)),
            Outbound(out.next_hop, rebind),
            Outbound(sender, grant),
        ]

    def handle_take_over_grant(self, sender: str, msg: TakeOverGrant, now: float) -> list[Outbound]:
        if self.is_data:
            return self.adopt_source(sender, msg, now)
        reserved = self.reserved.pop(msg.new_slot, None)
        key = (msg.upstream, msg.upstream_slot)
        fits = reserved is not None or self.spare > 0
        if not fits or key in self.in_slots or msg.new_slot in self.out_slots:
            # Nowhere to put it: hand the flow back to its upstream, release it downstream.
            return [
                Outbound(msg.next_hop, FlowCancel(msg.new_slot)),
                Outbound(msg.upstream, PushBack(msg.upstream_slot)),
            ]
        prefix = msg.upstream_prefix_cost_ms + self.edge_cost_ms(msg.upstream)
        inflow = InSlot(msg.upstream, msg.upstream_slot, msg.flow_id, msg.path, prefix, now)
        inflow.out_slot = msg.new_slot
        out = OutSlot(msg.new_slot, msg.flow_id, key, SlotState.MATCHED, msg.next_hop, since_s=now)
        out.suffix_cost_ms = msg.suffix_cost_ms
        out.edge_ms = self.edge_cost_ms(msg.next_hop)
        self.in_slots[key] = inflow
        self.out_slots[out.slot] = out
        update = PathUpdate(out.slot, out.flow_id, self.path_of(out), prefix + out.edge_ms)
        inflow.reported_suffix_ms = out.edge_ms + out.suffix_cost_ms
        return [
            Outbound(msg.next_hop, update),
            Outbound(msg.upstream, FlowCost(msg.upstream_slot, inflow.reported_suffix_ms)),
            Outbound(msg.upstream, self.hello(wants_reply=True)),
        ]

    def handle_take_over_deny(self, sender: str, msg: TakeOverDeny, now: float) -> list[Outbound]:
        self.reserved.pop(msg.new_slot, None)
        self.handover_slots.pop(msg.new_slot, None)
        return []
