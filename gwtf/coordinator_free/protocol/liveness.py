"""Who is around: introductions, keep-alives with flow partners, death and graceful leaving.

Keep-alives go only to flow partners (upstream and next hops of carried flows), every
``keepalive_interval_s``; an unanswered ping after ``keepalive_timeout_s`` is a miss, and
``keepalive_misses`` misses in a row declare the peer dead (GWTF prototype: 20 s, 5 s, 3). The
data plane declares deaths sooner through ``peer_dead`` when a hop acknowledgement is missed.
A dead peer is never chosen again until it introduces itself anew. Any message, and any hop
acknowledgement the data plane reports through ``heard_from``, counts as a sign of life: a flow
partner that keeps delivering is never pinged (the slot list to it then asks for no answer).
"""

from __future__ import annotations

import dataclasses
import math

from gwtf.coordinator_free.protocol.base import NodeBase
from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.protocol.state import INF, Peer, SlotState
from gwtf.coordinator_free.wire import CostAdvert, FlowCancel, Goodbye, Hello, Ping, Pong, PushBack

#: A measured compute time is announced once it differs from the announced one by this fraction.
COMPUTE_CHANGE = 0.25
#: The same-stage peer that cuts a relay's slot offer (``speed_reference``) is pinged after this
#: many keep-alive intervals of quiet, not one: its death loses no microbatch (it carries none of
#: this relay's flows), only slots this relay could offer meanwhile, and at 1,000 nodes one ping
#: per slow relay each interval was a tenth of all control messages.
REFERENCE_WATCH_INTERVALS = 4


