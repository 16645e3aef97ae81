"""One live node assembled from its parts: host, discovery, flow protocol, data plane, role.

This is where a node's pieces meet (the process's composition root builds a ``LiveNodeConfig``
and calls ``run_live_node``). A data node trains ``iterations`` iterations (0: until cancelled)
and returns its results; a relay serves until cancelled.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import multiaddr
import trio
from libp2p.crypto.keys import KeyPair

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import Eip712Domain
from gwtf.coordinator_free.protocol.config import DATA, FlowConfig, NodeSpec
from gwtf.coordinator_free.protocol.node import FlowNode
from gwtf.errors import ConfigError, ProtocolError
from gwtf.node.chain.seats import CourtSeats
from gwtf.node.p2p.addresses import LOOPBACK
from gwtf.node.p2p.holepunch import HolePuncher
from gwtf.node.p2p.host import ADDRESS_TTL_S, peer_info, running_host
from gwtf.node.p2p.keepalive import NeighbourKeeper
from gwtf.node.p2p.link_emulation import LinkEmulator, Topology
from gwtf.node.p2p.reachability import Reachability
from gwtf.node.p2p.relay import CircuitDialer
from gwtf.node.p2p.relay_service import CircuitRelay, RelayLimits, circuit_relay
from gwtf.node.p2p.rpc import (
    Admission,
    PublicRate,
    RequestResponse,
    RpcLimits,
    Shaper,
    admit_everyone,
)
from gwtf.node.p2p.scoring import Offence
from gwtf.node.receipts import ReceiptsConfig
from gwtf.node.receipts.book import address_of_peer
from gwtf.node.receipts.cheats import Cheat
from gwtf.node.receipts.epochs import DataNodeEpochs, EpochClock, WorkerEpochs
from gwtf.node.receipts.evidence import (
    prune_settled_evidence,
    serve_evidence,
    serve_evidence_forwarding,
)
from gwtf.node.receipts.recording import ReceiptBook
from gwtf.node.receipts.reports import ReceiptInbox, ReceiptReporter
from gwtf.node.receipts.serving import PUBLIC_RATE, ReceiptServer, serve_receipts_forwarding
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.compute_meter import report_compute
from gwtf.node.runtime.dataplane.exchange import DataPlane, OriginCheck
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN
from gwtf.node.runtime.discovery.address_book import AddressBook, PeerRecord, own_record
from gwtf.node.runtime.discovery.join_placement import Reservations, wait_for_placement
from gwtf.node.runtime.discovery.own_reachability import (
    loopback_only,
    serve_dialbacks,
    watch_reachability,
)
from gwtf.node.runtime.discovery.run_discovery import DiscoverySettings, RunDiscovery
from gwtf.node.runtime.flow.routing import ROUTINGS, SwarmWiring
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.runtime.relaying import Relaying
from gwtf.node.runtime.replicas.averaging import GradientAverager
from gwtf.node.runtime.replicas.stage_state import join_stage, load_data_part, serve_stage_state
from gwtf.node.runtime.resume import DataResume
from gwtf.node.runtime.roles.data import DataRole, IterationResult
from gwtf.node.runtime.roles.data_peers import DataPeers, LeftOut
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.runtime.roles.relay_roster import report_alive
from gwtf.node.runtime.roles.validation import swarm_validation_loss
from gwtf.node.settings import AUTO_STAGE
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.evidence import EvidenceArchive, run_folder
from gwtf.node.store.hops import HopStore
from gwtf.node.store.ledger import LedgerRecords
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import ModelConfig
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.dataset import run_sampler
from gwtf.node.training.memory import MemoryFit, StageMemoryError, memory_fit
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.validation import Batch, due, run_validation_batches

log = logging.getLogger(__name__)


class EntryGate(Protocol):
    """Waited on once the host is up and the worker built, before the node makes itself known
    (a joiner started ahead of time waits for its moment). May block for as long as it likes;
    cancelled with the node."""

    async def __call__(self) -> None: ...


class IterationGate(Protocol):
    """Waited on by a data node with an iteration's number before it starts that iteration. May
    block for as long as it likes; cancelled with the node."""

    async def __call__(self, iteration: int, /) -> None: ...


class ReachabilityReport(Protocol):
    """Told of each reachability verdict and the line that says what the node does about it
    (for its operator). Must not block or raise."""

    def __call__(self, verdict: Reachability, line: str, /) -> None: ...


class Started(Protocol):
    """Told once of the live node when it serves (a supervisor's status file, a test's
    handle). Must not block or raise."""

    def __call__(self, node: LiveNode, /) -> None: ...


@dataclass(frozen=True)
class LiveNodeConfig:
    name: str
    role: str  # "data" | "relay"
    stage: int  # relays: 1..S; data nodes: 0
    region: str
    capacity: int
    #: The node key as a libp2p key pair: its peer id is the node's identity on chain.
    identity: KeyPair = field(repr=False)
    model: ModelConfig
    stages: int
    batch_size: int
    seq_len: int
    training: TrainingSettings
    flow: FlowConfig
    run_id: int = 1
    seed: int = 0
    bootstrap: tuple[str, ...] = ()
    #: TCP multiaddrs to listen on, and public ones to advertise first (``p2p.addresses``).
    listen: tuple[str, ...] = (LOOPBACK,)
    announce: tuple[str, ...] = ()
    #: Whether peers can dial this node directly (None: its own dial-back check decides, and a
    #: node on loopback only counts as reachable); one that cannot holds slots at ``relays``
    #: (full addresses; none: the bootstrap peers) and advertises circuits through them first
    #: (``gwtf.node.runtime.relaying``).
    reachable: bool | None = True
    relays: tuple[str, ...] = ()
    #: Relay circuits for unreachable peers (only while this node is not known to be
    #: unreachable itself), for the peers ``admit`` admits (all of them when it is None).
    relay_service: bool = False
    relay_limits: RelayLimits = field(default_factory=RelayLimits)
    topology: Topology | None = None
    iterations: int = 0  # data node: how many to train; 0 trains until cancelled
    batch: int = 4  # data node: microbatches per iteration
    stall_timeout_s: float = 30.0
    #: Relay: download the stage's state from a replica before serving. Data node: ask the
    #: run's data nodes to take it (back) in, then load the embedding and head from one.
    join: bool = False
    flow_timeout_s: float = 60.0
    #: How long a data node waits for a stage-1 relay, and a relay for the run to answer it
    #: (inf: until cancelled), retrying with backoff and saying what it waits for.
    wait_for_peers_s: float = math.inf
    discovery_period_s: float = 1.0
    compute_ms: float = 100.0
    #: Below 1, each hop's compute is stretched to 1 / speed (``DataPlane.emulated_speed``).
    emulated_speed: float = 1.0
    emulated_hop_s: float = 0.0  # a hop's compute lasts at least this (``DataPlane``)
    #: Who may talk to this node (e.g. ``RunAdmission`` over the chain); None admits every peer.
    admit: Admission | None = None
    #: Whether a forward's origin is a data node of the run (``RunAdmission.is_data_node``);
    #: None (no chain) takes any origin (``DataPlane.origins``).
    origins: OriginCheck | None = None
    #: The run's try token domain: its chain and WorkLedger (``try_token.try_token_domain``);
    #: ``NO_CHAIN_TRY_DOMAIN`` for a swarm on no chain. Every node of a run names the same one.
    try_domain: Eip712Domain = NO_CHAIN_TRY_DOMAIN
    #: Awaited once the host is up and the worker built, before the node makes itself known:
    #: a joiner started ahead of time waits here for its moment, its slow start-up done.
    entry_gate: EntryGate | None = None
    #: A data node: awaited with each iteration's number before it starts it (a supervisor
    #: holds it between iterations, e.g. until it has read a new epoch off the chain).
    iteration_gate: IterationGate | None = None
    routing: str = "gwtf"  # "gwtf": follow the flow table; "swarm": SWARM's throughput wiring
    #: Data nodes sharing the run's batches, and this data node's shard of them (0-based).
    data_nodes: int = 1
    data_shard: int = 0
    #: Receipts on every hop and the epoch cycle on chain; None trains without.
    receipts: ReceiptsConfig | None = None
    #: Ask the home router (UPnP IGD) to forward the listen port; announced once peers reach it.
    upnp: bool = False
    #: Upgrade circuits this node dials to direct connections by hole punching, and answer
    #: peers' punches (``gwtf.node.p2p.holepunch``).
    hole_punch: bool = True
    #: Told each reachability verdict (``gwtf.node.p2p.reachability``; none on loopback only) and
    #: the line that says what the node does about it.
    on_reachability: ReachabilityReport | None = None
    #: Data node: the run's data set hash on chain; a ``training.data`` of another is refused.
    dataset_hash: str | None = None
    #: A lone data node's resume points (``gwtf.node.runtime.resume``), one folder per run in its
    #: home; None keeps none.
    resume_dir: Path | None = None

    def resume_label(self) -> str:
        """What a resume point must be of: the run, its seed and data, the microbatches."""
        data = self.dataset_hash or self.training.data or "tinyshakespeare"
        return (
            f"run {self.run_id} seed {self.seed} data {data} microbatches "
            f"{self.batch}x{self.batch_size}x{self.seq_len}"
        )


@dataclass
class ReceiptParts:
    """A node's receipts at work: its book, its epoch cycle and its report channel."""

    book: ReceiptBook
    rpc: RequestResponse  # the book's batch closes go over it
    cycle: DataNodeEpochs | WorkerEpochs
    clock: EpochClock
    auto_claim: bool = True
    reporter: ReceiptReporter | None = None
    inbox: ReceiptInbox | None = None
    evidence: EvidenceArchive | None = None  # a relay's kept hop evidence


