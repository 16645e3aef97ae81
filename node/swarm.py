"""`gwtf-node swarm`: a whole training swarm on this machine, one OS process per node.

Reads a swarm file (TOML); starts a chain, opens the run and registers every node on it
(``node.swarm_chain``; on by default, ``[chain] enabled = false`` for a quick chain-less run);
writes each node's settings file (``<out>/<name>.toml``, the ``node.settings`` format) and starts
the data node, then the relays, each as ``python -m node.runtime.node_process`` on 127.0.0.1 with
the topology's link emulation and, with the chain on, admission: a node serves only peers that
the chain binds to a staked node of the run. It kills nodes with SIGKILL and starts joiners
(registered just before they enter) on the churn schedule; streams the nodes' logs with a name
prefix; and when the data node has trained its iterations writes a JSON summary (iterations,
microbatches, loss per iteration, throughput, crashes, joins, recovered hops, and the chain: RPC
URL, run id, registered nodes, refused peers).

Swarm file::

    [run]    model = "gpt-tiny", stages = 2, batch_size = 2, seq_len = 32,
             microbatches_per_iteration = 4, iterations = 5, seed = 0,
             routing = "gwtf" (or "swarm": SWARM's throughput-weighted wiring, for comparison)
    [swarm]  relays_per_stage = 2, capacity = 2 (a relay's microbatches in flight; the data
             nodes' together are relays_per_stage times that), regions = ["oregon"],
             topology = "" (a JSON file like coordinator_free/sim/data/regions-10.json, or ""
             for no emulation), data_nodes = 1 (data nodes "data", "data-1", ...: each starts
             microbatches_per_iteration microbatches of its own per iteration),
             speeds = [1.0] (emulated GPU speeds, node.emulated_speed: the n-th relay of each
             stage gets the n-th, cyclically; e.g. [1.0, 0.6, 0.35] mixes slow GPUs into every
             stage like the simulator's heterogeneous scenarios; data nodes run at 1.0),
             hop_ms = 0.0 (node.emulated_hop_ms of every relay: a hop's compute lasts at least
             this long, then 1 / speed of it; e.g. 200 makes the relays' timing a GPU
             cluster's, not the shared CPUs')
    [flow]   any field of the node settings' flow section (decision_period_s,
             hop_ack_deadline_s, keepalive_interval_s, ...; see node/settings.py)
    [chain]  enabled = true, rpc_url = "" (use a running chain instead of starting a devnet),
             devnet_file = "" (its contracts, as `gwtf-node devnet` writes them; without it the
             suite is deployed on rpc_url), stake_eth = 2.0, fund_eth = 3.0 (per node),
             reward_pool_eth = 10.0, epoch_length_s = 3600
    [churn]  events = [{t = 8.0, kill = "relay-1-0"}, {t = 12.0, join = 1},
             {t = 14.0, join = "auto"} (it takes the bottleneck stage when it enters),
             {t = 2.0, stranger = 1}] (a stranger: a relay of that stage whose libp2p id is not
             registered on chain; with the chain on, every node refuses it),
             {t = 9.0, restart = "relay-1-0"} (a node killed earlier starts again with its
             identity and node.join = true: a relay loads its stage's state, a data node asks
             the run's data nodes to take it back in),
             crash_on = [{stage = 1, direction = "forward", iteration = 1}] (fault injection:
             the first relay of that stage to get such a hop dies by SIGKILL mid-hop; with
             when = "after_ack" it dies once it has computed and acknowledged the hop, before
             sending its output on: the loss no sender sees),
             crash_rate_per_hour = 0.0 (relays killed at random at this rate), seed = 0
             (times count from the start of training: when the data node has its first flows)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import tomli_w

from gwtf.errors import ConfigError, GwtfError
from node.p2p.link_emulation import Topology
from node.runtime.fault_injection import CRASH_MOMENTS
from node.settings import AUTO_STAGE, FlowSettings, load_settings
from node.swarm_chain import ChainPlan, SwarmChain, chain_facts, child_env, start_swarm_chain
from node.training.errors import ModelConfigError
from node.training.partition import model_for_run

_DEFAULT_FLOW = {
    "decision_period_s": 0.5,
    "keepalive_interval_s": 1.0,
    # Also the data node's liveness probe deadline before the relays average and step: at a
    # load of 12 on two cores, 1 s was missed by every relay, which then never stepped.
    "keepalive_timeout_s": 3.0,
    "keepalive_misses": 3,
    "hop_ack_deadline_s": 5.0,
    # Every process loads torch, libp2p and web3 at once on a few shared cores: on a busy
    # two-core machine the last relay can take a minute or more to come up.
    "setup_timeout_s": 240.0,
}
_SECTIONS: dict[str, set[str]] = {
    "run": {
        "routing",
        "model",
        "stages",
        "batch_size",
        "seq_len",
        "microbatches_per_iteration",
        "iterations",
        "seed",
    },
    "swarm": {
        "relays_per_stage",
        "capacity",
        "regions",
        "topology",
        "data_nodes",
        "speeds",
        "hop_ms",
    },
    "flow": set(FlowSettings.__dataclass_fields__) - {"routing"},
    "chain": set(ChainPlan.__dataclass_fields__),
    "churn": {"events", "crash_rate_per_hour", "seed", "crash_on"},
}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    status_file: Path
    killed: bool = False


@dataclass
class SwarmPlan:
    run: dict[str, Any]
    swarm: dict[str, Any]
    flow: dict[str, Any]
    churn: dict[str, Any]
    out_dir: Path
    chain_plan: ChainPlan = field(default_factory=ChainPlan)
    procs: dict[str, Proc] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    joins: list[dict[str, Any]] = field(default_factory=list)
    chain: SwarmChain | None = None
    strangers: dict[str, str] = field(default_factory=dict)  # name -> peer id
    #: The last status of each killed node that was started again (its first life's work).
    retired: list[dict[str, Any]] = field(default_factory=list)


def load_swarm_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read swarm file {path}: {exc}") from exc
    for section, value in raw.items():
        if section not in _SECTIONS or not isinstance(value, dict):
            raise ConfigError(f"swarm file {path}: unknown section [{section}]")
        unknown = set(value) - _SECTIONS[section]
        if unknown:
            raise ConfigError(f"swarm file {path}: unknown keys {sorted(unknown)} in [{section}]")
    return raw


def plan_from_file(path: Path, out_dir: Path) -> SwarmPlan:
    raw = load_swarm_file(path)
    run = {
        "model": "gpt-tiny",
        "stages": 2,
        "batch_size": 2,
        "seq_len": 32,
        "microbatches_per_iteration": 4,
        "iterations": 5,
        "seed": 0,
        "routing": "gwtf",
        **raw.get("run", {}),
    }
    swarm = {
        "relays_per_stage": 2,
        "capacity": 2,
        "regions": ["oregon"],
        "topology": "",
        "data_nodes": 1,
        "speeds": [1.0],
        "hop_ms": 0.0,
        **raw.get("swarm", {}),
    }
    _check_run(run)
    _check_swarm(swarm)
    churn = {
        "events": [],
        "crash_rate_per_hour": 0.0,
        "seed": 0,
        "crash_on": [],
        **raw.get("churn", {}),
    }
    flow = {**_DEFAULT_FLOW, **raw.get("flow", {})}
    killed: set[str] = set()
    for event in sorted(churn["events"], key=_event_time):
        kinds = {"kill", "join", "stranger", "restart"}
        if not kinds & set(event):
            raise ConfigError(
                f"churn event {event} names none of 'kill', 'join', 'stranger', 'restart'"
            )
        if "kill" in event:
            killed.add(str(event["kill"]))
        if "restart" in event and str(event["restart"]) not in killed:
            raise ConfigError(f"churn event {event}: restart a node only after a kill event for it")
        if "join" in event:
            _entrant_stage(run["stages"], event["join"])
        if "stranger" in event and _entrant_stage(run["stages"], event["stranger"]) < 1:
            raise ConfigError("a stranger cannot ask the run for its stage; give it one")
    for rule in churn["crash_on"]:
        if not isinstance(rule, dict) or rule.get("direction") not in ("forward", "backward"):
            raise ConfigError(f'crash_on rule {rule} needs direction = "forward" or "backward"')
        if rule.get("when", "on_receipt") not in CRASH_MOMENTS:
            raise ConfigError(f"crash_on rule {rule}: 'when' is one of {', '.join(CRASH_MOMENTS)}")
    chain_plan = ChainPlan.from_section(raw.get("chain", {}))
    if not chain_plan.enabled and any("stranger" in event for event in churn["events"]):
        raise ConfigError("a 'stranger' churn event tests admission: it needs [chain] enabled")
    out_dir.mkdir(parents=True, exist_ok=True)
    return SwarmPlan(run, swarm, flow, churn, out_dir, chain_plan)


def _check_run(run: dict[str, Any]) -> None:
    """The model, sequence length and stage count fit together (each node would find out only
    when it builds its part)."""
    model, seq_len, stages = run["model"], run["seq_len"], run["stages"]
    if not isinstance(model, str) or not all(_whole(v, 1) for v in (seq_len, stages)):
        raise ConfigError('[run] model is a name like "gpt-tiny", seq_len and stages whole numbers')
    try:
        model_for_run(model, seq_len, stages)
    except ModelConfigError as exc:
        raise ConfigError(f"[run] {exc}") from exc


def _check_swarm(swarm: dict[str, Any]) -> None:
    for key in ("relays_per_stage", "data_nodes"):
        if not _whole(swarm[key], 1):
            raise ConfigError(f"[swarm] {key} = {swarm[key]!r}: give a whole number, 1 or more")
    speeds, regions = swarm["speeds"], swarm["regions"]
    if not isinstance(speeds, list) or not speeds or not all(_speed(v) for v in speeds):
        raise ConfigError(
            f"[swarm] speeds = {speeds!r}: give a list of speeds above 0 and at most 1, "
            "like [1.0, 0.6, 0.35]"
        )
    if not isinstance(regions, list) or not regions or not all(isinstance(r, str) for r in regions):
        raise ConfigError(f'[swarm] regions = {regions!r}: give a list like ["oregon", "tokyo"]')
    if swarm["topology"]:
        topology_file = Path(swarm["topology"])
        if not topology_file.exists():
            raise ConfigError(f"topology file {topology_file} does not exist")
        known = Topology.from_json_file(topology_file).regions
        unknown = sorted(set(regions) - set(known))
        if unknown:
            raise ConfigError(
                f"[swarm] regions {unknown} are not in {topology_file}; choose from {list(known)}"
            )


def _speed_of(plan: SwarmPlan, index: int) -> float:
    """The emulated speed of the ``index``-th relay (``[swarm] speeds``, cyclically)."""
    speeds = plan.swarm["speeds"]
    return float(speeds[index % len(speeds)])


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _speed(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


def _event_time(event: Any) -> float:
    """A churn event's time ``t`` (seconds from the start of training)."""
    t = event.get("t") if isinstance(event, dict) else None
    if not isinstance(t, int | float) or isinstance(t, bool):
        raise ConfigError(f"churn event {event} needs a time t in seconds, e.g. t = 4.0")
    return float(t)


