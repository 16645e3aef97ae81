"""One live node as an OS process: ``python -m node.runtime.node_process --config node.toml``.

The node is configured by its settings file (``node.settings``: sections ``node``, ``p2p``,
``chain``, ``training``, ``flow``; flags > ``GWTF_*`` env > file > defaults), which
``live_config_from_settings`` maps onto the live node. With ``chain.admission = true`` the node
serves only peers that the chain (``chain.rpc_url`` or the devnet file's, contracts from
``chain.devnet_file``) binds to a staked node of ``chain.run_id``.

Flags of the process supervisor (``gwtf-node swarm``), not settings of the node:
``--status-file`` (the node writes its listen address once started, hop statistics and refused
peers every 0.25 s, and the data node's iteration results when it finishes — always by atomic
rename, so a reader, or a ``kill -9`` mid-write, never sees a torn file); ``--start-file`` (with
its host up and its worker built, wait until that path exists before making itself known: a
joiner started ahead of time, waiting for its moment); and
``--crash-on JSON`` ({"direction": "forward"|"backward", "iteration": int, "lock": path}): fault
injection for tests — the first node to reach such a hop and create ``lock`` kills itself with
SIGKILL right there, mid-hop, so a crash lands exactly where a test wants it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
import trio

from coordinator_free.protocol.config import DATA, FlowConfig
from gwtf.errors import ConfigError, GwtfError
from node.chain import connect
from node.chain_actions import Contracts
from node.devnet_file import read_devnet_file
from node.p2p.link_emulation import Topology
from node.runtime.admission import RunAdmission
from node.runtime.data_role import DataRole
from node.runtime.fault_injection import arm_crash
from node.runtime.live_node import LiveNode, LiveNodeConfig, run_live_node
from node.settings import AUTO_STAGE, Settings, load_settings
from node.training.checkpoint import state_digest
from node.training.config import ModelConfig
from node.training.errors import ModelConfigError
from node.training.partition import model_for_run
from node.training.trainer import PartTrainer

log = logging.getLogger(__name__)


def model_of(settings: Settings) -> ModelConfig:
    try:
        training = settings.training
        return model_for_run(training.model, training.seq_len, training.stages)
    except ModelConfigError as exc:
        raise ConfigError(f"training.model={settings.training.model!r}: {exc}") from exc


def flow_config(settings: Settings, model: ModelConfig) -> FlowConfig:
    """The flow protocol's parameters from the ``flow`` section (names of the settings file)."""
    flow, training = settings.flow, settings.training
    # Bytes of one activation crossing an edge: (batch, seq, d_model) float32.
    activation_bytes = 4.0 * training.batch_size * training.seq_len * model.d_model
    return FlowConfig(
        stages=training.stages,
        activation_bytes=activation_bytes,
        decision_period_s=flow.decision_period_s,
        relay_temperature=flow.temperature_relay,
        data_temperature=flow.temperature_data,
        cooling=flow.cooling_factor,
        anneal_probability_needing=flow.anneal_probability_needy,
        anneal_probability_idle=flow.anneal_probability_idle,
        unmatched_timeout_periods=flow.drop_unmatched_after_periods,
        ack_deadline_s=flow.hop_ack_deadline_s,
        keepalive_interval_s=flow.keepalive_interval_s,
        keepalive_timeout_s=flow.keepalive_timeout_s,
        keepalive_misses=flow.keepalive_misses,
        # The slot list a node sends its upstream peers doubles as its keep-alive: send it at
        # the keep-alive interval, so no separate ping is needed.
        reconcile_periods=max(1, round(flow.keepalive_interval_s / flow.decision_period_s)),
    )


def live_config_from_settings(settings: Settings) -> LiveNodeConfig:
    """The live node's configuration; a setting it cannot run with is a ``ConfigError``."""
    node, p2p, training = settings.node, settings.p2p, settings.training
    stages = training.stages
    if node.role == DATA and node.stage not in (-1, 0):
        raise ConfigError(f"node.stage={node.stage}: a data node sits at stage 0; drop node.stage")
    if node.role != DATA and not (1 <= node.stage <= stages or node.stage == AUTO_STAGE):
        raise ConfigError(
            f"node.stage={node.stage} is not a relay stage of this run; set it to 1..{stages}, "
            "or -1 to take the run's bottleneck stage"
        )
    if p2p.topology_file and not Path(p2p.topology_file).is_file():
        raise ConfigError(f"p2p.topology_file={p2p.topology_file!r} does not exist; fix the path")
    topology = Topology.from_json_file(Path(p2p.topology_file)) if p2p.topology_file else None
    if topology is not None and p2p.region not in topology.regions:
        raise ConfigError(
            f"p2p.region={p2p.region!r} is not a region of {p2p.topology_file}; choose one of "
            f"{list(topology.regions)}"
        )
    model = model_of(settings)
    return LiveNodeConfig(
        name=node.name,
        role=node.role,
        stage=0 if node.role == DATA else node.stage,
        region=p2p.region,
        capacity=node.capacity,
        key_path=Path(p2p.key_file),
        model=model,
        stages=stages,
        batch_size=training.batch_size,
        seq_len=training.seq_len,
        training=training,
        flow=flow_config(settings, model),
        run_id=settings.chain.run_id,
        seed=training.seed,
        bootstrap=p2p.bootstrap_peers,
        listen=f"/ip4/{p2p.listen_host}/tcp/{p2p.listen_port}",
        topology=topology,
        iterations=training.iterations,
        batch=training.microbatches_per_iteration,
        stall_timeout_s=training.stall_timeout_s,
        join=node.join,
        flow_timeout_s=settings.flow.setup_timeout_s,
        discovery_period_s=p2p.discovery_period_s,
        compute_ms=node.compute_ms,
        emulated_speed=node.emulated_speed,
        emulated_hop_s=node.emulated_hop_ms / 1000.0,
        admit=admission_from_settings(settings),
        routing=settings.flow.routing,
        data_nodes=training.data_nodes,
        data_shard=training.data_shard,
    )