@dataclass
class LiveNode:
    config: LiveNodeConfig
    rpc: RequestResponse
    book: AddressBook
    flow: FlowService
    plane: DataPlane
    role: DataRole | RelayRole
    address: str
    discovery: RunDiscovery | None = None
    receipts: ReceiptParts | None = None
    relaying: Relaying | None = None
    #: Its part's memory against what the machine offers it (``gwtf.node.training.memory``).
    memory: MemoryFit | None = None
    #: Hole punching: its counts (it punches nothing under ``hole_punch = false``).
    punch: HolePuncher | None = None
    #: The relay protocol on its host: what it relays for others (``relay.hop``, None when
    #: it does not) and the circuits it takes.
    relay: CircuitRelay | None = None

    @property
    def reachability(self) -> Reachability | None:
        """The last verdict of the node's dial-back check (None before the first, and on a
        node that listens on loopback only)."""
        return self.discovery.reachability if self.discovery is not None else None

    def describe_reachability(self) -> str:
        """The last verdict in words, with what the node does about it ("" before the first)."""
        reach = self.reachability
        if reach is None:
            return ""
        return self.relaying.describe(reach) if self.relaying is not None else reach.describe()


def _worker(config: LiveNodeConfig, node_id: str) -> tuple[DataNodeWorker | StageWorker, MemoryFit]:
    """The node's part, built once its memory is known to fit (``StageMemoryError`` if not)."""
    plan = plan_partition(config.model, config.stages)
    if config.role != DATA and not 1 <= config.stage <= config.stages:
        raise ConfigError(f"relay stage {config.stage} is outside 1..{config.stages}")
    fit = memory_fit(plan, 0 if config.role == DATA else config.stage, config.training)
    fit.check()
    log.info("memory: %s; %s", fit.memory.describe(), fit.source)
    if config.role == DATA:
        data = config.training.data
        sampler = run_sampler(
            data, config.batch_size, config.seq_len, config.seed, config.dataset_hash
        )
        worker = DataNodeWorker(plan, config.training, config.seed, sampler, replica_id=node_id)
        return worker, fit
    stage = StageWorker(plan, config.stage - 1, config.training, config.seed, replica_id=node_id)
    return stage, fit


