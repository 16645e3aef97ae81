"""Data nodes share the flows fairly: the take-over move between data nodes.

Every data node wants as many flows as its batch has microbatches, and an iteration ends only
when every data node's batch is done, so a data node left without flows stalls the whole swarm.
When a data node pulls a data peer's table (its annealing round) and that peer carries a larger
share of its batch by more than one flow, it takes over one of the peer's flows: the peer frees
that source slot and hands its first hop over (``Rebind``); nothing downstream changes. This is
the paper's take-over move applied between data nodes, with fair shares as the criterion.
"""

from __future__ import annotations

from gwtf.coordinator_free.protocol.base import NodeBase
from gwtf.coordinator_free.protocol.config import DATA, Outbound
from gwtf.coordinator_free.protocol.state import INF, Peer, SlotState
from gwtf.coordinator_free.wire import (
    FlowCancel,
    PathUpdate,
    Rebind,
    TakeOverDeny,
    TakeOverGrant,
    TakeOverRequest,
)


class SharingMixin(NodeBase):
    def plan_handover(self, peer: Peer, now: float) -> list[Outbound]:
        """Ask ``peer`` (a data node) for one of its flows if it holds more than its share."""
        if not self.is_data or peer.role != DATA or peer.table is None or peer.capacity <= 0:
            return []
        free = [
            slot
            for slot, out in self.out_slots.items()
            if out.state is SlotState.UNMATCHED and slot not in self.handover_slots
        ]
        mine = sum(1 for out in self.out_slots.values() if out.is_carried)
        theirs = len(peer.table.entries)
        # After the move they must still hold at least my share: (theirs-1)/cap_b >= (mine+1)/cap_a
        fair = (theirs - 1) * self.spec.capacity >= (mine + 1) * peer.capacity
        next_ids = {p.peer_id for p in self.alive_peers(self.next_stage)}
        entries = [e for e in peer.table.entries if e.next_hop in next_ids]
        if not free or not fair or not entries:
            return []
        entry = min(
            entries, key=lambda e: (self.edge_cost_ms(e.next_hop) + e.suffix_cost_ms, e.slot)
        )
        slot = min(free)
        self.handover_slots[slot] = now
        return [Outbound(peer.peer_id, TakeOverRequest(entry.slot, slot))]

    def hand_over_source(self, sender: str, msg: TakeOverRequest, now: float) -> list[Outbound]:
        """Give one of my flows to the asking data node; my source slot looks for another."""
        out = self.out_slots.get(msg.target_slot)
        peer = self.peers.get(sender)
        valid = (
            out is not None
            and out.state is SlotState.MATCHED
            and out.next_hop is not None
            and msg.target_slot not in self.lent_slots  # a peer's microbatch may be on it
        )
        if not valid or out is None or out.next_hop is None or peer is None or peer.role != DATA:
            return [Outbound(sender, TakeOverDeny(msg.target_slot, msg.new_slot))]
        next_hop, suffix = out.next_hop, out.suffix_cost_ms
        out.state, out.next_hop, out.suffix_cost_ms, out.edge_ms = (
            SlotState.UNMATCHED,
            None,
            INF,
            INF,
        )
        out.since_s = now
        rebind = Rebind(out.slot, sender, msg.new_slot, out.flow_id, (sender,), out.edge_ms)
        grant = TakeOverGrant(
            target_slot=msg.target_slot,
            new_slot=msg.new_slot,
            upstream="",
            upstream_slot=-1,
            next_hop=next_hop,
            flow_id=out.flow_id,
            path=(),
            upstream_prefix_cost_ms=0.0,
            suffix_cost_ms=suffix,
        )
        return [Outbound(next_hop, rebind), Outbound(sender, grant)]

    def adopt_source(self, sender: str, msg: TakeOverGrant, now: float) -> list[Outbound]:
        """A data peer handed me a flow: carry it in the source slot I reserved for it."""
        self.handover_slots.pop(msg.new_slot, None)
        out = self.out_slots.get(msg.new_slot)
        if out is None or out.state is not SlotState.UNMATCHED:
            return [Outbound(msg.next_hop, FlowCancel(msg.new_slot))]
        out.state, out.next_hop, out.suffix_cost_ms = (
            SlotState.MATCHED,
            msg.next_hop,
            msg.suffix_cost_ms,
        )
        out.edge_ms, out.since_s = self.edge_cost_ms(msg.next_hop), now
        update = PathUpdate(out.slot, out.flow_id, (self.node_id,), out.edge_ms)
        return [Outbound(msg.next_hop, update)]