def admission_from_settings(settings: Settings) -> RunAdmission | None:
    """``RunAdmission`` over the chain named by the settings, or None when admission is off."""
    chain = settings.chain
    if not chain.admission:
        return None
    if chain.run_id < 1:
        raise ConfigError("chain.admission is on but chain.run_id is not set; set the run's id")
    info = read_devnet_file(chain.devnet_file)
    w3 = connect(
        chain.rpc_url or info.rpc_url, timeout_s=chain.rpc_timeout_s, rpc_token=chain.rpc_token
    )
    contracts = Contracts.at(w3, info.contracts)
    return RunAdmission(contracts.port(), chain.run_id, cache_s=chain.admission_cache_s)


def write_status(path: Path, status: dict[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(status))
    os.replace(temporary, path)


def node_status(node: LiveNode) -> dict[str, Any]:
    role = node.role
    status: dict[str, Any] = {
        "name": node.config.name,
        "peer_id": node.plane.node_id,
        "address": node.address,
        "role": node.config.role,
        "stage": node.config.stage,
        "stats": dataclasses.asdict(role.stats),
        "hops_recorded": len(node.plane.hop_log.records),
        "recomputed_hops": sum(1 for r in node.plane.hop_log.records if r.attempt > 0),
        # Peers this node refused (banned, or not admitted to the run), with how often.
        "refused": dict(node.rpc.refused),
        # Where this node's hop time goes, and its CPU seconds (the throughput benchmark's).
        "hop_timings": dataclasses.asdict(node.plane.timings),
        "cpu_s": sum(os.times()[:2]),
    }
    if isinstance(role, DataRole):
        status["results"] = [dataclasses.asdict(r) for r in role.results]
        status["training"] = role.training
    status["step"] = role.worker.step_count
    status["state_digest"] = _digest_at_step(role.worker)
    return status


_digests: dict[int, str] = {}


def _digest_at_step(worker: PartTrainer) -> str:
    """The stage state's content digest, computed once per step (replicas compare it)."""
    if worker.step_count not in _digests:
        _digests.clear()
        _digests[worker.step_count] = state_digest(worker)
    return _digests[worker.step_count]


async def run_process(
    config: LiveNodeConfig, status_file: Path, crash_on: dict[str, Any] | None = None
) -> None:
    started: list[LiveNode] = []

    async def report() -> None:
        while True:
            if started:
                write_status(status_file, node_status(started[0]))
            await trio.sleep(0.25)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)

        def on_started(node: LiveNode) -> None:
            started.append(node)
            if crash_on is not None:
                arm_crash(node, crash_on)

        await run_live_node(config, on_started)
        write_status(status_file, {**node_status(started[0]), "finished": True})
        nursery.cancel_scope.cancel()


def start_file_gate(start_file: Path) -> Callable[[], Awaitable[None]]:
    async def wait_for_start_file() -> None:
        while not start_file.exists():
            await trio.sleep(0.05)

    return wait_for_start_file


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m node.runtime.node_process")
    parser.add_argument("--config", required=True, help="the node's settings file (TOML)")
    parser.add_argument("--status-file", required=True, help="where to write the node's status")
    parser.add_argument("--start-file", help="wait until this path exists before starting")
    parser.add_argument("--crash-on", help="fault injection (JSON), for tests")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    name = Path(args.config).name.removesuffix(".toml")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("libp2p", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    try:
        settings = load_settings(config_file=args.config)
        config = live_config_from_settings(settings)
        if args.start_file:  # a joiner: host up and worker built, it waits for its moment
            config = dataclasses.replace(config, entry_gate=start_file_gate(Path(args.start_file)))
        crash_on = json.loads(args.crash_on) if args.crash_on else None
        trio.run(run_process, config, Path(args.status_file), crash_on)
    except (GwtfError, OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        print(f"gwtf-node: error: {exc}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, GwtfError) else 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