def stages_that_fit(config: LiveNodeConfig) -> tuple[int, ...]:
    """The relay stages of the run this node's memory holds; none is a ``StageMemoryError``
    that says what the smallest one needs."""
    plan = plan_partition(config.model, config.stages)
    by_layers: dict[int, MemoryFit] = {}  # blocks are alike: a stage's memory is its count's
    fits = {}
    for span in plan.stages:
        if span.n_layers not in by_layers:
            by_layers[span.n_layers] = memory_fit(plan, span.index + 1, config.training)
        fits[span.index + 1] = by_layers[span.n_layers]
    fitting = tuple(stage for stage, fit in fits.items() if fit.fits)
    if not fitting:
        smallest = min(fits.values(), key=lambda fit: fit.memory.total)
        raise StageMemoryError(f"no stage of this run fits this node: {smallest.refusal()}")
    if len(fitting) < len(fits):
        left_out = [stage for stage in fits if stage not in fitting]
        log.warning(
            "stages %s do not fit this node's memory (%s): joining one of %s",
            left_out, fits[left_out[0]].refusal(), list(fitting),
        )  # fmt: skip
    return fitting


async def run_live_node(
    config: LiveNodeConfig, on_started: Started | None = None
) -> list[IterationResult]:
    """Run one node; returns the data node's iteration results (a relay runs until cancelled)."""
    key = config.identity
    relaying = Relaying(
        config.relays or config.bootstrap,
        forced=config.reachable,
        relay_service=config.relay_service,
        admit=config.admit,
    )
    verified: list[multiaddr.Multiaddr] = []  # a router's port mapping, once peers reached it
    async with (
        running_host(
            key, config.listen, config.announce, relaying.circuits, verified=verified
        ) as host,
        circuit_relay(
            host,
            serve=config.relay_service and config.reachable is not False,
            limits=config.relay_limits,
            admit=config.admit or admit_everyone,
            circuits_from=None if config.reachable is True else relaying.holds_slot_at,
            serving=relaying.serving,
        ) as circuits,
        trio.open_nursery() as nursery,
    ):
        node_id = str(host.get_id())
        rpc = (
            RequestResponse(host)
            if config.admit is None
            else RequestResponse(host, admit=config.admit)
        )
        punch = HolePuncher(host, admit=config.admit or admit_everyone, on_direct=rpc.retire)
        if config.hole_punch:  # unserved, it schedules nothing either
            punch.serve(nursery)
        rpc.circuits = CircuitDialer(
            host, relaying.addresses_of, relaying.relay_addresses, on_circuit=punch.schedule
        )
        if config.role != DATA and config.stage == AUTO_STAGE:
            # The stage is the run's bottleneck at the moment this relay enters: ask then.
            if config.entry_gate is not None:
                await config.entry_gate()
            fitting = await trio.to_thread.run_sync(stages_that_fit, config)
            placement = await wait_for_placement(
                rpc, config.bootstrap, config.stages, config.flow.ack_deadline_s,
                config.wait_for_peers_s, allowed=fitting,
            )  # fmt: skip
            config = replace(config, stage=placement.decision.stage, entry_gate=None)
            # Its replicas just answered: ask them for the stage's state before the DHT does.
            first_sources = [
                PeerRecord(e.peer_id, e.address, "", e.stage) for e in placement.replicas
            ]
        else:
            first_sources = []
        spec = NodeSpec(node_id, config.role, config.stage, config.capacity, config.compute_ms)
        flow = FlowService(
            rpc,
            FlowNode(spec, config.flow, random.Random(config.seed ^ hash(node_id))),
            config.flow.decision_period_s / 2,
        )
        limits = CodecLimits.from_settings(config.training)
        plane = DataPlane(
            rpc,
            node_id,
            config.run_id,
            config.stages,
            config.flow.ack_deadline_s,
            limits.max_bytes + 4096,
            emulated_speed=config.emulated_speed,
            emulated_hop_s=config.emulated_hop_s,
            node_key=key.private_key.to_bytes(),
            origins=config.origins,
            try_domain=config.try_domain,
        )
        worker, memory = await trio.to_thread.run_sync(_worker, config, node_id)
        if config.entry_gate is not None:
            await config.entry_gate()
        role: DataRole | RelayRole
        if config.routing not in ROUTINGS:
            raise ConfigError(f"routing {config.routing!r} is not one of {', '.join(ROUTINGS)}")
        wiring = SwarmWiring(random.Random(config.seed)) if config.routing == "swarm" else None
        resume: DataResume | None = None
        resumed_at = 0  # the iteration a resume point puts it at
        if isinstance(worker, DataNodeWorker):
            role = DataRole(
                worker,
                plane,
                flow,
                limits,
                nursery,
                config.batch,
                config.stall_timeout_s,
                wiring=wiring,
                shard=config.data_shard,
                shards=config.data_nodes,
            )
            every = config.training.checkpoint_every
            if config.resume_dir is not None and config.data_nodes == 1 and every:
                # Before it is known to anyone: a damaged resume point stops it here.
                resume = DataResume(config.resume_dir, config.resume_label(), every, role, nursery)
                resumed_at = await resume.load()
        else:
            averager = GradientAverager(rpc, node_id, limits, config.flow.ack_deadline_s)
            role = RelayRole(
                worker, config.stage, plane, flow, averager, limits, nursery, wiring=wiring
            )
        introduce_later: list[str] = []

        def on_new_peer(record: PeerRecord) -> None:
            if ready.is_set():
                flow.dispatch(flow.node.introduce(record.peer_id))
            else:
                introduce_later.append(record.peer_id)

        def on_heard(peer_id: str) -> None:
            # A peer the flow core gave up on (missed keep-alives under load) that answers again
            # is introduced anew, so a slow moment never removes a live replica for good; nor
            # does a failed probe from the data node's roster (which a middle stage's relay
            # has no other way to undo).
            if isinstance(role, DataRole):
                role.roster.heard(peer_id)
            peer = flow.node.peers.get(peer_id)
            if ready.is_set() and peer is not None and not peer.alive:
                flow.dispatch(flow.node.introduce(peer_id))

        ready = trio.Event()
        books: list[AddressBook] = []  # the one made below, once it is
        discoveries: list[RunDiscovery] = []  # likewise

        def republish() -> None:
            # Its relay slots changed: peers must learn its circuits now, not at the card's
            # next announcement a minute later (they would dial an address nobody can reach).
            for known in books:
                known.own = own_record(rpc, config.region)
            for found in discoveries:
                if found.announced.is_set():
                    nursery.start_soon(found.announce)

        relaying.loopback_only = loopback_only(rpc)
        await relaying.start(rpc, nursery, republish)
        book = AddressBook(rpc, own_record(rpc, config.region), on_new_peer, on_heard)
        relaying.book = book
        books.append(book)
        # Who may ask for a re-send is judged by stage, also for nodes beyond the neighbours.
        role.sender.carded_stage = book.stage_of
        if isinstance(role, DataRole):
            role.roster.discovered = lambda: {
                peer: record.stage for peer, record in book.peers.items() if record.stage
            }
            if config.data_nodes > 1:
                _share_the_run(role, rpc, book, config, limits)
                assert role.peers is not None
                role.peers.background = nursery
        if config.topology is not None:
            rpc.shaper = _shaper(LinkEmulator(config.topology), node_id, config.region, book)
        receipts = None
        if config.receipts is not None:
            receipts = await _start_receipts(config, config.receipts, rpc, plane, role, book)
            nursery.start_soon(_run_receipts, receipts)
        book.serve()
        # The stages next to this node's are the ones it exchanges hops with: a node behind a
        # NAT cannot be dialled by them, so it keeps those connections up itself.
        keeper = NeighbourKeeper(
            rpc,
            lambda: neighbours(book, config.stage, config.stages),
            # Never below 10 s: a loaded machine must not cut a connection that is only slow.
            dead_after_s=max(10.0, 2 * config.flow.keepalive_timeout_s),
            relayed_dead_after_s=max(30.0, 6 * config.flow.keepalive_timeout_s),
            waits_for=relaying.waits_for,
        )
        keeper.serve()
        nursery.start_soon(keeper.run)
        flow.start(nursery)
        # Every part is served: to joiners and data nodes taken back in, and to exporters.
        serve_stage_state(rpc, role.worker, config.stage, config.flow.ack_deadline_s, role.limiter)
        # Kademlia DHT + the run's hint topic; peer exchange only as the DHT's fallback.
        discovery = RunDiscovery(
            book,
            key.private_key,
            DiscoverySettings(
                config.run_id,
                config.stage,
                config.role,
                config.bootstrap,
                period_s=config.discovery_period_s,
            ),
            spare_of=lambda: flow.node.spare,
        )
        discovery.relays_for_others = relaying.advertises_relay
        relaying.cards = discovery.cards.get
        relaying.all_cards = lambda: list(discovery.cards.values())
        discovery.serving = ready  # it looks peers up from now, and announces itself once served
        discoveries.append(discovery)
        nursery.start_soon(discovery.run)
        serve_dialbacks(rpc, book)

        def on_verdict(result: Reachability) -> None:
            relaying.heard(result)
            line = relaying.describe(result)
            log.info("reachability: %s", line)
            if config.on_reachability is not None:
                config.on_reachability(result, line)

        nursery.start_soon(
            watch_reachability, rpc, book, discovery, verified, config.upnp, on_verdict
        )
        if isinstance(role, RelayRole):
            deadlines = (
                config.flow_timeout_s,
                config.flow.ack_deadline_s,
                config.discovery_period_s,
            )

            async def resync(min_step: int) -> None:
                # Bounded: with no replica left to load from, the relay goes on from its own
                # state (RelayRole._resync) instead of holding up its stage for good.
                with trio.fail_after(4 * config.flow.ack_deadline_s + config.discovery_period_s):
                    await join_stage(
                        rpc, discovery, role.worker, role.stage, min_step, deadlines,
                        limiter=role.limiter,
                    )  # fmt: skip

            role.resync = resync
            if config.join:
                await join_stage(
                    rpc, discovery, role.worker, role.stage, 0, deadlines, first_sources
                )
        # Only now does this node speak the training protocols: a joiner takes no flows, hops
        # or averaging rounds before it holds its stage's current state.
        _serve_control(rpc, role, flow, book, config.flow.ack_deadline_s, config.stages)
        if role.averager is not None:
            role.averager.serve()
        if isinstance(role, RelayRole):
            # Before any hop: a data node that found this relay gone (a restart) must ask it to
            # end the iterations it takes hops in. It can be probed and average from here on.
            data_nodes = _data_nodes(rpc, book, config.bootstrap)
            await report_alive(rpc, data_nodes, config.flow.keepalive_timeout_s)
        # Served before any peer learns of this node (the exchange below, its card and hints
        # once ``ready`` is set): a peer that greets it or sends it a hop at once is answered,
        # never refused as speaking an unknown protocol.
        flow.serve()
        plane.serve(nursery)
        # Its bootstrap peers learn where it listens before its flow core greets them: a joiner
        # that asks them for the run's loads right after is told of this node (discovery's
        # cards and hints reach them later).
        with trio.move_on_after(config.flow.keepalive_timeout_s):
            async with trio.open_nursery() as introductions:
                for address in config.bootstrap:
                    introductions.start_soon(book.exchange_with, address)
        nursery.start_soon(report_compute, plane, flow)
        ready.set()
        # Peers that met this node before it served (a joiner) hear that it does now.
        nursery.start_soon(discovery.publish_hint, "stage")
        for peer_id in introduce_later:
            flow.dispatch(flow.node.introduce(peer_id))
        live = LiveNode(
            config, rpc, book, flow, plane, role, book.own.address, discovery, receipts, relaying,
            memory, punch, circuits,
        )  # fmt: skip
        if on_started is not None:
            on_started(live)
        if isinstance(role, DataRole):
            first = 0
            part_deadlines = (config.flow_timeout_s, config.flow.ack_deadline_s)
            if config.join and role.peers is not None:
                # A restarted data node, or a new one for a shard: taken in between iterations,
                # it loads the embedding and head as they are then.
                first = await role.peers.rejoin(config.flow_timeout_s)
                await load_data_part(rpc, role.worker, role.peers.others, first, part_deadlines)
            await role.wait_for_flows(
                config.wait_for_peers_s, config.flow_timeout_s, joining=config.join
            )
            if resume is not None and resumed_at:
                first = await resume.settle_relays(rpc, resumed_at, config.flow.ack_deadline_s)
            held_out = await trio.to_thread.run_sync(run_validation_batches, config.training)
            iteration = first
            while not config.iterations or iteration < config.iterations:
                if config.iteration_gate is not None:
                    await config.iteration_gate(iteration)
                try:
                    if resume is not None:
                        await resume.begin(iteration)
                    result = await role.run_iteration(iteration)
                except LeftOut as exc:
                    assert role.peers is not None  # only data nodes sharing a run are left out
                    log.warning("%s; asking to be taken back in", exc)
                    role.stats.taken_back_in += 1
                    iteration = await role.peers.rejoin(config.flow_timeout_s)
                    await load_data_part(
                        rpc, role.worker, role.peers.others, iteration, part_deadlines
                    )
                    continue
                log.info(
                    "iteration %s: loss %.4f in %.2f s", iteration, result.loss, result.duration_s
                )
                if held_out and due(config.training, iteration):
                    role.results[-1] = await _validated(role, rpc, result, held_out, config)
                if resume is not None:
                    await resume.after(iteration)
                iteration += 1
            if resume is not None:
                await resume.flush()
            role.finished = True
            if receipts is not None:
                # Its receipts' epochs are still to certify, and workers will ask for their
                # ranges: a data node with receipts serves on until it is stopped.
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()
            return role.results
        await trio.sleep_forever()
    raise AssertionError("unreachable")


