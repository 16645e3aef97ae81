"""`gwtf-node swarm`: a whole training swarm on this machine, one OS process per node.

Reads a swarm file (TOML), starts the data node, then the relays, each as
``python -m node.runtime.node_process`` on 127.0.0.1 with the topology's link emulation; kills
nodes with SIGKILL and starts joiners on the churn schedule; streams the nodes' logs with a name
prefix; and when the data node has trained its iterations writes a JSON summary (iterations,
microbatches, loss per iteration, throughput, crashes, joins, recovered hops).

Swarm file::

    [run]    model = "gpt-tiny", stages = 2, batch_size = 2, seq_len = 32,
             microbatches_per_iteration = 4, iterations = 5, seed = 0,
             routing = "gwtf" (or "swarm": SWARM's throughput-weighted wiring, for comparison)
    [swarm]  relays_per_stage = 2, capacity = 2 (a relay's microbatches in flight; the data
             node's is relays_per_stage times that), regions = ["oregon"], topology = "" (a JSON
             file like coordinator_free/sim/data/regions-10.json, or "" for no emulation)
    [flow]   any FlowConfig field (decision_period_s, ack_deadline_s, ...)
    [churn]  events = [{t = 8.0, kill = "relay-1-0"}, {t = 12.0, join = 1}],
             crash_on = [{stage = 1, direction = "forward", iteration = 1}] (fault injection:
             the first relay of that stage to get such a hop dies by SIGKILL mid-hop),
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

from gwtf.errors import ConfigError, GwtfError

_DEFAULT_FLOW = {
    "decision_period_s": 0.5,
    "keepalive_interval_s": 1.0,
    "keepalive_timeout_s": 1.0,
    "keepalive_misses": 3,
    "ack_deadline_s": 5.0,
}
_SECTIONS = {
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
    "swarm": {"relays_per_stage", "capacity", "regions", "topology"},
    "flow": None,  # FlowConfig's own fields; FlowConfig validates them
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
    procs: dict[str, Proc] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    joins: list[dict[str, Any]] = field(default_factory=list)


def load_swarm_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read swarm file {path}: {exc}") from exc
    for section, value in raw.items():
        if section not in _SECTIONS or not isinstance(value, dict):
            raise ConfigError(f"swarm file {path}: unknown section [{section}]")
        allowed = _SECTIONS[section]
        unknown = set(value) - allowed if allowed is not None else set()
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
        **raw.get("swarm", {}),
    }
    churn = {
        "events": [],
        "crash_rate_per_hour": 0.0,
        "seed": 0,
        "crash_on": [],
        **raw.get("churn", {}),
    }
    flow = {**_DEFAULT_FLOW, **raw.get("flow", {})}
    if swarm["topology"] and not Path(swarm["topology"]).exists():
        raise ConfigError(f"topology file {swarm['topology']} does not exist")
    out_dir.mkdir(parents=True, exist_ok=True)
    return SwarmPlan(run, swarm, flow, churn, out_dir)


def _spec(
    plan: SwarmPlan, name: str, role: str, stage: int, index: int, **extra: Any
) -> dict[str, Any]:
    regions = plan.swarm["regions"]
    run = plan.run
    return {
        "name": name,
        "role": role,
        "stage": stage,
        "region": regions[index % len(regions)],
        # A data node starts as many microbatches at once as a stage of relays can hold.
        "capacity": plan.swarm["capacity"]
        * (plan.swarm["relays_per_stage"] if role == "data" else 1),
        "key_path": str(plan.out_dir / f"{name}.key"),
        "model": run["model"],
        "stages": run["stages"],
        "batch_size": run["batch_size"],
        "seq_len": run["seq_len"],
        "run_id": 1,
        "seed": run["seed"],
        "bootstrap": [],
        "iterations": run["iterations"],
        "batch": run["microbatches_per_iteration"],
        "flow": {
            "stages": run["stages"],
            "activation_bytes": 4.0 * run["batch_size"] * run["seq_len"] * 64,
            **plan.flow,
        },
        "join": False,
        "stall_timeout_s": 60.0,
        "discovery_period_s": 1.0,
        "topology_file": plan.swarm["topology"] or None,
        "status_file": str(plan.out_dir / f"{name}.status.json"),
        "crash_on": _crash_on(plan, stage),
        "start_file": None,
        "routing": run["routing"],
        **extra,
    }


def _crash_on(plan: SwarmPlan, stage: int) -> dict[str, Any] | None:
    for index, rule in enumerate(plan.churn["crash_on"]):
        if int(rule["stage"]) == stage:
            lock = plan.out_dir / f"crash-{index}.lock"
            return {
                "direction": rule["direction"],
                "iteration": rule["iteration"],
                "lock": str(lock),
            }
    return None


def start_node(plan: SwarmPlan, spec: dict[str, Any], log: IO[bytes] | None) -> Proc:
    spec_file = plan.out_dir / f"{spec['name']}.spec.json"
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        [sys.executable, "-m", "node.runtime.node_process", str(spec_file)],
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env=env,
    )
    proc = Proc(spec["name"], popen, Path(spec["status_file"]))
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
    try:
        data = start_node(plan, _spec(plan, "data", "data", 0, 0), log)
        bootstrap = [wait_for_address(data, 60.0)]
        relay_names: list[str] = []
        for stage in range(1, stages + 1):
            for replica in range(per_stage):
                name = f"relay-{stage}-{replica}"
                spec = _spec(plan, name, "relay", stage, len(relay_names) + 1, bootstrap=bootstrap)
                start_node(plan, spec, log)
                relay_names.append(name)
        events = sorted(plan.churn["events"], key=lambda e: float(e["t"]))
        for index, event in enumerate(e for e in events if "join" in e):
            event["_name"] = name = f"joiner-{int(event['join'])}-{index}"
            go_file = str(plan.out_dir / f"{name}.go")
            spec = _spec(
                plan,
                name,
                "relay",
                int(event["join"]),
                len(plan.procs),
                bootstrap=bootstrap,
                join=True,
                start_file=go_file,
            )
            start_node(plan, spec, log)
        rng = random.Random(plan.churn["seed"])
        rate_per_s = float(plan.churn["crash_rate_per_hour"]) / 3600.0 * len(relay_names)
        training_from = _wait_for_training(data, started + timeout_s)
        next_random = training_from + (
            rng.expovariate(rate_per_s) if rate_per_s > 0 else float("inf")
        )
        while data.popen.poll() is None:
            now = time.monotonic()
            if now - started > timeout_s:
                raise GwtfError(f"the swarm did not finish within {timeout_s:g} s")
            while events and now - training_from >= float(events[0]["t"]):
                event = events.pop(0)
                _apply(plan, event, now - training_from, bootstrap, log)
            if now >= next_random:
                alive = [n for n in relay_names if not plan.procs[n].killed]
                if alive:
                    kill(plan, rng.choice(alive), now - training_from)
                next_random = now + rng.expovariate(rate_per_s)
            time.sleep(0.05)
        time.sleep(1.0)  # the relays' last status (their final step) lands within 0.25 s
        _record_injected_crashes(plan)
        return summarise(plan, data, time.monotonic() - started)
    finally:
        for proc in plan.procs.values():
            if proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in plan.procs.values():
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()


def _wait_for_training(data: Proc, deadline: float) -> float:
    """When the data node starts training (it has flows); churn times count from there."""
    while time.monotonic() < deadline and data.popen.poll() is None:
        status = read_status(data)
        if status is not None and status.get("training"):
            return time.monotonic()
        time.sleep(0.1)
    return time.monotonic()


def _apply(
    plan: SwarmPlan, event: dict[str, Any], at_s: float, bootstrap: list[str], log: IO[bytes] | None
) -> None:
    if "kill" in event:
        kill(plan, str(event["kill"]), at_s)
    elif "join" in event:
        # The joiner's process was started (and has loaded torch) at launch; now it joins.
        name = str(event["_name"])
        (plan.out_dir / f"{name}.go").touch()
        plan.joins.append({"t": round(at_s, 2), "node": name, "stage": int(event["join"])})
    else:
        raise ConfigError(f"churn event {event} names neither 'kill' nor 'join'")


def _record_injected_crashes(plan: SwarmPlan) -> None:
    """Nodes that fault injection killed (they died by SIGKILL, not by the schedule)."""
    for name, proc in plan.procs.items():
        if not proc.killed and proc.popen.poll() == -signal.SIGKILL:
            proc.killed = True
            plan.crashes.append({"t": None, "node": name, "injected": True})


def summarise(plan: SwarmPlan, data: Proc, wall_s: float) -> dict[str, Any]:
    status = read_status(data)
    if data.popen.returncode != 0 or status is None or not status.get("finished"):
        raise GwtfError(f"the data node failed (exit {data.popen.returncode}); see its log")
    results = status["results"]
    statuses = {name: read_status(proc) for name, proc in plan.procs.items()}
    stats = [s["stats"] for s in statuses.values() if s is not None]
    microbatches = sum(r["microbatches"] for r in results)
    train_s = sum(r["duration_s"] for r in results)
    summary = {
        "iterations": len(results),
        "microbatches": microbatches,
        "loss_per_iteration": [round(r["loss"], 5) for r in results],
        "throughput_mb_per_s": round(microbatches / train_s, 4) if train_s else 0.0,
        "training_time_s": round(train_s, 3),
        "wall_time_s": round(wall_s, 3),
        "crashes": plan.crashes,
        "joins": plan.joins,
        "recovered_hops": {
            "forward_resends": sum(s["forward_resends"] for s in stats),
            "backward_repairs": sum(s["backward_repairs"] for s in stats),
            "restarted_microbatches": sum(r["restarts"] for r in results),
        },
        "relays": {
            name: {key: s.get(key) for key in ("stage", "step", "state_digest", "hops_recorded")}
            for name, s in statuses.items()
            if s is not None and name != "data" and not plan.procs[name].killed
        },
    }
    (plan.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