class LivenessMixin(NodeBase):
    _last_advert: tuple[float, bool] | None  # this node's last advert (``RoutingMixin``)

    def introduce(self, peer_id: str) -> list[Outbound]:
        """Introduce this node to ``peer_id`` (found by discovery); its Hello comes back."""
        if peer_id == self.node_id:
            return []
        return [Outbound(peer_id, self.hello(wants_reply=True))]

    def handle_hello(self, sender: str, msg: Hello, now: float) -> list[Outbound]:
        if sender == self.node_id or msg.stages != self.config.stages:
            return []
        if msg.role not in ("data", "relay") or (msg.role == "data") != (msg.stage == 0):
            return []
        peer = self.peers.get(sender)
        sends: list[Outbound] = []
        if peer is not None and (peer.stage != msg.stage or peer.boot_id != msg.boot_id):
            # It restarted, or came back at another stage: what it carried for us is gone.
            sends = self.peer_dead(sender, now)
            self.remove_peer(sender)
            peer = None
        if msg.stage not in (self.previous_stage, self.spec.stage, self.next_stage):
            return sends
        if peer is None:
            if not self._room_for(msg.stage):
                return sends
            peer = Peer(
                sender, msg.role, msg.stage, msg.capacity, max(msg.compute_ms, 0.0), msg.spare, now
            )
            peer.boot_id = msg.boot_id
            self.add_peer(peer)
            if msg.stage == self.previous_stage and self._last_advert is not None:
                # A new upstream peer needs my current advert; before my first decision round
                # it gets that round's advert with every other upstream peer (not twice).
                advert = CostAdvert(self.cost_to_sink_ms(), max(self.spare, 0))
                sends.append(Outbound(sender, advert))
        else:
            self.set_peer_alive(peer, True)
            peer.misses, peer.last_heard_s, peer.capacity = 0, now, msg.capacity
            self.set_peer_view(peer, msg.spare)
            if peer.compute_ms != msg.compute_ms:
                peer.compute_ms, peer.edge_cost_ms = max(msg.compute_ms, 0.0), None
                self.peers_changed()  # its edge cost changed: the cheapest way on may too
        if msg.wants_reply:
            sends.insert(0, Outbound(sender, self.hello()))
        return sends

    def _room_for(self, stage: int) -> bool:
        """Bounded neighbour table: at most ``max_peers_per_stage`` a stage (``max_upstream_peers``
        for the previous stage); dead ones make room."""
        same = [p for p in self.peers.values() if p.stage == stage]
        limit = self.config.max_peers_per_stage
        if stage == self.previous_stage:
            limit = max(limit, self.config.max_upstream_peers)
        if len(same) < limit:
            return True
        dead = sorted((p for p in same if not p.alive), key=lambda p: p.peer_id)
        if dead:
            self.remove_peer(dead[0].peer_id)
            return True
        return False

    def handle_ping(self, sender: str, msg: Ping, now: float) -> list[Outbound]:
        return [Outbound(sender, Pong(msg.nonce))]

    def handle_pong(self, sender: str, msg: Pong, now: float) -> list[Outbound]:
        peer = self.peers.get(sender)
        if peer is not None and peer.ping_nonce == msg.nonce:
            self.observe_link(sender, (now - peer.ping_sent_s) * 1000.0 / 2.0)
            peer.ping_nonce, peer.misses = None, 0
        return []

    def handle_goodbye(self, sender: str, msg: Goodbye, now: float) -> list[Outbound]:
        return self.peer_dead(sender, now)

    def measured_compute(self, compute_ms: float) -> list[Outbound]:
        """The data plane measured this node's compute time per microbatch: when it moved by more
        than ``COMPUTE_CHANGE`` from the one announced, adopt it (edge costs use it; placement
        weighs speed by it) and tell every live peer in a ``Hello``."""
        announced = self.spec.compute_ms
        if not math.isfinite(compute_ms) or compute_ms <= 0:
            return []
        if announced > 0 and abs(compute_ms - announced) <= COMPUTE_CHANGE * announced:
            return []
        self.spec = dataclasses.replace(self.spec, compute_ms=compute_ms)
        for peer in self.peers.values():
            peer.edge_cost_ms = None
        self.peers_changed()
        self.state_changed()
        hello = self.hello()
        return [Outbound(p.peer_id, hello) for p in self.peers.values() if p.alive]

    def heard_from(self, sender: str, now: float) -> None:
        peer = self.peers.get(sender)
        if peer is not None and peer.alive:
            peer.last_heard_s = now

    def flow_partners(self) -> set[str]:
        """Upstream peers of carried flows, next hops of sent ones, and the same-stage peer that
        cuts this relay's slot offer (``speed_reference``): whom keep-alives watch."""
        partners = self._flow_ends()
        reference = self.speed_reference()
        if reference is not None:
            partners.add(reference)
        return partners

    def _flow_ends(self) -> set[str]:
        partners = {inflow.upstream for inflow in self.in_slots.values()}
        partners.update(o.next_hop for o in self.out_slots.values() if o.next_hop is not None)
        return partners

    def _watch_interval_s(self, peer_id: str, flow_ends: set[str]) -> float:
        """How long ``peer_id`` may be quiet before a ping: longer for the speed reference
        alone (``REFERENCE_WATCH_INTERVALS``)."""
        interval_s = self.config.keepalive_interval_s
        return interval_s if peer_id in flow_ends else REFERENCE_WATCH_INTERVALS * interval_s

    def next_keepalive_s(self, now: float, not_before_s: float = -INF) -> float:
        """When ``keepalive`` next has something to do (a ping to send or a miss to count).

        Any time at or before ``not_before_s`` is answered as ``not_before_s`` (a caller that
        ticks no sooner need not know more), which ends the scan early.
        """
        due_s = INF
        interval_s = self.config.keepalive_interval_s
        timeout_s = self.config.keepalive_timeout_s
        peers = self.peers
        partners: list[str | None] = [inflow.upstream for inflow in self.in_slots.values()]
        partners += [out.next_hop for out in self.out_slots.values()]
        for peer_id in partners:
            peer = peers.get(peer_id) if peer_id is not None else None
            if peer is None or not peer.alive:
                continue
            peer_due_s = _ping_due_s(peer, now, interval_s, timeout_s)
            if peer_due_s < due_s:
                if peer_due_s <= not_before_s:
                    return not_before_s
                due_s = peer_due_s
        reference = self.speed_reference()
        peer = peers.get(reference) if reference is not None else None
        if peer is not None and peer.alive and reference not in partners:
            reference_interval_s = REFERENCE_WATCH_INTERVALS * interval_s
            due_s = min(
                due_s, max(not_before_s, _ping_due_s(peer, now, reference_interval_s, timeout_s))
            )
        return due_s

    def keepalive(self, now: float) -> list[Outbound]:
        """Ping flow partners that were quiet for an interval; count misses; declare death.

        Any message from a partner (the data plane reports its hop acknowledgements through
        ``heard_from``) counts as an answer, so busy links need no pings.
        """
        sends: list[Outbound] = []
        flow_ends = self._flow_ends()
        reference = self.speed_reference()
        watched = flow_ends if reference is None else flow_ends | {reference}
        for peer_id in sorted(watched):
            peer = self.peers.get(peer_id)
            if peer is None or not peer.alive:
                continue
            if peer.ping_nonce is not None and peer.last_heard_s > peer.ping_sent_s:
                peer.ping_nonce, peer.misses = None, 0  # any message answers a keep-alive
            timeout_s = self.config.keepalive_timeout_s
            if peer.ping_nonce is not None and now - peer.ping_sent_s > timeout_s:
                peer.ping_nonce = None
                peer.misses += 1
                if peer.misses >= self.config.keepalive_misses:
                    sends += self.peer_dead(peer_id, now)
                    continue
            quiet_s = now - max(peer.last_ping_s, peer.last_heard_s)
            # After a miss the next ping goes at once: three misses take three timeouts, not
            # three intervals, so a silent partner is declared dead within interval + 3 timeouts.
            retry = peer.ping_nonce is None and peer.misses > 0
            interval_s = self._watch_interval_s(peer_id, flow_ends)
            if retry or (peer.ping_nonce is None and quiet_s >= interval_s):
                peer.ping_nonce, peer.ping_sent_s, peer.last_ping_s = self.new_nonce(), now, now
                sends.append(Outbound(peer_id, Ping(peer.ping_nonce)))
        return sends

    def peer_dead(self, peer_id: str, now: float) -> list[Outbound]:
        """Hook: ``peer_id`` is gone. Re-route flows that went to it, release those from it."""
        self.state_changed()
        peer = self.peers.get(peer_id)
        if peer is not None:
            self.set_peer_alive(peer, False)
            peer.table, peer.ping_nonce = None, None
        sends: list[Outbound] = []
        for key in [k for k in self.in_slots if k[0] == peer_id]:
            sends += self.drop_in_slot(key)
        for slot in [s for s, r in self.reserved.items() if r[0] == peer_id]:
            del self.reserved[slot]
        for out in list(self.out_slots.values()):
            if out.pending_move is not None and out.pending_move[0] == peer_id:
                out.state, out.pending_move = SlotState.MATCHED, None
            if out.next_hop == peer_id and out.state is not SlotState.UNMATCHED:
                sends += self.unmatch(out, now, 0.0)
        return sends

    def leave(self, now: float) -> list[Outbound]:
        """Leave gracefully: release every flow up- and downstream and say goodbye."""
        sends: list[Outbound] = []
        for out in self.out_slots.values():
            if out.next_hop is not None and out.state is not SlotState.UNMATCHED:
                sends.append(Outbound(out.next_hop, FlowCancel(out.slot)))
        for inflow in self.in_slots.values():
            sends.append(Outbound(inflow.upstream, PushBack(inflow.upstream_slot)))
        sends += [Outbound(peer_id, Goodbye()) for peer_id in sorted(self.peers)]
        self.in_slots.clear()
        self.out_slots.clear()
        self.reserved.clear()
        self.left = True
        return sends


def _ping_due_s(peer: Peer, now: float, interval_s: float, timeout_s: float) -> float:
    """When a watched ``peer`` next needs ``keepalive``: its ping's timeout, at once after a
    miss, or an interval after it was last heard from or pinged."""
    if peer.ping_nonce is not None and peer.last_heard_s <= peer.ping_sent_s:
        return peer.ping_sent_s + timeout_s
    if peer.ping_nonce is None and peer.misses > 0:
        return now
    last_s = peer.last_heard_s
    if peer.last_ping_s > last_s:
        last_s = peer.last_ping_s
    return last_s + interval_s