async def _validated(
    role: DataRole,
    rpc: RequestResponse,
    result: IterationResult,
    held_out: list[Batch],
    config: LiveNodeConfig,
) -> IterationResult:
    """``result`` with the swarm's validation loss after its step."""
    plan = plan_partition(config.model, config.stages)
    relays = role.roster.discovered() | role.roster.told
    timeout = config.flow.ack_deadline_s
    found = await swarm_validation_loss(rpc, role.worker, plan, relays, held_out, timeout)
    if found is None:
        return result
    log.info(
        "iteration %s: validation loss %.4f%s",
        result.iteration,
        found.loss,
        "" if found.verified else " (unverified: a stage's weights came from one relay)",
    )
    return replace(result, validation_loss=found.loss, validation_verified=found.verified)


async def _start_receipts(
    config: LiveNodeConfig,
    setup: ReceiptsConfig,
    rpc: RequestResponse,
    plane: DataPlane,
    role: DataRole | RelayRole,
    book: AddressBook,
) -> ReceiptParts:
    """The node's receipt book on its data plane, its database, and its side of the epoch
    cycle: a data node's inbox of reports, or a worker's reporter."""
    db = await trio.to_thread.run_sync(open_database, setup.db_url)
    store, records = HopStore(db), LedgerRecords(db)
    batches = BatchStore(db, setup.terms.domain)

    def penalise(peer: str, why: str) -> None:
        rpc.scores.penalise(peer, Offence.BAD_RECEIPT, trio.current_time())

    private_key = config.identity.private_key.to_bytes()
    receipts = ReceiptBook(setup.terms, private_key, batches, penalise, settings=setup.batches)
    cheat = (
        Cheat(setup.cheat, private_key, setup.terms.domain, setup.terms.units_per_hop)
        if setup.cheat
        else None
    )
    plane.use_receipts(receipts)
    clock = EpochClock(setup.ledger, setup.clock_period_s)
    await clock.start_reading()
    timeout_s = 2 * config.flow.ack_deadline_s
    # Auditors reach a relay behind a NAT through the nodes it keeps connections to.
    # Seated jurors of a case about any node of the run reach a relay at home through it
    # outside the outsiders' rate.
    jurors = CourtSeats(setup.ledger.c, None, setup.terms.run_id)
    serve_evidence_forwarding(rpc, timeout_s, jurors)
    serve_receipts_forwarding(rpc, timeout_s, jurors)

    def data_node_peers() -> dict[str, str]:
        return {address_of_peer(p): p for p, record in book.peers.items() if record.stage == 0}

    if isinstance(role, DataRole):
        inbox = ReceiptInbox(rpc, setup.terms, receipts.address, store, timeout_s, penalise)
        inbox.serve()
        # Its certificate is what the jurors of a case about any node of its run (a relay,
        # or itself) check leaves against: they are answered outside the outsiders' rate too.
        ReceiptServer(batches, setup.terms, inbox.trees.get, cheat).serve(
            rpc, timeout_s, PublicRate(*PUBLIC_RATE, seats=jurors)
        )
        plane.origin_send = lambda header, digest: inbox.note_origin(
            header.epoch, header.iteration, header.microbatch_id, header.direction, digest
        )
        role.epoch_now = clock.epoch_now
        data_role = role
        certifying = DataNodeEpochs(
            setup.terms, receipts.address, setup.ledger, clock, store, records, inbox,
            busy_in=lambda epoch: data_role.iterating and data_role.epoch == epoch,
            grace_s=setup.grace_s, cheat=cheat,
        )  # fmt: skip
        return ReceiptParts(receipts, rpc, certifying, clock, inbox=inbox)
    # The seated jurors of a case about this relay are answered outside the outsiders' shared
    # rate (its receipts and evidence), so no flood of that rate can make its evidence missing.
    seats = CourtSeats(setup.ledger.c, receipts.address)
    jurors_too = PublicRate(*PUBLIC_RATE, seats=seats)
    ReceiptServer(batches, setup.terms, cheat=cheat).serve(rpc, timeout_s, jurors_too)
    archive = None
    if setup.evidence_dir:
        # One folder per chain, ledger, run and start time: another run's weights (a devnet
        # started afresh has the same chain id, ledger address and run id) are never served as
        # this one's.
        domain = setup.terms.domain
        folder = run_folder(
            domain.chain_id, domain.verifying_contract, setup.terms.run_id, clock.start
        )
        root = Path(setup.evidence_dir) / folder
        archive = EvidenceArchive(root, setup.evidence_epochs, clock.epoch_now)
        role.evidence = archive
        serve_evidence(rpc, archive, setup.terms.run_id, timeout_s, seats=seats)
    if cheat is not None:
        role.distort = cheat.distort()
    reporter = ReceiptReporter(rpc, timeout_s, setup.report_period_s, data_node_peers)
    # A restarted relay reports again what its database holds of recent epochs' countersigned
    # batches, as worker and as receiver (the data node takes a receipt twice as once): nothing
    # a countersignature vouched for is lost to the crash. Receipts still open then stay so:
    # unpaid, never signed.
    recent = max(0, clock.epoch_now() - 1)
    for epoch in range(recent, clock.epoch_now() + 1):
        for role_held in (WORKER, RECEIVER):
            entries = await trio.to_thread.run_sync(
                batches.sealed, setup.terms.run_id, epoch, role_held
            )
            reporter.requeue(entries)

    def data_node_peer(address: str) -> str | None:
        return reporter.peers.get(address) or data_node_peers().get(address)

    cycle = WorkerEpochs(
        setup.terms, receipts.address, setup.ledger, clock, store, records, rpc,
        data_node_peer, timeout_s, auto_claim=setup.auto_claim,
    )  # fmt: skip

    def complete(origin: str, entry: SignedReceipt) -> None:
        reporter.add(origin, entry)
        cycle.worked_in(entry.receipt.epoch, entry.receipt.dataNode)
        twice = cheat.signed(entry) if cheat is not None else None
        if twice is not None:
            reporter.add(origin, twice)

    def received(origin: str, entry: SignedReceipt) -> None:
        reporter.add(origin, entry)
        if cheat is not None:
            cheat.received(entry)

    receipts.on_complete = complete
    receipts.on_received = received
    receipts.on_signed = lambda receipt: cycle.worked_in(receipt.epoch, receipt.dataNode)
    return ReceiptParts(
        receipts, rpc, cycle, clock, setup.auto_claim, reporter=reporter, evidence=archive
    )


