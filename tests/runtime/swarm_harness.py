"""Start a small live swarm in one process: real libp2p hosts on 127.0.0.1, one trio loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import torch
import trio
from libp2p.crypto.keys import KeyPair

from gwtf.coordinator_free.protocol.config import FlowConfig
from gwtf.node.p2p.identity import new_identity
from gwtf.node.receipts.book import HopFacts
from gwtf.node.runtime.live_node import LiveNode, LiveNodeConfig, run_live_node
from gwtf.node.runtime.roles.data import IterationResult
from gwtf.node.training.config import named_config
from gwtf.node.training.reference import ReferenceRun, whole_model_run
from gwtf.node.training.settings import TrainingSettings
from tests.runtime.receipt_tap import ReceiptTap

MODEL_NAME = "gpt-tiny"
MODEL = named_config(*MODEL_NAME.split("-"))
STAGES = 2
BATCH_SIZE = 2
SEQ_LEN = 32
SEED = 3
TRAINING = TrainingSettings(device="cpu", max_in_flight=8)
FLOW = FlowConfig(
    stages=STAGES,
    activation_bytes=BATCH_SIZE * SEQ_LEN * MODEL.d_model * 4,
    decision_period_s=0.25,
    keepalive_interval_s=1.0,
    keepalive_timeout_s=1.0,
    keepalive_misses=3,
    ack_deadline_s=3.0,
)


_IDENTITIES: dict[tuple[Path, str], KeyPair] = {}


def identity_for(tmp_path: Path, name: str) -> KeyPair:
    """Node ``name``'s identity in this test: the same key each time it (re)starts."""
    return _IDENTITIES.setdefault((tmp_path, name), new_identity())


def node_config(
    tmp_path: Path, name: str, role: str, stage: int, stages: int = STAGES, **extra: object
) -> LiveNodeConfig:
    base = LiveNodeConfig(
        name=name,
        role=role,
        stage=stage,
        region="oregon",
        capacity=2,
        identity=identity_for(tmp_path, name),
        model=MODEL,
        stages=stages,
        batch_size=BATCH_SIZE,
        seq_len=SEQ_LEN,
        training=TRAINING,
        flow=replace(FLOW, stages=stages),
        seed=SEED,
        discovery_period_s=1.0,
        stall_timeout_s=15.0,
    )
    return replace(base, **extra)  # type: ignore[arg-type]


Scenario = Callable[["Swarm"], Awaitable[None]]


class Swarm:
    """The nodes started so far, and a way to crash one (its host closes mid-whatever)."""

    def __init__(self, tap: ReceiptTap | None = None) -> None:
        self.tap = tap  # gives every node a receipt book, and collects the receipts
        self.nursery: trio.Nursery | None = None  # the swarm's (a tap's books run in it)
        self.nodes: dict[str, LiveNode] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.crashed: list[str] = []
        self.training_done = trio.Event()  # the data node has finished its iterations
        self.results: dict[str, list[IterationResult]] = {}  # of every data node, by name
        self.hops: dict[str, list[HopFacts]] = {}  # every acknowledged hop, by its worker

    def started(self, name: str, node: LiveNode) -> None:
        self.nodes[name] = node
        if self.tap is not None:
            assert self.nursery is not None, "nodes start inside run_swarm"
            self.tap.attach(name, node, self.nursery)
        hops = self.hops.setdefault(name, [])
        node.plane.hops.observer = lambda record: hops.append(record.hop)

    def hop_records(self) -> list[HopFacts]:
        return [record for records in self.hops.values() for record in records]

    def crash(self, name: str) -> None:
        self.crashed.append(name)
        self.scopes[name].cancel()


