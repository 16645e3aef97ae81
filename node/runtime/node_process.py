"""One live node as an OS process: ``python -m node.runtime.node_process SPEC.json``.

The swarm supervisor writes a spec per node (JSON, below) and starts this module; the node writes
its status to ``status_file`` — its listen address once started, hop statistics every second, and
the data node's iteration results when it finishes — always by atomic rename, so a reader (or a
``kill -9`` mid-write) never sees a torn file.

Spec keys: name, role, stage, region, capacity, key_path, model ("gpt-tiny"), stages,
batch_size, seq_len, run_id, seed, bootstrap [addresses], iterations, batch, flow {FlowConfig
fields}, join, stall_timeout_s, discovery_period_s, topology_file (or null), status_file,
start_file (null, or a path: wait until it exists before starting — a joiner already loaded),
routing ("gwtf" or "swarm"), and
crash_on (null, or {"direction": "forward"|"backward", "iteration": int, "lock": path}): fault
injection for tests — the first node to reach such a hop and create ``lock`` kills itself with
SIGKILL right there, mid-hop, so a crash lands exactly where a test wants it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import trio

from coordinator_free.protocol.config import FlowConfig
from gwtf.errors import ConfigError, GwtfError
from node.p2p.link_emulation import Topology
from node.runtime.data_role import DataRole
from node.runtime.hop import BACKWARD, FORWARD, HopHeader
from node.runtime.live_node import LiveNode, LiveNodeConfig, run_live_node
from node.training.checkpoint import state_digest
from node.training.config import named_config
from node.training.settings import TrainingSettings
from node.training.trainer import PartTrainer

log = logging.getLogger(__name__)

_SPEC_KEYS = {
    "name",
    "role",
    "stage",
    "region",
    "capacity",
    "key_path",
    "model",
    "stages",
    "batch_size",
    "seq_len",
    "run_id",
    "seed",
    "bootstrap",
    "iterations",
    "batch",
    "flow",
    "join",
    "stall_timeout_s",
    "discovery_period_s",
    "topology_file",
    "status_file",
    "crash_on",
    "start_file",
    "routing",
}


def config_from_spec(spec: dict[str, Any]) -> tuple[LiveNodeConfig, Path]:
    missing, unknown = _SPEC_KEYS - set(spec), set(spec) - _SPEC_KEYS
    if missing or unknown:
        raise ConfigError(f"node spec: missing {sorted(missing)}, unknown {sorted(unknown)}")
    family, _, size = str(spec["model"]).partition("-")
    model = named_config(family, size)
    topology = spec["topology_file"]
    # Bytes of one activation crossing an edge: (batch, seq, d_model) float32.
    activation_bytes = 4.0 * int(spec["batch_size"]) * int(spec["seq_len"]) * model.d_model
    flow = FlowConfig(**{"activation_bytes": activation_bytes, **spec["flow"]})
    config = LiveNodeConfig(
        name=spec["name"],
        role=spec["role"],
        stage=int(spec["stage"]),
        region=spec["region"],
        capacity=int(spec["capacity"]),
        key_path=Path(spec["key_path"]),
        model=model,
        stages=int(spec["stages"]),
        batch_size=int(spec["batch_size"]),
        seq_len=int(spec["seq_len"]),
        training=TrainingSettings(device="cpu", max_in_flight=max(8, int(spec["capacity"]))),
        flow=flow,
        run_id=int(spec["run_id"]),
        seed=int(spec["seed"]),
        bootstrap=tuple(spec["bootstrap"]),
        iterations=int(spec["iterations"]),
        batch=int(spec["batch"]),
        join=bool(spec["join"]),
        stall_timeout_s=float(spec["stall_timeout_s"]),
        discovery_period_s=float(spec["discovery_period_s"]),
        topology=Topology.from_json_file(Path(topology)) if topology else None,
        routing=str(spec["routing"]),
    )
    return config, Path(spec["status_file"])


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
    }
    if isinstance(role, DataRole):
        status["results"] = [dataclasses.asdict(r) for r in role.results]
        status["training"] = role.training
    else:
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


def arm_crash(node: LiveNode, crash_on: dict[str, Any]) -> None:
    """Die by SIGKILL when the first matching hop arrives (if this node wins the lock)."""
    direction = FORWARD if crash_on["direction"] == "forward" else BACKWARD
    iteration = int(crash_on["iteration"])
    lock = Path(crash_on["lock"])
    compute = node.plane.compute
    assert compute is not None, "the role sets compute before the node is started"

    async def crashing(header: HopHeader, frame: bytes) -> None:
        if header.direction == direction and header.iteration == iteration:
            try:
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # another node took this crash
            else:
                log.warning(
                    "fault injection: dying mid-%s of iteration %s",
                    crash_on["direction"],
                    iteration,
                )
                os.kill(os.getpid(), signal.SIGKILL)
        await compute(header, frame)

    node.plane.compute = crashing


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = Path(args[0]).name.removesuffix(".spec.json") if args else "node"
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("libp2p", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    try:
        spec = json.loads(Path(args[0]).read_text())
        config, status_file = config_from_spec(spec)
        if spec["start_file"]:  # a joiner, ready and waiting for its moment to enter
            while not Path(spec["start_file"]).exists():
                time.sleep(0.05)
        trio.run(run_process, config, status_file, spec["crash_on"])
    except (GwtfError, OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        print(f"gwtf-node: error: {exc}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, GwtfError) else 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