def node_settings(
    plan: SwarmPlan, name: str, role: str, stage: int, index: int, **node: Any
) -> dict[str, Any]:
    """One node's settings (the sections of ``node.settings``), as written to its toml file."""
    regions, run, chain = plan.swarm["regions"], plan.run, plan.chain
    # The data nodes start as many microbatches at once as a stage of relays can hold.
    capacity = plan.swarm["capacity"]
    if role == "data":
        capacity = max(1, capacity * plan.swarm["relays_per_stage"] // plan.swarm["data_nodes"])
    key_file = chain.identity_path(name) if chain else plan.out_dir / f"{name}.key"
    if role == "relay":
        node = {"emulated_hop_ms": plan.swarm["hop_ms"], **node}
    return {
        "node": {"name": name, "role": role, "stage": stage, "capacity": capacity, **node},
        "p2p": {
            "key_file": str(key_file.resolve()),
            "region": regions[index % len(regions)],
            "topology_file": str(Path(plan.swarm["topology"]).resolve())
            if plan.swarm["topology"]
            else "",
            "bootstrap_peers": [],
            "discovery_period_s": 1.0,
        },
        "chain": {
            "admission": chain is not None,
            "run_id": chain.run_id if chain else 1,
            "rpc_url": chain.rpc_url if chain else "",
            "devnet_file": str(chain.devnet_file.resolve()) if chain else ".gwtf/devnet.json",
        },
        "training": {
            "model": run["model"],
            "stages": run["stages"],
            "batch_size": run["batch_size"],
            "seq_len": run["seq_len"],
            "seed": run["seed"],
            "iterations": run["iterations"],
            "microbatches_per_iteration": run["microbatches_per_iteration"],
            "stall_timeout_s": 60.0,
            "device": "cpu",
            "max_in_flight": max(8, capacity),
        },
        "flow": {"routing": run["routing"], **plan.flow},
    }


def write_node_settings(plan: SwarmPlan, settings: dict[str, Any]) -> Path:
    """Write a node's settings file and load it back, so a bad value stops the swarm early."""
    path = plan.out_dir / f"{settings['node']['name']}.toml"
    path.write_text(tomli_w.dumps(settings))
    try:
        load_settings(env={}, config_file=path)
    except ConfigError as exc:
        # The value came from the swarm file (or its defaults): point there, not at our copy.
        message = str(exc).replace(str(path), "the swarm file")
        raise ConfigError(f"{message} (node {settings['node']['name']})") from exc
    return path


def _crash_on(plan: SwarmPlan, stage: int) -> dict[str, Any] | None:
    for index, rule in enumerate(plan.churn["crash_on"]):
        if int(rule["stage"]) == stage:
            lock = plan.out_dir / f"crash-{index}.lock"
            return {
                "direction": rule["direction"],
                "iteration": rule["iteration"],
                "when": rule.get("when", "on_receipt"),
                "lock": str(lock),
            }
    return None


def start_node(
    plan: SwarmPlan,
    settings: dict[str, Any],
    log: IO[bytes] | None,
    start_file: Path | None = None,
) -> Proc:
    name, stage = settings["node"]["name"], int(settings["node"]["stage"])
    config = write_node_settings(plan, settings)
    status_file = plan.out_dir / f"{name}.status.json"
    status_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "node.runtime.node_process", "--config", str(config)]
    command += ["--status-file", str(status_file)]
    if start_file is not None:
        command += ["--start-file", str(start_file)]
    crash_on = _crash_on(plan, stage) if settings["node"]["role"] == "relay" else None
    if crash_on is not None:
        command += ["--crash-on", json.dumps(crash_on)]
    popen = subprocess.Popen(
        command, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT, env=child_env()
    )
    proc = Proc(name, popen, status_file)
    plan.procs[proc.name] = proc
    return proc


