"""The swarm file of `gwtf-node swarm` (TOML): its sections and their defaults, the checks that
stop a bad file before any process starts, and each node's settings (the ``gwtf.node.settings``
format) as the swarm writes them.

Swarm file::

    [run]    model = "gpt-tiny", stages = 2, batch_size = 2, seq_len = 32,
             microbatches_per_iteration = 4, iterations = 5, seed = 0, data = "" (a data set
             of `gwtf-node data prepare`, its folder or manifest: the data nodes train on it, the
             relays take its vocabulary without it, and the run commits to its hash; "": the
             shipped corpus), vocab_size = 0 (without a data set, the run's vocabulary, e.g.
             50257 for GPT-2's: the shipped corpus's bytes all lie in it; 0: the byte
             tokenizer's 256),
             routing = "gwtf" (or "swarm": SWARM's throughput-weighted wiring, for comparison)
    [swarm]  relays_per_stage = 2, capacity = 2 (a relay's microbatches in flight; the data
             nodes' together are relays_per_stage times that), regions = ["oregon"],
             topology = "" (a JSON file like gwtf/coordinator_free/sim/data/regions-10.json, or ""
             for no emulation), data_nodes = 1 (data nodes "data", "data-1", ...: each starts
             microbatches_per_iteration microbatches of its own per iteration),
             speeds = [1.0] (emulated GPU speeds, node.emulated_speed: the n-th relay of each
             stage gets the n-th, cyclically; e.g. [1.0, 0.6, 0.35] mixes slow GPUs into every
             stage like the simulator's heterogeneous scenarios; data nodes run at 1.0),
             hop_ms = 0.0 (node.emulated_hop_ms of every relay: a hop's compute lasts at least
             this long, then 1 / speed of it; e.g. 200 makes the relays' timing a GPU
             cluster's, not the shared CPUs'), cheaters = {} (nodes dishonest on purpose, by
             name: e.g. {"relay-1-0" = "claim-twice", "data" = "inflate-units"}; the modes of
             gwtf.node.receipts.cheats; the swarm audits and challenges every epoch before it
             settles)
    [flow]   any field of the node settings' flow section (decision_period_s,
             hop_ack_deadline_s, keepalive_interval_s, ...; see gwtf/node/settings.py)
    [chain]  enabled = true, rpc_url = "" (use a running chain instead of starting a devnet),
             host = "127.0.0.1" (the IP its own devnet serves on, which the nodes dial),
             devnet_file = "" (its contracts, as `gwtf-node devnet` writes them; without it the
             suite is deployed on rpc_url), stake_eth = 2.0, fund_eth = 3.0 (per node),
             reward_pool_eth = 10.0, epoch_length_s = 3600, audit_sample = 32 (hops of each
             certificate the audit re-executes from the relays' evidence; 0: none)
    [churn]  events = [{t = 8.0, kill = "relay-1-0"}, {t = 12.0, join = 1},
             {t = 14.0, join = "auto"} (it takes the bottleneck stage when it enters),
             {t = 2.0, stranger = 1}] (a stranger: a relay of that stage whose libp2p id is not
             registered on chain; with the chain on, every node refuses it),
             {t = 9.0, restart = "relay-1-0"} (a node killed earlier starts again with its
             identity and node.join = true: a relay loads its stage's state, a data node asks
             the run's data nodes to take it back in),
             crash_on = [{stage = 1, direction = "forward", iteration = 1}] (fault injection:
             the first relay of that stage to get such a hop, of that iteration or a later
             one, dies by SIGKILL mid-hop (never a
             cheater, nor a node a kill event names); with
             when = "after_ack" it dies once it has computed and acknowledged the hop, before
             sending its output on: the loss no sender sees; each rule takes one relay, so
             two rules on one stage take two of its relays),
             crash_rate_per_hour = 0.0 (relays killed at random at this rate), seed = 0
             (times count from the start of training: when the data node has its first flows)
"""

from __future__ import annotations