async def _run_receipts(parts: ReceiptParts) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(parts.book.run, parts.rpc)
        nursery.start_soon(parts.clock.run)
        if parts.inbox is not None:
            nursery.start_soon(parts.inbox.run)
        if parts.reporter is not None:
            nursery.start_soon(parts.reporter.run)
        if parts.evidence is not None:
            ledger, clock = parts.cycle.ledger, parts.clock
            nursery.start_soon(
                prune_settled_evidence, parts.evidence, ledger, lambda: clock.read, clock.period_s
            )  # the latest block's time, not one run on by the local clock
        if parts.cycle.ledger.wallet is None:
            log.warning("no wallet (chain.wallet_file): receipts are kept, nothing is sent")
        else:
            if not parts.auto_claim and isinstance(parts.cycle, WorkerEpochs):
                log.info("chain.auto_claim is off: epochs are claimed when asked (gwtf-node claim)")
            nursery.start_soon(parts.cycle.run)


def _share_the_run(
    role: DataRole,
    rpc: RequestResponse,
    book: AddressBook,
    config: LiveNodeConfig,
    limits: CodecLimits,
) -> None:
    """Give a data node the run's other data nodes (discovery's stage-0 peers) to agree on
    each iteration's end with, and to average the embedding and head with."""
    node_id = book.own.peer_id
    probe_timeout_s = max(config.flow.keepalive_timeout_s, 2 * config.flow.ack_deadline_s)
    role.peers = DataPeers(
        rpc,
        node_id,
        config.data_nodes,
        config.data_shard,
        lambda: {peer for peer, record in book.peers.items() if record.stage == 0},
        probe_timeout_s,
        patience_s=max(config.stall_timeout_s / 2, probe_timeout_s),
    )
    role.averager = GradientAverager(rpc, node_id, limits, config.flow.ack_deadline_s)