def read_status(proc: Proc) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = json.loads(proc.status_file.read_text())
        return status
    except (OSError, json.JSONDecodeError):
        return None


def wait_for_address(proc: Proc, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = read_status(proc)
        if status is not None:
            return str(status["address"])
        if proc.popen.poll() is not None:
            raise GwtfError(
                f"node {proc.name} exited with code {proc.popen.returncode}; see its log"
            )
        time.sleep(0.1)
    raise GwtfError(f"node {proc.name} did not start within {timeout_s:g} s; see its log")


def kill(plan: SwarmPlan, name: str, at_s: float) -> None:
    proc = plan.procs.get(name)
    if proc is None or proc.killed or proc.popen.poll() is not None:
        return
    os.kill(proc.popen.pid, signal.SIGKILL)
    proc.killed = True
    plan.crashes.append({"t": round(at_s, 2), "node": name})


def run_swarm(
    plan: SwarmPlan, log: IO[bytes] | None = None, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Run the swarm to the end of the data node's iterations; returns the summary."""
    stages, per_stage = plan.run["stages"], plan.swarm["relays_per_stage"]
    started = time.monotonic()
    # A previous run in this folder leaves go files and crash locks that would start joiners at
    # once and disarm fault injection.
    for stale in (*plan.out_dir.glob("*.go"), *plan.out_dir.glob("crash-*.lock")):
        stale.unlink()
    try:
        if plan.chain_plan.enabled:
            plan.chain = start_swarm_chain(
                plan.chain_plan, plan.out_dir, stages, str(plan.run["model"]), log
            )
        data_nodes = _start_data_nodes(plan, log)
        data = data_nodes[0]
        bootstrap = [wait_for_address(data, 60.0)]
        relay_names: list[str] = []
        for stage in range(1, stages + 1):
            for replica in range(per_stage):
                name = f"relay-{stage}-{replica}"
                settings = node_settings(
                    plan,
                    name,
                    "relay",
                    stage,
                    len(plan.procs),
                    emulated_speed=_speed_of(plan, replica),
                )
                settings["p2p"]["bootstrap_peers"] = bootstrap
                _register(plan, settings)
                start_node(plan, settings, log)
                relay_names.append(name)
        events = sorted(plan.churn["events"], key=lambda e: float(e["t"]))
        _prestart_entrants(plan, events, bootstrap, log)
        rng = random.Random(plan.churn["seed"])
        rate_per_s = float(plan.churn["crash_rate_per_hour"]) / 3600.0 * len(relay_names)
        training_from = _wait_for_training(data, started + timeout_s)
        next_random = training_from + (
            rng.expovariate(rate_per_s) if rate_per_s > 0 else float("inf")
        )
        while any(plan.procs[p.name].popen.poll() is None for p in data_nodes):
            now = time.monotonic()
            if now - started > timeout_s:
                raise GwtfError(f"the swarm did not finish within {timeout_s:g} s")
            while events and now - training_from >= float(events[0]["t"]):
                _apply(plan, events.pop(0), now - training_from, log)
            if now >= next_random:
                alive = [n for n in relay_names if not plan.procs[n].killed]
                if alive:
                    kill(plan, rng.choice(alive), now - training_from)
                next_random = now + rng.expovariate(rate_per_s)
            time.sleep(0.05)
        time.sleep(1.0)  # the relays' last status (their final step) lands within 0.25 s
        _record_injected_crashes(plan)
        return summarise(plan, [plan.procs[p.name] for p in data_nodes], time.monotonic() - started)
    finally:
        for proc in plan.procs.values():
            if proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in plan.procs.values():
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
        if plan.chain is not None:
            plan.chain.stop()


def _start_data_nodes(plan: SwarmPlan, log: IO[bytes] | None) -> list[Proc]:
    """Start the data nodes ("data", then "data-1", ... bootstrapping from it), each with its
    shard of every iteration."""
    count: int = plan.swarm["data_nodes"]
    procs: list[Proc] = []
    bootstrap: list[str] = []
    for shard in range(count):
        name = "data" if shard == 0 else f"data-{shard}"
        settings = node_settings(plan, name, "data", 0, shard)
        settings["training"].update(data_nodes=count, data_shard=shard)
        settings["p2p"]["bootstrap_peers"] = bootstrap
        _register(plan, settings)
        procs.append(start_node(plan, settings, log))
        if shard == 0 and count > 1:
            bootstrap = [wait_for_address(procs[0], 60.0)]
    return procs


def _register(plan: SwarmPlan, settings: dict[str, Any]) -> None:
    """Put the node on chain (staked, its libp2p id bound, joined to the run) before it starts."""
    if plan.chain is not None:
        plan.chain.register(settings["node"]["name"], int(settings["node"]["capacity"]))


def _prestart_entrants(
    plan: SwarmPlan, events: list[dict[str, Any]], bootstrap: list[str], log: IO[bytes] | None
) -> None:
    """Start joiners' and strangers' processes now (loading torch takes seconds); each waits
    for its go file, which the churn schedule creates at the event's time."""
    counts = {"joiner": 0, "stranger": 0}
    for event in (e for e in events if "join" in e or "stranger" in e):
        kind = "joiner" if "join" in event else "stranger"
        stage = _entrant_stage(plan.run["stages"], event["join" if "join" in event else "stranger"])
        label = "auto" if stage == AUTO_STAGE else stage
        event["_name"] = name = f"{kind}-{label}-{counts[kind]}"
        counts[kind] += 1
        speed = _speed_of(plan, len(plan.procs))
        settings = node_settings(
            plan, name, "relay", stage, len(plan.procs), join=kind == "joiner", emulated_speed=speed
        )
        settings["p2p"]["bootstrap_peers"] = bootstrap
        if kind == "stranger" and plan.chain is not None:
            plan.strangers[name] = plan.chain.peer_id_of(name)
        start_node(plan, settings, log, start_file=plan.out_dir / f"{name}.go")


def _entrant_stage(stages: int, stage: Any) -> int:
    """A joiner's or stranger's stage: 1..stages, or "auto" for the bottleneck when it enters."""
    if stage == "auto":
        return AUTO_STAGE
    if isinstance(stage, int) and not isinstance(stage, bool) and 1 <= stage <= stages:
        return stage
    raise ConfigError(
        f'churn event stage {stage!r}: use a stage 1..{stages}, or "auto" to join the '
        "bottleneck stage"
    )


def _wait_for_training(data: Proc, deadline: float) -> float:
    """When the data node starts training (it has flows); churn times count from there."""
    while time.monotonic() < deadline and data.popen.poll() is None:
        status = read_status(data)
        if status is not None and status.get("training"):
            return time.monotonic()
        time.sleep(0.1)
    return time.monotonic()


def _apply(plan: SwarmPlan, event: dict[str, Any], at_s: float, log: IO[bytes] | None) -> None:
    if "kill" in event:
        kill(plan, str(event["kill"]), at_s)
        return
    if "restart" in event:
        _restart(plan, str(event["restart"]), at_s, log)
        return
    # The entrant's process was started (and has loaded torch) at launch; now it enters. A
    # joiner is registered on chain first; a stranger never is.
    name = str(event["_name"])
    if "join" in event and plan.chain is not None:
        plan.chain.register(name, int(plan.swarm["capacity"]))
    (plan.out_dir / f"{name}.go").touch()
    if "join" in event:
        plan.joins.append({"t": round(at_s, 2), "node": name, "stage": event["join"]})


def _restart(plan: SwarmPlan, name: str, at_s: float, log: IO[bytes] | None) -> None:
    """Start a killed node again from its settings file, with its identity, as a joiner."""
    proc = plan.procs.get(name)
    if proc is None or proc.popen.poll() is None:
        return  # never started, or still running (its kill came later than planned)
    status = read_status(proc)
    if status is not None:
        plan.retired.append(status)
    settings = tomllib.loads((plan.out_dir / f"{name}.toml").read_text())
    settings["node"]["join"] = True
    start_node(plan, settings, log)
    plan.joins.append({"t": round(at_s, 2), "node": name, "restart": True})


def _record_injected_crashes(plan: SwarmPlan) -> None:
    """Nodes that fault injection killed (they died by SIGKILL, not by the schedule)."""
    for name, proc in plan.procs.items():
        if not proc.killed and proc.popen.poll() == -signal.SIGKILL:
            proc.killed = True
            plan.crashes.append({"t": None, "node": name, "injected": True})


def summarise(plan: SwarmPlan, data_nodes: list[Proc], wall_s: float) -> dict[str, Any]:
    """The run's summary. The first data node must have finished; another one may have been
    killed on the schedule (its iterations until then count)."""
    data = data_nodes[0]
    status = read_status(data)
    if data.popen.returncode != 0 or status is None or not status.get("finished"):
        raise GwtfError(f"the data node failed (exit {data.popen.returncode}); see its log")
    for proc in data_nodes[1:]:
        if not proc.killed and proc.popen.returncode != 0:
            raise GwtfError(
                f"data node {proc.name} failed (exit {proc.popen.returncode}); see its log"
            )
    results = status["results"]
    statuses = {name: read_status(proc) for name, proc in plan.procs.items()}
    stats = [s["stats"] for s in statuses.values() if s is not None]
    data_statuses = [statuses[proc.name] or {} for proc in data_nodes] + [
        status for status in plan.retired if status.get("role") == "data"
    ]
    all_results = [r for status in data_statuses for r in status.get("results", [])]
    microbatches = sum(r["microbatches"] for r in all_results)
    train_s = sum(r["duration_s"] for r in results)
    losses: dict[int, list[float]] = {}
    for result in all_results:
        losses.setdefault(result["iteration"], []).append(result["loss"])
    summary = {
        "iterations": len(results),
        "microbatches": microbatches,
        # The mean over the data nodes that finished the iteration (each over its own shard).
        "loss_per_iteration": [round(sum(v) / len(v), 5) for _, v in sorted(losses.items())],
        "throughput_mb_per_s": round(microbatches / train_s, 4) if train_s else 0.0,
        "training_time_s": round(train_s, 3),
        "wall_time_s": round(wall_s, 3),
        "crashes": plan.crashes,
        "joins": plan.joins,
        "recovered_hops": {
            "forward_resends": sum(s["forward_resends"] for s in stats),
            "backward_repairs": sum(s["backward_repairs"] for s in stats),
            "forward_repairs": sum(s.get("forward_repairs", 0) for s in stats),
            "gradient_resumes": sum(s.get("gradient_resumes", 0) for s in stats),
            "restarted_microbatches": sum(r["restarts"] for r in all_results),
        },
        # (iteration, stage) pairs in which no replica of the stage stepped: the relays of that
        # stage trained nothing that iteration, which a healthy swarm never shows.
        "stages_not_stepped": sum(s.get("stages_not_stepped", 0) for s in stats),
        # Data nodes the others left out while they were alive, which asked back in.
        "data_nodes_taken_back_in": sum(s.get("taken_back_in", 0) for s in stats),
        # Microbatches data nodes started on flows another data node lent them.
        "microbatches_on_loans": sum(s.get("microbatches_on_loans", 0) for s in stats),
        "relays": {
            name: {key: s.get(key) for key in ("stage", "step", "state_digest", "hops_recorded")}
            for name, s in statuses.items()
            if s is not None
            and s.get("role") != "data"
            and name not in plan.strangers
            and not plan.procs[name].killed
        },
        "data_nodes": {
            proc.name: {key: status.get(key) for key in ("step", "state_digest")}
            for proc in data_nodes
            if (status := statuses[proc.name]) is not None and not proc.killed
        },
        "chain": chain_facts(plan.chain, plan.strangers, statuses),
    }
    (plan.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