import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from gwtf.errors import ConfigError
from gwtf.node.chain.actions import RunModel
from gwtf.node.p2p.addresses import LOOPBACK
from gwtf.node.p2p.link_emulation import Topology
from gwtf.node.receipts.cheats import check_cheat
from gwtf.node.runtime.fault_injection import CRASH_MOMENTS
from gwtf.node.settings import AUTO_STAGE, FlowSettings, load_settings
from gwtf.node.swarm.audit import SwarmAudit
from gwtf.node.swarm.chain import ChainPlan, SwarmChain, node_key_file, password_file
from gwtf.node.swarm.pacing import Pacing
from gwtf.node.training.errors import ModelConfigError
from gwtf.node.training.partition import model_for_run
from gwtf.node.training.shards import run_vocab

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
    # A swarm's relays all start with it: a data node with none after this failed, and says so.
    "wait_for_peers_s": 240.0,
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
        "data",
        "vocab_size",
    },
    "swarm": {
        "relays_per_stage",
        "capacity",
        "regions",
        "topology",
        "data_nodes",
        "speeds",
        "hop_ms",
        "cheaters",
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


@dataclass(frozen=True)
class NodeHost:
    """Where a node of the swarm runs when not on this machine's loopback: a command prefix
    that puts its process there (e.g. ``ip netns exec NAMESPACE``), the addresses it listens
    on, and its region (link emulation) in place of ``[swarm] regions``'."""

    prefix: tuple[str, ...]
    listen: tuple[str, ...]
    region: str | None = None


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
    last_epoch: int = -1  # the last epoch settled on chain (-1: no epoch cycle)
    #: The audit of the epochs, each proved before it settled (``gwtf.node.swarm.audit``).
    audit: SwarmAudit | None = None
    #: Nodes placed elsewhere than this machine's loopback, by name (the internet test bed
    #: puts them in network namespaces); the others run here on 127.0.0.1.
    hosts: dict[str, NodeHost] = field(default_factory=dict)
    #: How far the data nodes may train (``gwtf.node.swarm.pacing``); None: no limit but theirs.
    pacing: Pacing | None = None


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
        "data": "",
        "vocab_size": 0,
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
        "cheaters": {},
        **raw.get("swarm", {}),
    }
    _check_run(run)
    _check_swarm(swarm)
    _check_cheaters(swarm, run["stages"])
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
            entrant_stage(run["stages"], event["join"])
        if "stranger" in event and entrant_stage(run["stages"], event["stranger"]) < 1:
            raise ConfigError("a stranger cannot ask the run for its stage; give it one")
    for rule in churn["crash_on"]:
        if not isinstance(rule, dict) or rule.get("direction") not in ("forward", "backward"):
            raise ConfigError(f'crash_on rule {rule} needs direction = "forward" or "backward"')
        if rule.get("when", "on_receipt") not in CRASH_MOMENTS:
            raise ConfigError(f"crash_on rule {rule}: 'when' is one of {', '.join(CRASH_MOMENTS)}")
    chain_plan = ChainPlan.from_section(raw.get("chain", {}))
    if swarm["cheaters"] and not (chain_plan.enabled and chain_plan.receipts):
        raise ConfigError("[swarm] cheaters cheat with receipts: they need [chain] enabled")
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
    for key in ("iterations", "batch_size", "microbatches_per_iteration"):
        if not _whole(run[key], 1):
            raise ConfigError(f"[run] {key} = {run[key]!r}: give a whole number, 1 or more")
    if not isinstance(run["data"], str):
        raise ConfigError('[run] data names a prepared data set\'s folder, like "data/"')
    if run["data"]:
        run["data"] = str(Path(run["data"]).resolve())
    if not _whole(run["vocab_size"], 0):
        raise ConfigError("[run] vocab_size is a whole number (0: the data set's or the bytes')")
    # The relays hold no data set: they are given its vocabulary (training.vocab_size).
    run["vocab_size"] = run_vocab(run["data"], run["vocab_size"])
    try:
        model_for_run(model, seq_len, stages, run["vocab_size"])
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


def _check_cheaters(swarm: dict[str, Any], stages: int) -> None:
    """Each cheater is a node of the swarm, with a cheat of its role."""
    cheaters = swarm["cheaters"]
    if not isinstance(cheaters, dict):
        raise ConfigError('[swarm] cheaters: give a table like {"relay-1-0" = "claim-twice"}')
    data = ["data"] + [f"data-{i}" for i in range(1, swarm["data_nodes"])]
    relays = [
        f"relay-{s}-{r}" for s in range(1, stages + 1) for r in range(swarm["relays_per_stage"])
    ]
    for name, mode in cheaters.items():
        if name not in data + relays:
            raise ConfigError(
                f"[swarm] cheaters: no node {name!r} in this swarm; name one of "
                f"{', '.join(data + relays)}"
            )
        check_cheat(str(mode), "data" if name in data else "relay")


