"""The state of one flow node and the helpers every part of the protocol shares.

``NodeBase`` owns the neighbour table, the in- and out-slots and the edge-cost estimates, and the
two primitives the rest is built from: choosing the next hop of a slot (the next-stage peer with
spare capacity that minimises edge cost + its advertised cost to a sink) and telling the upstream
peer when this node's cost to a sink for one of its flows changes.
"""

from __future__ import annotations

import random

from gwtf.coordinator_free.cost import relayed_latency_ms, smooth_delay, symmetric_edge_cost_ms
from gwtf.coordinator_free.placement import offered_slots
from gwtf.coordinator_free.protocol.config import (
    DATA,
    FlowConfig,
    NodeSpec,
    Outbound,
    next_stage,
    previous_stage,
)
from gwtf.coordinator_free.protocol.like_speed import hop_penalties_ms
from gwtf.coordinator_free.protocol.state import INF, InKey, InSlot, OutSlot, Peer, SlotState
from gwtf.coordinator_free.wire import (
    EdgeEntry,
    FlowCancel,
    FlowCost,
    FlowRequest,
    Hello,
    PathReport,
    PathUpdate,
)

_COST_EPSILON_MS = 1e-6


class NodeBase:
    """Neighbours, slots and cost estimates of one node; no message dispatch here."""

    def __init__(
        self, spec: NodeSpec, config: FlowConfig, rng: random.Random, boot_id: int = 0
    ) -> None:
        spec.validate(config)
        self.spec = spec
        #: The spec's id and role, fixed for the node's life: read on every message, so kept here.
        self.node_id: str = spec.node_id
        self.is_data: bool = spec.role == DATA
        # Neighbour stages are fixed for a node's life (a move is a new node): asked on every
        # message, so computed once.
        self._next_stage = next_stage(spec.stage, config.stages)
        self._previous_stage = previous_stage(spec.stage, config.stages)
        #: The decision period (``config.decision_period_s``), read on every timer check.
        self.period_s: float = config.decision_period_s
        self.boot_id = boot_id
        self.config = config
        self.rng = rng
        self.peers: dict[str, Peer] = {}
        self._alive_by_stage: dict[int, list[Peer]] = {}
        self._sink_cost_ms: float | None = None  # cached cost_to_sink_ms(); None when stale
        self._offered_slots: int | None = None  # cached offered_slots(); None when stale
        self._speed_reference: str | None = None  # set with it (``speed_reference``)
        #: The next-stage edges a table sends (``MovesMixin.table``); None once one may change.
        self._table_edges: tuple[EdgeEntry, ...] | None = None
        self.in_slots: dict[InKey, InSlot] = {}
        self.out_slots: dict[int, OutSlot] = {}
        self.reserved: dict[int, tuple[str, int, float]] = {}  # new slot -> (peer, slot, until)
        self.pending_swaps: dict[int, tuple[str, str, float]] = {}  # slot -> (peer, next, since)
        self.reroute_seen: tuple[int, str] | None = None  # the last look's best (slot, peer)
        self.table_requests: dict[str, float] = {}  # peer -> when its table was asked for
        self.handover_slots: dict[int, float] = {}  # data node: source slot -> asked at
        # Loans of idle flows between data nodes (``lending.py``).
        self.waiting_announced = 0  # my microbatches waiting for a flow
        self.waiting_told: dict[str, int] = {}  # data peer -> what it was last told of them
        self.waiting_peers: dict[str, int] = {}  # data peer -> microbatches it said wait
        self.lent_slots: dict[int, str] = {}  # my source slot -> the data peer borrowing it
        self.borrowed: dict[tuple[str, int], str] = {}  # (lender, its slot) -> first hop
        self.flow_reports: dict[str, tuple[tuple[str, ...], float]] = {}
        self.temperature = config.data_temperature if self.is_data else config.relay_temperature
        self.moves_done = 0
        self.left = False
        self._next_slot = 0
        self._next_nonce = 0
        if self.is_data:
            for index in range(spec.capacity):
                slot = self.new_slot_number()
                self.out_slots[slot] = OutSlot(slot, f"{spec.node_id}/{index}", None)

    # ---- identity -------------------------------------------------------------------------------

    @property
    def next_stage(self) -> int:
        return self._next_stage

    @property
    def previous_stage(self) -> int:
        return self._previous_stage

    @property
    def spare(self) -> int:
        """Flows this node can still accept (a data node: as a sink); < 0 while it holds more
        than it now offers (its peers' speeds became known after it accepted them)."""
        offered = self._offered_slots
        if offered is None:
            offered = self.offered_slots()
        return offered - len(self.in_slots) - len(self.reserved)

    def offered_slots(self) -> int:
        """How many of its ``capacity`` slots this node offers (``placement.offered_slots``):
        fewer on a relay slower than the fastest same-stage peer it knows from their Hellos,
        ``capacity`` on data nodes, on the fastest, and with ``slot_speed_scale`` 0.

        The scale (1.5) was chosen by measurement on the simulator's heterogeneous grid cells
        (bench/README.md, sim_compare): it gave the highest throughput in one region and in
        ten; lower scales leave slow relays idle while microbatches wait, higher ones let
        them hold the iteration's tail again (2.5 and above: every slot, with speeds 1/0.35).
        Never more than ``capacity``; a relay that learns of a faster peer after accepting
        flows keeps them (``spare`` < 0) and takes no new one until it is below its offer.
        """
        offered = self._offered_slots
        if offered is None:
            offered = self._offered_slots = self._count_offered_slots()
        return offered

    def speed_reference(self) -> str | None:
        """The same-stage peer whose speed cuts this relay's slot offer, if one does. Keep-alives
        watch it like a flow partner: a relay that never learned its faster peer died would
        keep offering fewer slots for good, and its stage would carry less than it can."""
        self.offered_slots()
        return self._speed_reference

    def _count_offered_slots(self) -> int:
        self._speed_reference = None
        if self.is_data:
            return self.spec.capacity
        fastest_ms, fastest = self.spec.compute_ms, None
        for peer in self.alive_peers(self.spec.stage):
            if 0 < peer.compute_ms < fastest_ms and peer.role != DATA:
                fastest_ms, fastest = peer.compute_ms, peer.peer_id
        offer = offered_slots(
            self.spec.capacity, self.spec.compute_ms, fastest_ms, self.config.slot_speed_scale
        )
        if offer < self.spec.capacity:
            self._speed_reference = fastest
        return offer

    def new_slot_number(self) -> int:
        self._next_slot += 1
        return self._next_slot

    def new_nonce(self) -> int:
        self._next_nonce += 1
        return self._next_nonce

    def hello(self, wants_reply: bool = False) -> Hello:
        carried = sum(1 for out in self.out_slots.values() if out.is_carried)
        return Hello(
            role=self.spec.role,
            stage=self.spec.stage,
            stages=self.config.stages,
            capacity=self.spec.capacity,
            spare=max(self.spare, 0),
            flows=carried if self.is_data else len(self.in_slots),
            compute_ms=self.spec.compute_ms,
            boot_id=self.boot_id,
            wants_reply=wants_reply,
        )

    # ---- neighbours and costs -------------------------------------------------------------------

    def alive_peers(self, stage: int) -> list[Peer]:
        """Alive peers of ``stage`` in id order (the order every choice iterates in)."""
        cached = self._alive_by_stage.get(stage)
        if cached is None:
            cached = [p for p in self.peers.values() if p.alive and p.stage == stage]
            cached.sort(key=lambda peer: peer.peer_id)
            self._alive_by_stage[stage] = cached
        return cached

    def set_peer_alive(self, peer: Peer, alive: bool) -> None:
        if peer.alive != alive:
            peer.alive = alive
            self.peers_changed()

    def add_peer(self, peer: Peer) -> None:
        self.peers[peer.peer_id] = peer
        self.peers_changed()

    def remove_peer(self, peer_id: str) -> None:
        if self.peers.pop(peer_id, None) is not None:
            self.peers_changed()

    def peers_changed(self) -> None:
        """Forget what was derived from the neighbour table (call after any change to it)."""
        self._alive_by_stage.clear()
        self._sink_cost_ms = None
        self._offered_slots = None  # a same-stage peer's speed counts in it
        self._table_edges = None

    def set_peer_view(self, peer: Peer, spare: int, cost_to_sink_ms: float | None = None) -> None:
        """Record a peer's spare capacity (and advertised cost) as last heard."""
        cached = self._sink_cost_ms
        counted = cached is not None and peer.alive and peer.stage == self._next_stage
        old_ms = self._through_if_room_ms(peer) if counted else INF
        peer.spare = spare
        if cost_to_sink_ms is not None:
            peer.cost_to_sink_ms = cost_to_sink_ms
        if not counted or cached is None:
            return
        # ``cost_to_sink_ms`` is a minimum over next-stage peers: update it for this one peer
        # instead of scanning them all (an advert arrives for every change of every peer).
        new_ms = self._through_if_room_ms(peer)
        if new_ms < cached:
            self._sink_cost_ms = new_ms
        elif new_ms > cached and old_ms == cached:
            self._sink_cost_ms = None  # it may have been the cheapest: scan again

    def observe_link(
        self, peer_id: str, latency_ms: float, bandwidth_gbps: float | None = None
    ) -> None:
        """Fold a measurement of the link to ``peer_id`` into its smoothed estimate."""
        peer = self.peers.get(peer_id)
        if peer is None:
            return
        peer.latency_ms = smooth_delay(peer.latency_ms, latency_ms)
        if bandwidth_gbps is not None and bandwidth_gbps > 0:
            peer.bandwidth_gbps = smooth_delay(peer.bandwidth_gbps, bandwidth_gbps)
        self._edge_changed(peer)

    def observe_relayed(
        self, peer_id: str, relayed: bool, relay_leg_ms: float | None = None
    ) -> None:
        """Whether the link to ``peer_id`` runs through a relay, and this node's latency
        estimate to that relay when it has one: the edge's bandwidth counts
        ``relayed_bandwidth_share`` of a direct one's, and its latency gains the relay's leg
        (``cost.relayed_latency_ms``; ``default_latency_ms`` when unmeasured)."""
        peer = self.peers.get(peer_id)
        leg = relay_leg_ms if relayed else None
        if peer is None or (peer.relayed, peer.relay_leg_ms) == (relayed, leg):
            return
        peer.relayed, peer.relay_leg_ms = relayed, leg
        self._edge_changed(peer)

    def _edge_changed(self, peer: Peer) -> None:
        """Forget what the cost of the edge to ``peer`` went into."""
        peer.edge_cost_ms = None
        if peer.stage == self._next_stage:  # the only edges the cheapest way on and a table use
            self._sink_cost_ms = None
            self._table_edges = None
        self.state_changed()

    def state_changed(self) -> None:
        """Work may now be due sooner (the node forgets its cached ``next_tick_s``)."""

    def edge_cost_ms(self, peer_id: str) -> float:
        """This node's estimate of d_ij to ``peer_id`` (inf for a peer it does not know)."""
        peer = self.peers.get(peer_id)
        if peer is None:
            return INF
        if peer.edge_cost_ms is not None:
            return peer.edge_cost_ms
        latency = self.config.default_latency_ms if peer.latency_ms is None else peer.latency_ms
        bandwidth = peer.bandwidth_gbps or self.config.default_bandwidth_gbps
        if peer.relayed:
            bandwidth *= self.config.relayed_bandwidth_share
            leg = peer.relay_leg_ms
            latency = relayed_latency_ms(
                latency, self.config.default_latency_ms if leg is None else leg
            )
        peer.edge_cost_ms = symmetric_edge_cost_ms(
            self.spec.compute_ms, peer.compute_ms, latency, bandwidth, self.config.activation_bytes
        )
        return peer.edge_cost_ms

    def _through_if_room_ms(self, peer: Peer) -> float:
        """What ``peer`` adds to the minimum in ``cost_to_sink_ms`` (inf without room)."""
        if peer.spare <= 0:
            return INF
        edge = peer.edge_cost_ms
        if edge is None:
            edge = self.edge_cost_ms(peer.peer_id)
        return edge + peer.cost_to_sink_ms

    def cost_through_ms(self, peer: Peer) -> float:
        edge = peer.edge_cost_ms
        if edge is None:
            edge = self.edge_cost_ms(peer.peer_id)
        return edge + peer.cost_to_sink_ms

    def edge_cost_to(self, peer: Peer) -> float:
        """``edge_cost_ms`` of a peer already in hand (its cached estimate, no table lookup)."""
        edge = peer.edge_cost_ms
        return self.edge_cost_ms(peer.peer_id) if edge is None else edge

    def cost_to_sink_ms(self) -> float:
        """The cheapest cost to a sink through next-stage peers with spare capacity."""
        if self.is_data:
            # A sink computes the head and loss of its flows one after another: charge the wait
            # its current flows impose, so equally cheap sinks share the flows (ours; the
            # paper's c_j is a measured time, which grows the same way with load).
            return self.spec.compute_ms * len(self.in_slots) / self.spec.capacity
        if self._sink_cost_ms is None:
            best = INF
            for peer in self.alive_peers(self._next_stage):
                cost = self._through_if_room_ms(peer)
                if cost < best:
                    best = cost
            self._sink_cost_ms = best
        return self._sink_cost_ms

    def choose_next_hop(self, out: OutSlot, now: float, exclude: str | None = None) -> str | None:
        """The next-stage peer for ``out``: spare capacity, minimal edge + advertised cost."""
        # Ties on cost go first to the peer this node already sends most flows to: flows that
        # share a node also share its next hop, so a pipeline's microbatches queue behind each
        # other in one place instead of crossing into every replica's queue (crossed flows made
        # one-region swarms ~10 % slower in the simulator), and a node keeps fewer links open.
        # Then to the peer with more spare capacity, then by id, for determinism.
        best: tuple[float, int, int, str] | None = None
        sharing: dict[str, int] = {}
        for other in self.out_slots.values():
            if other.next_hop is not None:
                sharing[other.next_hop] = sharing.get(other.next_hop, 0) + 1
        candidates = self.alive_peers(self.next_stage)
        penalties = self.hop_penalties_ms(candidates)  # like GPUs together (like_speed.py)
        for peer in candidates:
            if peer.spare <= 0 or peer.peer_id == exclude:
                continue
            if out.excluded_until_s.get(peer.peer_id, -INF) > now:
                continue
            if self.next_stage == 0 and peer.role != DATA:
                continue
            cost = self.cost_through_ms(peer) + penalties.get(peer.peer_id, 0.0)
            key = (round(cost, 6), -sharing.get(peer.peer_id, 0), -peer.spare, peer.peer_id)
            if cost < INF and (best is None or key < best):
                best = key
        return None if best is None else best[3]

    def hop_penalties_ms(self, candidates: list[Peer]) -> dict[str, float]:
        """Extra ms per next-stage peer for its speed gap to this node (``like_speed``)."""
        weight = self.config.like_speed_weight
        if weight <= 0:
            return {}
        return hop_penalties_ms(
            self.spec.compute_ms, ((p.peer_id, p.compute_ms) for p in candidates), weight
        )

    # ---- per-slot helpers -----------------------------------------------------------------------

    def path_of(self, out: OutSlot) -> tuple[str, ...]:
        """The flow's path from its source up to and including this node."""
        if out.in_key is None:
            return (self.node_id,)
        return (*self.in_slots[out.in_key].path, self.node_id)

    def prefix_of(self, out: OutSlot) -> float:
        """The flow's cost from its source up to this node."""
        return 0.0 if out.in_key is None else self.in_slots[out.in_key].prefix_cost_ms

    def route_slot(self, out: OutSlot, now: float) -> list[Outbound]:
        """Ask the best next-stage peer to carry ``out`` (if it needs a next hop and one exists)."""
        if out.state is not SlotState.UNMATCHED:
            return []
        target = self.choose_next_hop(out, now)
        if target is None:
            return []
        peer = self.peers[target]
        # optimistic, so one round does not send every request to one peer
        self.set_peer_view(peer, peer.spare - 1)
        out.state = SlotState.PENDING
        out.next_hop = target
        out.edge_ms = self.edge_cost_ms(target)
        request = FlowRequest(
            out.slot, out.flow_id, self.path_of(out), self.prefix_of(out) + out.edge_ms
        )
        return [Outbound(target, request)]

    def unmatch(self, out: OutSlot, now: float, exclude_s: float) -> list[Outbound]:
        """``out`` lost its next hop: forget it for a while, tell upstream, look for another."""
        if out.next_hop is not None and exclude_s > 0:
            out.excluded_until_s[out.next_hop] = now + exclude_s
        if out.is_carried:
            out.since_s = now
        out.state = SlotState.UNMATCHED
        out.next_hop = None
        out.suffix_cost_ms = INF
        out.edge_ms = INF
        out.pending_move = None
        return self.report_suffix(out) + self.route_slot(out, now)

    def finish_reroute(
        self, out: OutSlot, new_next: str, suffix_ms: float, now: float
    ) -> list[Outbound]:
        """The new hop of a reroute accepted: switch to it and release the old one."""
        self.pending_swaps.pop(out.slot, None)
        old_next = out.next_hop
        out.next_hop, out.suffix_cost_ms = new_next, suffix_ms
        out.edge_ms, out.state, out.pending_move = (
            self.edge_cost_ms(new_next),
            SlotState.MATCHED,
            None,
        )
        out.since_s = now
        sends = [] if old_next is None else [Outbound(old_next, FlowCancel(out.slot))]
        return sends + self.report_suffix(out)

    def report_suffix(self, out: OutSlot) -> list[Outbound]:
        """Tell the upstream peer this node's cost to a sink for ``out``'s flow, if it changed."""
        if out.in_key is None:
            return []
        inflow = self.in_slots[out.in_key]
        cost = out.edge_ms + out.suffix_cost_ms if out.is_carried else INF
        if (
            abs(cost - inflow.reported_suffix_ms) <= _COST_EPSILON_MS
            or cost == inflow.reported_suffix_ms
        ):
            return []
        inflow.reported_suffix_ms = cost
        return [Outbound(inflow.upstream, FlowCost(inflow.upstream_slot, cost))]

    def announce_path(self, inflow: InSlot) -> list[Outbound]:
        """Pass a changed prefix on: downstream for a relay, to the source for a sink."""
        if self.is_data:
            return self.report_path(inflow)
        assert inflow.out_slot is not None
        out = self.out_slots[inflow.out_slot]
        if not out.is_carried or out.next_hop is None:
            return []
        out.edge_ms = self.edge_cost_ms(out.next_hop)
        update = PathUpdate(
            out.slot, out.flow_id, self.path_of(out), inflow.prefix_cost_ms + out.edge_ms
        )
        return [Outbound(out.next_hop, update)]

    def report_path(self, inflow: InSlot) -> list[Outbound]:
        path = (*inflow.path, self.node_id)
        source = path[0]
        if source == self.node_id:
            self.flow_reports[inflow.flow_id] = (path, inflow.prefix_cost_ms)
            return []
        return [Outbound(source, PathReport(inflow.flow_id, path, inflow.prefix_cost_ms))]

    def drop_in_slot(self, key: InKey) -> list[Outbound]:
        """Release the flow in ``key`` and cancel what this node sent onwards for it."""
        inflow = self.in_slots.pop(key, None)
        if inflow is None or inflow.out_slot is None:
            return []
        out = self.out_slots.pop(inflow.out_slot)
        if out.next_hop is not None and out.state is not SlotState.UNMATCHED:
            return [Outbound(out.next_hop, FlowCancel(out.slot))]
        return []
