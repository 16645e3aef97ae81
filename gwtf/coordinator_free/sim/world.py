"""The simulated world's state (nodes, links, stages, occupancy) and the view policies read.

``World`` is mutated only by the engine. It implements ``policy.WorldView``; the engine hands the
same object to every callback, and ``is_alive`` is refused to policies without full knowledge.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gwtf.coordinator_free.cost import EdgeInputs, edge_cost_ms
from gwtf.coordinator_free.protocol.config import DATA_STAGE
from gwtf.coordinator_free.sim.policy import NodeProfile, PolicyContractError
from gwtf.coordinator_free.sim.scenario import Scenario

BITS_PER_BYTE = 8.0
_BITS_PER_GBIT = 1e9
#: One membership view for every algorithm, as a DHT gives it: a live node announces itself
#: every ``ANNOUNCE_PERIOD_S`` and a record expires ``MEMBERSHIP_EXPIRY_S`` after the last
#: announcement, so a dead node leaves ``nodes_in_stage`` that long after it last announced.
#: The live node's discovery cards: announced every 60 s, stale after 180 s
#: (``gwtf/node/runtime/discovery/run_discovery.py``). SWARM's release announces every 30 s with a
#: 300 s expiry (``swarm/pipeline/src/moe/server/dht_handler.py``); one rule for all is fairer
#: than each algorithm's own.
ANNOUNCE_PERIOD_S = 60.0
MEMBERSHIP_EXPIRY_S = 180.0


@dataclass(slots=True)
class NodeState:
    """One node's mutable state as the engine tracks it."""

    spec: NodeProfile
    region_index: int
    stage: int | None
    alive: bool = False
    known: bool = False
    #: When the node last came up, and when it last went down (None while it never did).
    up_since_s: float = 0.0
    down_at_s: float | None = None
    incarnation: int = 0
    ready_at_s: float = 0.0
    compute_free_at_s: float = 0.0
    nic_free_at_s: float = 0.0
    #: (start_s, end_s, task kind) of compute tasks queued on this node, in FIFO order.
    tasks: deque[tuple[float, float, int]] = field(default_factory=deque)
    held: set[int] = field(default_factory=set)
    #: forwards that arrived while the node was full: (mb_id, version, sender), FIFO.
    waiting: deque[tuple[int, int, str]] = field(default_factory=deque)