def run_model_of(plan: SwarmPlan) -> RunModel:
    """What the swarm's run commits to on chain."""
    run = plan.run
    return RunModel(
        run["model"], run["stages"], run["vocab_size"], run["seq_len"], run["batch_size"],
        run["seed"],
    )  # fmt: skip


def speed_of(plan: SwarmPlan, index: int) -> float:
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
    """One node's settings (the sections of ``gwtf.node.settings``), as written to its toml file."""
    regions, run, chain = plan.swarm["regions"], plan.run, plan.chain
    host = plan.hosts.get(name)
    # The data nodes start as many microbatches at once as a stage of relays can hold.
    capacity = plan.swarm["capacity"]
    if role == "data":
        capacity = max(1, capacity * plan.swarm["relays_per_stage"] // plan.swarm["data_nodes"])
    if role == "relay":
        node = {"emulated_hop_ms": plan.swarm["hop_ms"], **node}
    if name in plan.swarm["cheaters"]:
        node = {"cheat": plan.swarm["cheaters"][name], **node}
    return {
        "node": {
            "name": name,
            "role": role,
            "stage": stage,
            "capacity": capacity,
            "key_file": str(node_key_file(plan.out_dir, name).resolve()),
            "password_file": str(password_file(plan.out_dir).resolve()),
            **node,
        },
        "p2p": {
            "region": host.region
            if host is not None and host.region
            else regions[index % len(regions)],
            "topology_file": str(Path(plan.swarm["topology"]).resolve())
            if plan.swarm["topology"]
            else "",
            "bootstrap_peers": [],
            # A local swarm: every node on this machine only, unless placed elsewhere.
            "listen": list(host.listen) if host is not None else [LOOPBACK],
            "discovery_period_s": 1.0,
        },
        "chain": {
            "admission": chain is not None,
            "run_id": chain.run_id if chain else 1,
            "rpc_url": chain.rpc_url if chain else "",
            "devnet_file": str(chain.devnet_file.resolve()) if chain else ".gwtf/devnet.json",
            "receipts": chain is not None and chain.plan.receipts,
            # The swarm's epochs pass in seconds (it moves its devnet's clock): read it often.
            "clock_period_s": 0.5,
            "report_period_s": 1.0,
            "wallet_file": str(chain.wallet_file(name, data_node=role == "data").resolve())
            if chain is not None and chain.plan.receipts
            else "",
            "evidence_dir": str((plan.out_dir / f"{name}.evidence").resolve()),
        },
        # One database per node; a restarted node opens its own again.
        "db": {"url": f"sqlite:///{(plan.out_dir / f'{name}.sqlite').resolve()}"},
        # Each node's local API on a free port (its status file says which).
        "api": {
            "port": 0,
            "token_file": str((plan.out_dir / f"{name}.api-token").resolve()),
            "chain_period_s": 1.0,
        },
        "training": {
            "model": run["model"],
            "stages": run["stages"],
            "batch_size": run["batch_size"],
            "seq_len": run["seq_len"],
            "seed": run["seed"],
            **(
                {"data": run["data"]}
                if role == "data" and run["data"]
                else {"vocab_size": run["vocab_size"]}
            ),
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


def crash_rules(plan: SwarmPlan, stage: int) -> list[dict[str, Any]]:
    """The fault injections a relay of ``stage`` is armed with, one lock each: the first relay
    of the stage to meet a rule's hop dies of it, so two rules on one stage take two of its
    relays."""
    return [
        {
            "direction": rule["direction"],
            "iteration": rule["iteration"],
            "when": rule.get("when", "on_receipt"),
            "lock": str(plan.out_dir / f"crash-{index}.lock"),
        }
        for index, rule in enumerate(plan.churn["crash_on"])
        if int(rule["stage"]) == stage
    ]


def entrant_stage(stages: int, stage: Any) -> int:
    """A joiner's or stranger's stage: 1..stages, or "auto" for the bottleneck when it enters."""
    if stage == "auto":
        return AUTO_STAGE
    if isinstance(stage, int) and not isinstance(stage, bool) and 1 <= stage <= stages:
        return stage
    raise ConfigError(
        f'churn event stage {stage!r}: use a stage 1..{stages}, or "auto" to join the '
        "bottleneck stage"
    )