def _shaper(emulator: LinkEmulator, node_id: str, region: str, book: AddressBook) -> Shaper:
    def delay_s(peer: str, n_bytes: int) -> float:
        record = book.peers.get(peer)
        if record is None:
            return 0.0
        now = trio.current_time()
        return emulator.arrival_time(node_id, peer, region, record.region, n_bytes, now) - now

    return delay_s


def _serve_control(
    rpc: RequestResponse,
    role: DataRole | RelayRole,
    flow: FlowService,
    book: AddressBook,
    timeout_s: float,
    stages: int,
) -> None:
    # A data node tells relays that start together of each other (``Reservations``).
    reservations = Reservations(stages) if isinstance(role, DataRole) else None

    async def handle(peer: str, request: bytes) -> bytes:
        message = control.decode_request(request)
        if isinstance(role, DataRole):
            role.roster.heard(peer)  # a relay that asks something is alive
        if isinstance(message, control.Alive):
            return control.encode_reply(True)
        if isinstance(message, control.Loads):
            loads = _loads(flow, book)
            if reservations is not None:
                loads = reservations.answer(peer, loads, trio.current_time())
            return control.encode_loads(loads)
        if isinstance(message, control.Resend):  # and Resume, a forward repair
            return await role.handle_resend(message, peer)
        if isinstance(message, control.TraceBack):
            return role.sender.trace_back(message)
        if isinstance(message, control.ResumeBack):
            return await role.sender.resume_backward(message)
        if isinstance(message, control.Trace):
            return role.trace(message)
        if isinstance(message, control.RedoBack):
            return await role.sender.redo_backward(peer, message)
        if isinstance(
            message, control.Holds | control.ExpectRedo | control.Forget | control.Discard
        ):
            if not isinstance(role, RelayRole):
                raise ProtocolError("a data node holds no stage's gradient")
            if isinstance(message, control.Holds):
                # A data node's answer is final for its microbatches (``RelayRole.holds``).
                return await role.holds(message, peer, book.stage_of(peer))
            if isinstance(message, control.Forget | control.Discard):
                # Only an origin of microbatches asks (its signed card says stage 0).
                if book.stage_of(peer) != 0:
                    raise ProtocolError("only a data node of the run asks to drop a gradient")
                if isinstance(message, control.Discard):
                    return await role.discard(peer, message)
                return await role.forget(peer, message)
            return role.expect_redo(peer, message)
        if isinstance(message, control.CurrentTry):
            if not isinstance(role, DataRole):
                raise ProtocolError("only a microbatch's origin, a data node, knows its tries")
            return role.current_try(message)
        if isinstance(message, control.RedoLost):
            if not isinstance(role, DataRole):
                raise ProtocolError("only a data node redoes its share's lost gradients")
            return await role.redo_lost(peer, message)
        if isinstance(
            message, control.Shard | control.BatchDone | control.IterationEnded | control.Rejoin
        ):
            if isinstance(role, DataRole) and role.peers is not None:
                return role.peers.handle(peer, message)
            raise ProtocolError("only a data node sharing its run with others takes that")
        if isinstance(role, RelayRole):
            return await role.end_iteration(message)
        raise ProtocolError("a data node does not end iterations on request")

    limits = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 8 * timeout_s)
    rpc.serve(control.PROTOCOL_ID, handle, limits)