class World:
    """Static facts of a scenario plus the live node table; implements ``WorldView``."""

    def __init__(self, scenario: Scenario, full_knowledge: bool) -> None:
        self.scenario = scenario
        self._full_knowledge = full_knowledge
        self._latency_ms = scenario.topology.latency_ms
        self._bandwidth_gbps = scenario.topology.bandwidth_gbps
        #: Per pair of regions, the terms of a control message's delay (``region_delay_s``),
        #: computed once: every message reads them.
        self.latency_s_by_region = [[ms / 1000.0 for ms in row] for row in self._latency_ms]
        self.bits_per_s_by_region = [
            [gbps * _BITS_PER_GBIT for gbps in row] for row in self._bandwidth_gbps
        ]
        region_index = {r: i for i, r in enumerate(scenario.topology.regions)}
        self.nodes: dict[str, NodeState] = {}
        for entry in scenario.nodes:
            spec = NodeProfile(entry.id, entry.role, entry.region, entry.speed, entry.capacity)
            stage = DATA_STAGE if entry.role == "data" else entry.stage
            self.nodes[entry.id] = NodeState(spec, region_index[entry.region], stage)
        self._known_order: list[str] = []
        self._data_nodes = [e.id for e in scenario.nodes if e.role == "data"]
        self._stage_members: dict[int, list[str]] = {}
        self._compute_ms = {e.id: scenario.model.stage_compute_ms / e.speed for e in scenario.nodes}
        self.current_iteration = 0
        #: The engine's clock, set before each event (``is_ready`` reads it).
        self.now_s = 0.0

    # ---- WorldView ----

    @property
    def stages(self) -> int:
        return self.scenario.model.stages

    @property
    def activation_bytes(self) -> int:
        return self.scenario.model.activation_bytes

    @property
    def stage_param_bytes(self) -> int:
        return self.scenario.model.stage_param_bytes

    @property
    def iteration(self) -> int:
        return self.current_iteration

    def known_nodes(self) -> Sequence[str]:
        return tuple(self._known_order)

    def spec(self, node_id: str) -> NodeProfile:
        return self._node(node_id).spec

    def stage_of(self, node_id: str) -> int | None:
        return self._node(node_id).stage

    def nodes_in_stage(self, stage: int) -> Sequence[str]:
        if stage == DATA_STAGE:
            return self.data_nodes()
        now = self.now_s
        return tuple(
            n
            for n in self._stage_members.get(stage, ())
            if self.nodes[n].alive or now - self.announced_at(n) <= MEMBERSHIP_EXPIRY_S
        )

    def announced_at(self, node_id: str) -> float:
        node = self._node(node_id)
        end = self.now_s if node.alive or node.down_at_s is None else node.down_at_s
        periods = (end - node.up_since_s) // ANNOUNCE_PERIOD_S
        return node.up_since_s + periods * ANNOUNCE_PERIOD_S

    def data_nodes(self) -> Sequence[str]:
        return tuple(n for n in self._data_nodes if self.nodes[n].known)

    def compute_ms(self, node_id: str) -> float:
        return self._compute_ms[node_id]

    def latency_ms(self, src: str, dst: str) -> float:
        return self._latency_ms[self.nodes[src].region_index][self.nodes[dst].region_index]

    def bandwidth_gbps(self, src: str, dst: str) -> float:
        return self._bandwidth_gbps[self.nodes[src].region_index][self.nodes[dst].region_index]

    def edge_cost_ms(self, src: str, dst: str) -> float:
        return edge_cost_ms(
            EdgeInputs(
                compute_i_ms=self._compute_ms[src],
                compute_j_ms=self._compute_ms[dst],
                latency_ij_ms=self.latency_ms(src, dst),
                latency_ji_ms=self.latency_ms(dst, src),
                bandwidth_ij_gbps=self.bandwidth_gbps(src, dst),
                bandwidth_ji_gbps=self.bandwidth_gbps(dst, src),
                activation_bytes=self.activation_bytes,
            )
        )

    def occupancy(self, node_id: str) -> int:
        node = self._node(node_id)
        return len(node.held) + len(node.waiting)

    def is_ready(self, node_id: str) -> bool:
        node = self._node(node_id)
        return node.ready_at_s <= self.now_s

    def is_alive(self, node_id: str) -> bool:
        if not self._full_knowledge:
            raise PolicyContractError(
                "is_alive is reserved to full-knowledge policies; detect crashes by deadlines"
            )
        return self._node(node_id).alive

    # ---- engine-side helpers ----

    def transfer_s(self, src: str, dst: str, size_bytes: float) -> float:
        """Serialisation time of ``size_bytes`` on the src -> dst link, in seconds."""
        return size_bytes * BITS_PER_BYTE / (self.bandwidth_gbps(src, dst) * _BITS_PER_GBIT)

    def region_delay_s(self, src_region: int, dst_region: int, size_bytes: float) -> float:
        """Latency plus serialisation of ``size_bytes`` between two regions, in seconds (what a
        control message takes; the same arithmetic as ``latency_ms`` / 1000 + ``transfer_s``)."""
        latency_s = self.latency_s_by_region[src_region][dst_region]
        return (
            latency_s
            + size_bytes * BITS_PER_BYTE / self.bits_per_s_by_region[src_region][dst_region]
        )

    def mark_known(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if not node.known:
            node.known = True
            self._known_order.append(node_id)
            if node.stage is not None and node.stage != DATA_STAGE:
                self._stage_members.setdefault(node.stage, []).append(node_id)

    def assign_stage(self, node_id: str, stage: int) -> None:
        node = self.nodes[node_id]
        if node.spec.role == "data":
            raise PolicyContractError(f"policy tried to give data node {node_id} a stage")
        if not 1 <= stage <= self.stages:
            raise PolicyContractError(f"policy placed {node_id} at stage {stage}, not in 1..S")
        if node.known and node.stage is not None and node.stage != DATA_STAGE:
            self._stage_members[node.stage].remove(node_id)
        node.stage = stage
        if node.known:
            self._stage_members.setdefault(stage, []).append(node_id)

    def alive_in_stage(self, stage: int) -> list[str]:
        members = self.data_nodes() if stage == DATA_STAGE else self._stage_members.get(stage, ())
        return [n for n in members if self.nodes[n].alive]

    def _node(self, node_id: str) -> NodeState:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise PolicyContractError(f"policy named unknown node {node_id!r}") from None