async def run_swarm(
    tmp_path: Path,
    iterations: int,
    batch: int,
    relays: dict[str, int],
    during: Scenario | None = None,
    swarm: Swarm | None = None,
    data_capacity: int = 2,
    stages: int = STAGES,
    data_nodes: int = 1,
    capacities: dict[str, int] | None = None,
    relay_settings: dict[str, object] | None = None,
    data_settings: dict[str, object] | None = None,
) -> list[IterationResult]:
    """Start a data node ("data"; with ``data_nodes`` > 1 also "data-1", ...: each trains its
    shard of every iteration), then relays (name -> stage); returns the first data node's
    results (every data node's are in ``swarm.results``). ``capacities`` overrides nodes'
    capacities by name (data nodes: ``data_capacity``; relays: 2); ``relay_settings`` sets
    other ``LiveNodeConfig`` fields of every relay (e.g. ``emulated_hop_s``), and
    ``data_settings`` those of every data node."""
    capacities = capacities or {}
    torch.set_num_threads(1)
    swarm = swarm or Swarm()
    started = swarm.nodes
    scenario_done = trio.Event()
    async with trio.open_nursery() as nursery:
        swarm.nursery = nursery
        trained = 0

        async def data_main(name: str, shard: int, bootstrap: tuple[str, ...]) -> None:
            nonlocal trained
            config = node_config(
                tmp_path,
                name,
                "data",
                0,
                stages,
                iterations=iterations,
                batch=batch,
                capacity=capacities.get(name, data_capacity),
                bootstrap=bootstrap,
                data_nodes=data_nodes,
                data_shard=shard,
                **(data_settings or {}),
            )
            with trio.CancelScope() as scope:  # a crashed data node counts as done
                swarm.scopes[name] = scope
                swarm.results[name] = await run_live_node(config, lambda node: ready(name, node))
            trained += 1
            if trained < data_nodes:
                return
            swarm.training_done.set()
            # A scenario runs to its end even when training finished first, so all its checks
            # run against live nodes; a test asserts the overlap it needs.
            await scenario_done.wait()
            nursery.cancel_scope.cancel()

        data_ready = trio.Event()

        def ready(name: str, node: LiveNode) -> None:
            swarm.started(name, node)
            if name == "data":
                data_ready.set()

        async def scenario() -> None:
            try:
                if during is not None:
                    await during(swarm)
            finally:
                scenario_done.set()

        nursery.start_soon(data_main, "data", 0, ())
        await data_ready.wait()
        bootstrap = (started["data"].address,)
        for shard in range(1, data_nodes):
            nursery.start_soon(data_main, f"data-{shard}", shard, bootstrap)
        for name, stage in relays.items():
            config = node_config(
                tmp_path,
                name,
                "relay",
                stage,
                stages,
                bootstrap=bootstrap,
                capacity=capacities.get(name, 2),
                **(relay_settings or {}),
            )
            # One after another, each once the one before serves: the handshakes of every
            # relay at once (noise, identify, the DHT, gossipsub) on the one event loop of a
            # loaded machine time out and are retried, and none may get through for minutes.
            await nursery.start(run_relay, config, swarm)
        nursery.start_soon(scenario)
    return swarm.results["data"]


async def run_data_node(config: LiveNodeConfig, swarm: Swarm) -> list[IterationResult]:
    """A data node started during a scenario (e.g. one restarting); its results (also in
    ``swarm.results`` under its name), or none if it was crashed."""
    with trio.CancelScope() as scope:
        swarm.scopes[config.name] = scope

        def on_started(node: LiveNode) -> None:
            swarm.started(config.name, node)

        swarm.results[config.name] = await run_live_node(config, on_started)
        return swarm.results[config.name]
    return []


async def run_relay(
    config: LiveNodeConfig,
    swarm: Swarm,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A relay of ``swarm``; started (``nursery.start``) once it serves."""
    with trio.CancelScope() as scope:
        swarm.scopes[config.name] = scope

        def on_started(node: LiveNode) -> None:
            swarm.started(config.name, node)
            task_status.started()

        await run_live_node(config, on_started)


_REFERENCE_LOSSES: dict[tuple[int, int, int], tuple[float, ...]] = {}


def reference_losses(iterations: int, batch: int, stages: int = STAGES) -> list[float]:
    """Whole-model training on the same microbatch ids: what the swarm must reproduce. Seeded,
    so the same for the same arguments: trained once per session (1-3 s on a loaded CPU)."""
    key = (iterations, batch, stages)
    if key not in _REFERENCE_LOSSES:
        _REFERENCE_LOSSES[key] = tuple(reference_run(iterations, batch, stages).losses)
    return list(_REFERENCE_LOSSES[key])


def reference_run(iterations: int, batch: int, stages: int = STAGES) -> ReferenceRun:
    """``reference_losses``'s run, its trained model included."""
    training = replace(
        TRAINING,
        model=MODEL_NAME,
        stages=stages,
        batch_size=BATCH_SIZE,
        seq_len=SEQ_LEN,
        seed=SEED,
        microbatches_per_iteration=batch,
    )
    return whole_model_run(training, iterations)