def neighbours(book: AddressBook, stage: int, stages: int) -> list[str]:
    """The known peers of the stages before and after ``stage`` in the pipeline (the data
    nodes, stage 0, come before stage 1 and after the last stage)."""
    ring = stages + 1
    adjacent = {(stage - 1) % ring, (stage + 1) % ring}
    return [peer for peer, record in book.peers.items() if record.stage in adjacent]


def _data_nodes(rpc: RequestResponse, book: AddressBook, bootstrap: tuple[str, ...]) -> set[str]:
    """The run's data nodes this node knows of: discovery's, and its bootstrap peers (a data
    node, in a swarm; a relay asked by mistake just answers), whose addresses it may not have
    stored yet (discovery dials them in its own time)."""
    known = {peer for peer, record in book.peers.items() if record.stage == 0}
    for address in bootstrap:
        info = peer_info(address)
        rpc.host.get_peerstore().add_addrs(info.peer_id, info.addrs, ADDRESS_TTL_S)
        known.add(str(info.peer_id))
    return known


def _loads(flow: FlowService, book: AddressBook) -> list[control.LoadEntry]:
    """This node and the live peers its flow protocol knows, with capacity and spare."""
    node = flow.node
    own = book.own
    # A joiner places itself by capacity and compute time; capacity less spare tells whoever
    # reads it the flows this node passes on. The slots a slow relay holds back
    # (``offered_slots``) carry none, and flows it holds but cannot forward are not its load:
    # the stage after it is short of room.
    carried = node.carried_count()
    entries = [
        control.LoadEntry(
            own.peer_id,
            own.address,
            node.spec.stage,
            node.spec.capacity,
            node.spec.capacity - carried,
            node.spec.compute_ms,
        )
    ]
    for peer in node.peers.values():
        record = book.peers.get(peer.peer_id)
        if peer.alive and record is not None:
            entries.append(
                control.LoadEntry(
                    peer.peer_id,
                    record.address,
                    peer.stage,
                    peer.capacity,
                    peer.spare,
                    peer.compute_ms,
                )
            )
    return entries
