"""GWTF as a simulator routing policy: the pure flow core, run once per simulated node.

Each live node owns a ``FlowNode``; the engine's ticks, control messages and deadlines drive it,
exactly as the live node's libp2p service will. The data plane is the thin part here: a
microbatch injected at a data node takes one of its carried flows (one microbatch per flow at a
time), and each relay forwards it along the flow it arrived on (``FlowNode.route``). When a flow
is being rebuilt, a relay sends the microbatch to its best next-stage peer instead of stalling.
A missed forward ack declares the suspect dead to the sender's core and re-sends to another
replica; a missed backward ack makes the stalled node ask the hop before the dead one to re-send
its output to a stand-in, repairing only the dead hop.
The policy learns what the live node would: a joiner places itself by what a sample of members
say of themselves (a member quiet for a reconciliation period, as a crashed one is, does not
answer), discovery ranks candidates by the latency a ping measures (ties at random), a link's
latency is measured on first contact and its bandwidth on the first activation sent over it, and
a backward repair goes, as the live sender's does, to a random live replica of the dead hop's
stage in the stalled node's own table. Two shortcuts are left: the relays present at the start
are placed by one greedy over all of them (``place_relays``; the live relays of a new run each
ask as joiners), and a microbatch is never sent to a peer that moved stage (the live receiver
refuses it and the sender re-routes). ``GwtfPolicy(oracles=True)`` (algorithm ``gwtf-oracles``)
is the ablation that reads the world instead: every node's state when a joiner places itself,
the true edge cost at discovery and first contact, and a repair by the upstream's best next hop
with the dead hop marked in its core.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import ClassVar

from gwtf.coordinator_free.decisions import (
    Detours,
    Onward,
    choose_flow,
    hop_view,
    keep_waiting,
    lent_flow,
    next_hop,
    own_flow,
    plan_hop_repair,
    replicas,
    stand_in,
    take_back_loans,
)
from gwtf.coordinator_free.placement import choose_bottleneck, place_relays, slots_per_s
from gwtf.coordinator_free.protocol import DATA, FlowConfig, FlowNode, NodeSpec, Outbound
from gwtf.coordinator_free.protocol.state import Peer, SlotState
from gwtf.coordinator_free.sim.policy import (
    Action,
    Forward,
    Hold,
    HopDecision,
    HopReport,
    MicrobatchView,
    PolicyDefaults,
    PolicyTiming,
    RepairDecision,
    Replace,
    Restart,
    Retry,
    Send,
    Wake,
    WorldView,
)
from gwtf.coordinator_free.wire import FIXED_SIZES, FlowLoanReturn, FlowWanted, encoded_size

#: Ours: a lookup returns this many candidates per neighbour wanted, of which the cheapest are kept.
_CANDIDATES_PER_QUOTA = 4
#: Ours: decision periods between two lookups of a node that knows no live next-stage peer.
_REDISCOVERY_PERIODS = 5
#: Members a joiner asks for their load (the live node's ``join_placement.MAX_ASKED``).
_JOIN_ASKED = 32
#: Encoded sizes of the message types whose size never varies (most control messages).
_FIXED_SIZES = FIXED_SIZES
#: What a data node hears that may let it lend an idle flow.
_LENDING_NEWS = (FlowWanted, FlowLoanReturn)
#: A tick this close before the time the core names is not stale (grid rounding).
_STALE_TICK_SLACK_S = 1e-6


class GwtfPolicy(PolicyDefaults):
    """The coordinator-free flow protocol of GWTF (arXiv 2509.21221) in the simulator."""

    name: ClassVar[str] = "gwtf"

    def __init__(
        self,
        neighbours_per_stage: int = 8,
        seed_offset: int = 0,
        slot_speed_scale: float | None = None,
        oracles: bool = False,
    ) -> None:
        #: The ablation that reads the world where the live node would ask or measure.
        self.oracles = oracles
        self._neighbours_per_stage = neighbours_per_stage
        self._slot_speed_scale = slot_speed_scale  # None: FlowConfig's default
        self._seed_offset = seed_offset
        self._config: FlowConfig | None = None
        self._rng = random.Random(seed_offset)
        #: A joiner's sample of members to ask: its own stream, so that GWTF and the oracle
        #: ablation draw every other choice alike.
        self._join_rng = random.Random(seed_offset)
        self._nodes: dict[str, FlowNode] = {}
        self._last_tick_s: dict[str, float] = {}
        self._wake_asked_s: dict[str, float] = {}  # node -> the tick it asked the engine for
        #: Ticks that found the core's work moved later and were only re-requested.
        self.stale_ticks = 0
        #: Microbatches a data node put on a flow a data peer lent it.
        self.borrowed_flow_injections = 0
        #: Times a data node took back its lent slots (``decisions.take_back_loans``).
        self.loans_recalled = 0
        # Ticking every period (a reference run) calls the core on every tick, idle or not.
        self._skips_stale_ticks = self.timing().ticks_on_request
        self._boots: dict[str, int] = {}
        self._rediscovered_s: dict[str, float] = {}
        self._hop_slot: dict[int, tuple[str, int]] = {}  # mb -> (sender, sender's slot)
        self._source_slot: dict[int, tuple[str, int]] = {}  # mb -> (origin, source slot)
        self._busy: dict[tuple[str, int], int] = {}  # (slot's owner, source slot) -> mb
        self._waiting: dict[str, set[int]] = {}  # data node -> its mbs waiting for a flow
        #: mb -> (when a re-sent forward or a repaired hop left, watchdog periods waited on it)
        self._recovery: dict[int, tuple[float, int]] = {}
        self._waiting_since: dict[int, float] = {}  # mb -> when it first waited for a flow
        self._topology_cost: dict[tuple[str, float, str, float], float] = {}
        #: Each node's forwards in flight off a flow, by microbatch (``decisions.Detours``), and
        #: the nodes holding one of each microbatch: as the live sender, a detour counts from
        #: its send until its ack, its forward deadline or the microbatch is given up.
        self._detours: dict[str, Detours] = {}
        self._detouring: dict[int, set[str]] = {}

    @property
    def flow_nodes(self) -> Mapping[str, FlowNode]:
        """Each node's protocol core by id, read-only: to inspect, not to drive."""
        return MappingProxyType(self._nodes)

    def timing(self) -> PolicyTiming:
        config = self._flow_config_defaults()
        return PolicyTiming(
            forward_timeout_s=config.ack_deadline_s,
            backward_timeout_s=config.ack_deadline_s,
            tick_period_s=config.decision_period_s,
            ticks_on_request=True,
        )

    # ---- membership ----

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        self._rng = random.Random(rng.random() + self._seed_offset)
        self._join_rng = random.Random(self._rng.random())
        placed = []
        newcomers = []
        for node_id in world.known_nodes():
            spec, stage = world.spec(node_id), world.stage_of(node_id)
            if spec.role != "relay":
                continue
            compute_ms = world.compute_ms(node_id)
            if stage is None:
                newcomers.append((node_id, spec.capacity, compute_ms))
            else:
                placed.append((stage, 0, spec.capacity, compute_ms))
        newcomers.sort(key=lambda item: (-slots_per_s(item[1], item[2]), item[0]))
        demand = sum(world.spec(d).capacity for d in world.data_nodes())
        return place_relays(world.stages, placed, newcomers, demand)

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        # The joiner asks members what they hold (a sample, as the live node asks at most
        # ``_JOIN_ASKED``); those that stopped ticking (crashed) do not answer. A live node ticks
        # at least once per reconciliation period. The oracle asks every node it ever met.
        if self.oracles:
            asked = [n for n in self._nodes if n != node_id]
        else:
            members = [
                n for s in range(world.stages + 1) for n in world.nodes_in_stage(s) if n != node_id
            ]
            asked = self._join_rng.sample(members, min(len(members), _JOIN_ASKED))
        answers = []
        demand = 0
        for other_id in asked:
            node = self._nodes.get(other_id)
            if node is None or node.left:
                continue
            quiet_s = (node.config.reconcile_periods + 1) * node.period_s
            if now - self._last_tick_s.get(other_id, -1e9) > quiet_s:
                continue
            hello = node.hello()
            if node.is_data:
                demand += hello.capacity
            else:
                answers.append((hello.stage, hello.capacity, hello.compute_ms))
        if self.oracles:  # (a live joiner that hears no data node counts every slot: 0)
            demand = sum(world.spec(d).capacity for d in world.data_nodes())
        return choose_bottleneck(world.stages, answers, demand).stage

    def on_node_up(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        config = self._flow_config(world)
        profile = world.spec(node_id)
        stage = world.stage_of(node_id) or 0
        self._boots[node_id] = self._boots.get(node_id, -1) + 1
        node = FlowNode(
            NodeSpec(node_id, profile.role, stage, profile.capacity, world.compute_ms(node_id)),
            config,
            random.Random(f"{self._rng.random()}:{node_id}"),
            boot_id=self._boots[node_id],
        )
        self._nodes[node_id] = node
        self._detours[node_id] = Detours()  # a node that came back has none in flight
        self._last_tick_s[node_id] = now
        self._wake_asked_s.pop(node_id, None)  # the engine ticks a new node first by itself
        sends: list[Outbound] = []
        for peer_id in self._discover(world, node):
            sends += node.introduce(peer_id)
        return self._sends(node_id, sends)

    def _discover(self, world: WorldView, node: FlowNode) -> list[str]:
        """Neighbours a node finds (a DHT lookup would): per stage, the cheapest half of its
        quota by the topology, and a random rest so the graph stays connected.

        In a large stage the cheapest are picked from a random sample of candidates (what a
        lookup returns and the node then measures), not from the whole stage: if every node
        picked the globally cheapest peers, those few would fill their bounded tables at once
        and turn the later introductions away, leaving some nodes with no next hop at all.
        """
        found: list[str] = []
        quota = self._neighbours_per_stage
        stages = {node.previous_stage, node.spec.stage, node.next_stage}
        for stage in sorted(stages):
            members = [m for m in world.nodes_in_stage(stage) if m != node.node_id]
            members = [m for m in members if m in self._nodes and not self._nodes[m].left]
            pool = _CANDIDATES_PER_QUOTA * quota
            if len(members) > pool:
                members = self._rng.sample(members, pool)
            # Ties (a region of equal latencies) go at random, not to the lowest ids for all.
            self._rng.shuffle(members)
            by_cost = sorted(members, key=lambda m: self._topology_cost_ms(world, node, m))
            chosen = by_cost[: quota // 2]
            rest = by_cost[quota // 2 :]
            chosen += self._rng.sample(rest, min(len(rest), quota - len(chosen)))
            found += chosen
        return found

    def _topology_cost_ms(self, world: WorldView, node: FlowNode, peer_id: str) -> float:
        """How a node ranks a candidate it found: the latency a ping measures; the oracle takes
        the true d_ij (compute and bandwidth included), cached by (region, speed) of both ends."""
        if not self.oracles:
            return world.latency_ms(node.node_id, peer_id)
        mine, theirs = world.spec(node.node_id), world.spec(peer_id)
        key = (mine.region, mine.speed, theirs.region, theirs.speed)
        cost = self._topology_cost.get(key)
        if cost is None:
            cost = self._topology_cost[key] = world.edge_cost_ms(node.node_id, peer_id)
        return cost

    # ---- control plane ----

    def on_message(
        self, world: WorldView, src: str, dst: str, payload: object, now: float
    ) -> Sequence[Action]:
        node = self._nodes.get(dst)
        if node is None:
            return ()
        sends = node.handle(src, payload, now)  # type: ignore[arg-type]
        if node.is_data and type(payload) in _LENDING_NEWS:
            sends += self._lend_idle(node)
        # The first message from a peer measures the link's latency (as the live node times its
        # requests); its bandwidth is timed on the first activation sent over it
        # (``on_hop_acked``). The oracle knows both at first contact.
        peer = node.peers.get(src)
        if peer is not None and peer.latency_ms is None:
            bandwidth = world.bandwidth_gbps(src, dst) if self.oracles else None
            node.observe_link(src, world.latency_ms(src, dst), bandwidth)
        actions = self._sends(dst, sends)
        wake = self._wake_action(world, node, now)
        if wake is not None:
            actions.append(wake)
        return actions

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        node = self._nodes.get(node_id)
        if node is None:
            return ()
        self._last_tick_s[node_id] = now
        self._wake_asked_s.pop(node_id, None)  # this tick was the one asked for
        if self._skips_stale_ticks and self._is_stale(world, node, now):
            # Work moved later since this tick was asked for (a flow was accepted, a table
            # answered): the core would do nothing now, so only ask again for the new time.
            self.stale_ticks += 1
            return self._wake(world, node, now)
        sends = node.tick(now)
        if self._may_rediscover(node, now) and self._stuck(world, node):
            sends += self._rediscover(world, node, now)
        actions = self._sends(node_id, sends)
        wake = self._wake_action(world, node, now)
        if wake is not None:
            actions.append(wake)
        return actions

    def _is_stale(self, world: WorldView, node: FlowNode, now: float) -> bool:
        """Whether the core has nothing to do now. The time it keeps may be early (it keeps it
        across news that can only delay work), so one that says "now" is asked afresh: that
        costs less than a round that finds nothing to do."""
        if not self._next_hops(world, node):
            return False  # it must look up peers (``_rediscover``)
        if node.next_tick_s(now) > now + _STALE_TICK_SLACK_S:
            return True
        node.state_changed()
        return node.next_tick_s(now) > now + _STALE_TICK_SLACK_S

    def _wake(self, world: WorldView, node: FlowNode, now: float) -> list[Action]:
        wake = self._wake_action(world, node, now)
        return [] if wake is None else [wake]

    def _wake_action(self, world: WorldView, node: FlowNode, now: float) -> Wake | None:
        """Ask the engine to tick ``node`` when its core next has work (a later time postpones);
        None when that is the time already asked for."""
        node_id = node.spec.node_id
        asked_s = self._wake_asked_s.get(node_id)
        wake_s = node.next_tick_s(now)
        if not self._next_hops(world, node):  # it must look up peers (``_rediscover``)
            wake_s = now
        if asked_s == wake_s:
            return None
        self._wake_asked_s[node_id] = wake_s
        # A later time postpones the tick asked for: the work it was for moved later.
        return Wake(node_id, wake_s, postpone=asked_s is not None and wake_s > asked_s)

    def _may_rediscover(self, node: FlowNode, now: float) -> bool:
        last_s = self._rediscovered_s.get(node.node_id, -math.inf)
        return now - last_s >= _REDISCOVERY_PERIODS * node.period_s

    def _stuck(self, world: WorldView, node: FlowNode) -> bool:
        """Whether ``node`` needs more next-stage peers: it knows no live one (those that came
        back at another stage do not count), or it has a flow to send on and every one it knows
        is full (slow relays offer fewer slots, so the few a node met first may all be taken)."""
        peers = self._next_hops(world, node)
        if not peers:
            return True
        if any(peer.spare > 0 for peer in peers):
            return False
        return any(out.state is SlotState.UNMATCHED for out in node.out_slots.values())

    def _rediscover(self, world: WorldView, node: FlowNode, now: float) -> list[Outbound]:
        """A node that is stuck (``_stuck``) looks up more next-stage peers (another DHT lookup
        would), at most once per ``_REDISCOVERY_PERIODS``: without them it carries no flow."""
        self._rediscovered_s[node.node_id] = now
        members = [
            m
            for m in world.nodes_in_stage(node.next_stage)
            if m in self._nodes and not self._nodes[m].left and m not in node.peers
        ]
        if node.next_stage == 0:
            members = [m for m in members if self._nodes[m].is_data]
        chosen = self._rng.sample(members, min(len(members), self._neighbours_per_stage))
        sends: list[Outbound] = []
        for peer_id in chosen:
            sends += node.introduce(peer_id)
        return sends

    def _sends(self, sender: str, sends: list[Outbound]) -> list[Action]:
        """One ``Send`` of the core's messages, sized as encoded (none when there are none)."""
        if not sends:
            return []
        messages: list[tuple[str, object, int]] = []
        last: object = None
        size = 0
        for outbound in sends:
            message = outbound.message
            if message is not last:  # an advert goes to many peers as one object
                last = message
                size = _FIXED_SIZES.get(type(message)) or encoded_size(message)
            messages.append((outbound.to, message, size))
        return [Send(sender, messages)]

    # ---- data plane ----

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        node = self._nodes[node_id]
        if node.is_data:
            return self._inject(world, node, mb, now)
        header = self._hop_slot.get(mb.mb_id)
        route = None if header is None else node.route(*header)
        onward = self._onward(world, node, mb, self._usable(world, node, route))
        if onward is None:  # it knows no next-stage peer at all: holding would never end
            self._forget(mb.mb_id, keep_flow=True)
            return Restart()
        self._sent_off(node, mb.mb_id, onward)
        # Off a flow (-1) until the next hop: it routes the microbatch by its own view.
        self._hop_slot[mb.mb_id] = (node_id, -1 if onward.slot is None else onward.slot)
        return Forward(onward.to)

    def _onward(
        self,
        world: WorldView,
        node: FlowNode,
        mb: MicrobatchView,
        route: tuple[str, int] | None,
        exclude: tuple[str, ...] = (),
    ) -> Onward | None:
        """Where ``node`` sends ``mb``'s forward (``decisions.next_hop``), first send or
        re-send: past the last stage its origin, else ``route`` (the flow's, usable), else the
        ranked best peer that still announces the next stage."""
        keep = self._at_next_stage(world, node)
        view = hop_view(node, route, keep, self._detours[node.node_id], mb.origin)
        return next_hop(view, exclude)

    def _usable(
        self, world: WorldView, node: FlowNode, route: tuple[str, int] | None
    ) -> tuple[str, int] | None:
        """``route``, unless its hop moved stage: the live receiver would refuse the microbatch."""
        if route is not None and world.stage_of(route[0]) != node.next_stage:
            return None
        return route

    def _sent_off(self, node: FlowNode, mb_id: int, onward: Onward) -> None:
        """Count a send off the flow as a detour in flight (as live, the origin's is none)."""
        if onward.slot is None and node.next_stage != 0:
            self._detour(node.node_id, mb_id, onward.to)

    def _inject(
        self, world: WorldView, node: FlowNode, mb: MicrobatchView, now: float
    ) -> HopDecision:
        decision = self._inject_on_flow(world, node, mb, now)
        waiting = self._waiting.setdefault(node.node_id, set())
        if isinstance(decision, Hold) and mb.mb_id not in self._source_slot:
            waiting.add(mb.mb_id)  # held for want of a flow
        else:
            waiting.discard(mb.mb_id)
        sends = node.announce_waiting(len(waiting))
        if not waiting:
            sends += self._return_idle_loans(node)
        if not sends:
            return decision
        actions = tuple(self._sends(node.node_id, sends))
        if isinstance(decision, Forward):
            return Forward(decision.to, decision.actions + actions)
        return Hold(actions)

    def _inject_on_flow(
        self, world: WorldView, node: FlowNode, mb: MicrobatchView, now: float
    ) -> HopDecision:
        """As the live data node: the microbatch takes a free flow (``decisions.choose_flow``),
        held while none is; its first hop is ``decisions.next_hop`` on that flow's route as it
        stands (off any flow when it has none), held, the flow kept, while no stage-1 peer is
        known."""
        held = self._source_slot.get(mb.mb_id)
        if held is None:
            waited = (now - self._waiting_since.setdefault(mb.mb_id, now)) / node.period_s
            if take_back_loans(waited) and node.lent_slots:  # as live: a loan lost track of
                node.recall_loans()
                self.loans_recalled += 1
            held = self._free_flow(node, self._carried(world, node), waited)
            if held is None:
                return Hold()
            self._waiting_since.pop(mb.mb_id, None)
            self._source_slot[mb.mb_id] = held
            self._busy[held] = mb.mb_id
            self.borrowed_flow_injections += held[0] != node.node_id
        route = self._usable(world, node, self._source_route(node, held))
        onward = self._onward(world, node, mb, route)
        if onward is None:
            return Hold()
        self._sent_off(node, mb.mb_id, onward)
        self._hop_slot[mb.mb_id] = held
        return Forward(onward.to)

    @staticmethod
    def _carried(world: WorldView, node: FlowNode) -> dict[tuple[str, int], str | None]:
        """A data node's flows, busy or not, by key: each own slot not lent (the flow's id, None
        while not carried) and each loan; a flow whose first hop came back at another stage is
        not usable until its introduction lands, so it does not count as carried."""
        stage = node.next_stage
        source = node.source_routes()
        flows: dict[tuple[str, int], str | None] = {}
        for slot in node.out_slots:
            if not node.is_lent(slot):
                routed = source.get(slot)
                usable = routed is not None and world.stage_of(routed[1]) == stage
                flows[(node.node_id, slot)] = routed[0] if usable and routed else None
        for key, first_hop in node.borrowed.items():
            if world.stage_of(first_hop) == stage:
                flows[key] = first_hop
        return flows

    def _free_flow(
        self, node: FlowNode, flows: dict[tuple[str, int], str | None], waited_periods: float
    ) -> tuple[str, int] | None:
        """The flow a data node's next microbatch takes (``decisions.choose_flow``) among its
        ``flows`` (``_carried``) not busy; None: it waits."""
        me, busy = node.node_id, self._busy
        free = []
        for key, of in flows.items():
            if key in busy:
                continue
            if key[0] == me:
                free.append(own_flow(node, key[1], of))
            elif of is not None:
                free.append(lent_flow(node, key[0], key[1], of))
        carries_none = all(of is None for of in flows.values())
        return choose_flow(free, carries_none, waited_periods)

    def _release(self, mb_id: int) -> None:
        held = self._source_slot.pop(mb_id, None)
        if held is not None and self._busy.get(held) == mb_id:
            del self._busy[held]

    def _lend_idle(self, node: FlowNode) -> list[Outbound]:
        """A data node with nothing waiting lends its idle flows to data peers that wait."""
        if self._waiting.get(node.node_id) or not node.waiting_peers:
            return []
        idle = [s for s in node.source_routes() if (node.node_id, s) not in self._busy]
        return node.lend_idle(idle)

    def _return_idle_loans(self, node: FlowNode) -> list[Outbound]:
        sends: list[Outbound] = []
        for lender, slot in [k for k in node.borrowed if k not in self._busy]:
            sends += node.return_loan(lender, slot)
        return sends

    @staticmethod
    def _at_next_stage(world: WorldView, node: FlowNode) -> Callable[[str], bool]:
        """Whether a peer still announces ``node``'s next stage. The core keeps a peer that came
        back at another stage until it introduces itself anew; the live receiver would refuse a
        microbatch, and the sender drop the peer from its view of that stage."""
        stage = node.next_stage
        return lambda peer_id: world.stage_of(peer_id) == stage

    @staticmethod
    def _next_hops(world: WorldView, node: FlowNode) -> list[Peer]:
        """The next-stage peers ``node`` believes alive that still announce that stage (data
        nodes only after the last stage)."""
        stage = node.next_stage
        peers = [p for p in node.alive_peers(stage) if world.stage_of(p.peer_id) == stage]
        return [p for p in peers if p.role == DATA] if stage == 0 else peers

    def _best_next(self, world: WorldView, node: FlowNode, exclude: str | None) -> str | None:
        """The next-stage peer ``node`` sends a forward to off any flow (``decisions.next_hop``)."""
        view = hop_view(node, None, self._at_next_stage(world, node), self._detours[node.node_id])
        onward = next_hop(view, () if exclude is None else (exclude,))
        return None if onward is None else onward.to

    def _detour(self, node_id: str, mb_id: int, to: str) -> None:
        """``node_id`` sends ``mb_id``'s forward off a flow to ``to``: in flight until acked."""
        self._detours[node_id].sent(mb_id, to)
        self._detouring.setdefault(mb_id, set()).add(node_id)

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Action]:
        node = self._nodes.get(report.sender)
        if node is None:
            return ()
        node.heard_from(report.receiver, now)  # an acknowledgement proves the receiver alive
        if report.direction == "forward":
            self._detours[report.sender].ended(report.mb_id, report.receiver)
        peer = node.peers.get(report.receiver)
        if peer is not None and peer.bandwidth_gbps is None:
            # The sender timed the upload of the first activation it sent over this link.
            latency = world.latency_ms(report.sender, report.receiver)
            bandwidth = world.bandwidth_gbps(report.sender, report.receiver)
            node.observe_link(report.receiver, latency, bandwidth)
            return self._wake(world, node, now)  # the link's cost changed: its core may have work
        return ()

    def on_microbatch_done(
        self, world: WorldView, mb: MicrobatchView, now: float
    ) -> Sequence[Action]:
        held = self._source_slot.get(mb.mb_id)
        self._forget(mb.mb_id)
        origin = self._nodes.get(mb.origin)
        if origin is None:
            return (Retry(mb.origin),)
        # A freed flow goes to the origin's next waiting microbatch (the retry); with none
        # waiting, a borrowed one goes back and an own one may be lent.
        if held is not None and held[0] != mb.origin:
            sends = [] if self._waiting.get(mb.origin) else origin.return_loan(*held)
        else:
            sends = self._lend_idle(origin)
        return (Retry(mb.origin), *self._sends(mb.origin, sends))

    # ---- failures ----

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        node = self._nodes[node_id]
        self._detours[node_id].ended(mb.mb_id, suspect)  # as the live send that failed
        actions = self._sends(node_id, node.peer_dead(suspect, now)) + self._wake(world, node, now)
        if mb.stage != node.spec.stage:
            # The microbatch already moved past the suspect (its ack was lost with it): the
            # engine would route from the microbatch's stage, not ours, so start it over.
            self._forget(mb.mb_id, keep_flow=True)
            return Restart(tuple(actions))
        # One rule at a relay and a data node alike: the flow's route as it stands, else the
        # ranked best peer, the suspect left out. A data node keeps the microbatch's flow (busy,
        # and named by the hop) as live: moving it to another free flow would leave a flow busy
        # for nothing, and live the hop is already on its way under the flow's slot.
        header = self._hop_slot.get(mb.mb_id)
        if header is None:
            route = None
        elif node.is_data:
            route = self._source_route(node, header)
        else:
            route = node.route(*header)
        onward = self._onward(world, node, mb, self._usable(world, node, route), (suspect,))
        if onward is None:
            if node.is_data:  # asked again once a next-stage peer is known
                return Hold(tuple(actions))
            # Only the origin computes its loss; or no next-stage peer is known.
            self._forget(mb.mb_id, keep_flow=True)
            return Restart(tuple(actions))
        self._sent_off(node, mb.mb_id, onward)
        if not node.is_data:
            self._hop_slot[mb.mb_id] = (node_id, -1 if onward.slot is None else onward.slot)
        self._recovered(mb.mb_id, now)
        return Forward(onward.to, tuple(actions))

    @staticmethod
    def _source_route(node: FlowNode, held: tuple[str, int]) -> tuple[str, int] | None:
        """The first hop and slot of a data node's flow ``held`` (its own slot or a loan; slot
        -1: none) as it stands now, None when the flow has no route."""
        owner, slot = held
        if slot < 0:
            return None
        if owner == node.node_id:
            routed = node.source_routes().get(slot)
            first_hop = None if routed is None else routed[1]
        else:
            first_hop = node.borrowed.get(held)
        return None if first_hop is None else (first_hop, slot)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        stage = mb.stage - 1
        path = (mb.origin, *(hop or "" for hop in mb.path), mb.sink or "")
        upstream_id = path[stage - 1]
        node = self._nodes[node_id]
        actions = self._sends(node_id, node.peer_dead(suspect, now)) + self._wake(world, node, now)
        upstream = self._nodes.get(upstream_id)
        if upstream is None:
            return Restart(tuple(actions))
        if self.oracles:  # the upstream core is told the hop died (it learns it by keep-alive)
            actions += self._sends(upstream_id, upstream.peer_dead(suspect, now))
            actions += self._wake(world, upstream, now)

        def replacement(wanted: int, dead: str) -> str | None:
            if upstream.next_stage != wanted:  # it moved stage since it sent this microbatch
                return None
            if self.oracles:  # the upstream's best next hop, read from its core
                return self._best_next(world, upstream, dead)

            # As the live sender (``HopSender._around``): a live replica of the dead hop's stage
            # from the stalled node's own table, at random.
            def at_stage(peer_id: str) -> bool:
                return world.stage_of(peer_id) == wanted

            return stand_in(replicas(node, wanted, at_stage), (dead,), node.rng)

        repair = plan_hop_repair(path, stage, replacement)
        if repair is None:
            return Restart(tuple(actions))
        delay_s = self._repair_delay_s(world, node_id, mb, upstream_id)
        self._recovered(mb.mb_id, now + delay_s)
        return Replace(stage, repair.replacement, delay_s, tuple(actions))

    @staticmethod
    def _repair_delay_s(
        world: WorldView, node_id: str, mb: MicrobatchView, upstream_id: str
    ) -> float:
        """From a missed backward ack to the re-send of the dead hop's input: as the live sender
        (``HopSender._around``), the stalled node asks the hop before the dead one itself."""
        return world.latency_ms(node_id, upstream_id) / 1000.0

    def _recovered(self, mb_id: int, sent_s: float) -> None:
        """A recovery sends a hop of ``mb_id`` at ``sent_s`` (a re-sent forward, a repair)."""
        self._recovery[mb_id] = (sent_s, self._recovery.get(mb_id, (0.0, 0))[1])

    def on_stall(self, world: WorldView, mb: MicrobatchView, now: float) -> RepairDecision:
        """Wait one more watchdog period (the live data node's stall deadline) while a hop that
        a recovery sent is still within its ack deadline (``decisions.keep_waiting``); else
        start it over."""
        sent_s, holds = self._recovery.get(mb.mb_id, (-math.inf, 0))
        progress = now - sent_s < self.timing().forward_timeout_s
        if keep_waiting(holds + 1, progress):  # this watchdog period is deadline holds + 1
            self._recovery[mb.mb_id] = (sent_s, holds + 1)
            return Hold()
        self._forget(mb.mb_id, keep_flow=True)
        return Restart()

    def _forget(self, mb_id: int, keep_flow: bool = False) -> None:
        """Drop what is kept of ``mb_id``'s try; ``keep_flow``: it starts over, and as live
        (the data node retries it on its flow) keeps its flow."""
        self._recovery.pop(mb_id, None)
        self._waiting_since.pop(mb_id, None)
        for waiting in self._waiting.values():
            waiting.discard(mb_id)
        self._hop_slot.pop(mb_id, None)
        if not keep_flow:
            self._release(mb_id)
        for node_id in self._detouring.pop(mb_id, ()):
            self._detours[node_id].ended(mb_id)

    # ---- config ----

    def _flow_config_defaults(self) -> FlowConfig:
        return FlowConfig(stages=1, activation_bytes=1.0)

    def _flow_config(self, world: WorldView) -> FlowConfig:
        if self._config is None:
            self._config = FlowConfig(
                stages=world.stages,
                activation_bytes=float(world.activation_bytes),
                max_peers_per_stage=max(self._neighbours_per_stage * 2, 4),
            )
            if self._slot_speed_scale is not None:
                self._config = replace(self._config, slot_speed_scale=self._slot_speed_scale)
        return self._config


__all__ = ["GwtfPolicy"]
