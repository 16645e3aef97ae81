"""`gwtf-node swarm`: a whole training swarm on this machine, one OS process per node.

Reads a swarm file (TOML); starts a chain, opens the run and registers every node on it
(``gwtf.node.swarm.chain``; on by default, ``[chain] enabled = false`` for a quick chain-less run);
writes each node's settings file (``<out>/<name>.toml``, the ``gwtf.node.settings`` format) and
starts the data node, then the relays, each as ``python -m gwtf.node.process`` on 127.0.0.1 (or on
the host ``SwarmPlan.hosts`` places it on: a network namespace of the internet test bed) with
the topology's link emulation and, with the chain on, admission: a node serves only peers that
the chain binds to a staked node of the run. It kills nodes with SIGKILL and starts joiners
(registered just before they enter) on the churn schedule, and tells those deaths from fault
injection's and from kills by hand; streams the nodes' logs (each line names its node) into
one file; and when the data node has trained its iterations writes a JSON summary (iterations,
microbatches, loss per iteration, throughput, crashes, joins, recovered hops, the work asked,
completed, redone and lost, each live relay's step and digest and those out of step with their
stage, and the chain: RPC URL, run id, registered nodes, refused peers). ``progress.py`` draws
it live.

The swarm file's format and checks are ``gwtf.node.swarm.plan``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gwtf.errors import GwtfError
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.audit.runner import Sampling
from gwtf.node.chain.actions import dataset_hash_of
from gwtf.node.settings import AUTO_STAGE
from gwtf.node.status_file import read_results
from gwtf.node.swarm.audit import SwarmAudit
from gwtf.node.swarm.chain import (
    DEVNET_SCRYPT_N,
    chain_facts,
    child_env,
    ensure_node_key,
    peer_id_of_node,
    start_swarm_chain,
)
from gwtf.node.swarm.epochs import SwarmEpochs, rewards
from gwtf.node.swarm.pacing import Pacing
from gwtf.node.swarm.plan import (
    Proc,
    SwarmPlan,
    crash_rules,
    entrant_stage,
    node_settings,
    run_model_of,
    speed_of,
    write_node_settings,
)
from gwtf.node.swarm.replicas import replicas_out_of_step
from gwtf.node.training.partition import model_for_run, plan_partition
from gwtf.node.training.settings import TrainingSettings


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
    host = plan.hosts.get(name)
    command = [*(host.prefix if host else ()), sys.executable, "-m", "gwtf.node.process"]
    command += ["--config", str(config)]
    command += ["--status-file", str(status_file)]
    if start_file is not None:
        command += ["--start-file", str(start_file)]
    if settings["node"]["role"] == "data" and plan.pacing is not None:
        command += ["--pace-file", str(plan.pacing.add(name))]
    # Fault injection kills honest relays the schedule leaves alone: a cheater's fraud is what
    # the audit must find, a node the schedule kills (and may restart) must be alive then, and
    # an entrant (started ahead of its time) is what its event shows entering.
    scheduled = {str(event["kill"]) for event in plan.churn["events"] if "kill" in event}
    exempt = {*plan.swarm["cheaters"], *scheduled}
    injectable = settings["node"]["role"] == "relay" and start_file is None and name not in exempt
    for crash_on in crash_rules(plan, stage) if injectable else []:
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
    plan: SwarmPlan,
    log: IO[bytes] | None = None,
    timeout_s: float = 600.0,
    before_stop: Callable[[SwarmPlan, dict[str, Any]], None] | None = None,
    keep_chain: bool = False,
) -> dict[str, Any]:
    """Run the swarm to the end of the data node's iterations; returns the summary.
    ``before_stop(plan, summary)`` runs while the nodes still serve (the demo exports the
    model from them). ``keep_chain``: a run that succeeds leaves its chain up
    (``plan.chain.stop()`` stops it)."""
    succeeded = False
    stages, per_stage = plan.run["stages"], plan.swarm["relays_per_stage"]
    started = time.monotonic()
    # A previous run in this folder leaves go files and crash locks that would start joiners at
    # once and disarm fault injection.
    # Its node databases hold receipts, and its relays' evidence the states, of a run on a
    # chain that is gone.
    for stale in (
        *plan.out_dir.glob("*.go"),
        *plan.out_dir.glob("crash-*.lock"),
        *plan.out_dir.glob("*.sqlite*"),
        *plan.out_dir.glob("*.results.jsonl"),
        *plan.out_dir.glob("*.pace"),
    ):
        stale.unlink()
    for evidence in plan.out_dir.glob("*.evidence"):
        shutil.rmtree(evidence, ignore_errors=True)
    plan.pacing = Pacing(plan.out_dir, int(plan.run["iterations"]))
    try:
        if plan.chain_plan.enabled:
            plan.chain = start_swarm_chain(
                plan.chain_plan,
                plan.out_dir,
                run_model_of(plan),
                dataset_hash_of(plan.run["data"]),
                log,
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
                    emulated_speed=speed_of(plan, replica),
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
        epochs = None
        if plan.chain is not None and plan.chain.plan.receipts:
            audit = SwarmAudit(plan.chain, _sampling(plan))
            plan.audit = audit
            epochs = SwarmEpochs(
                plan.chain,
                plan.run["iterations"],
                lambda last: _certified(plan, data_nodes, last),
                lambda: _claimed(plan),
                lambda epoch: audit.epoch(epoch, live_addresses(plan)),
                plan.pacing,
                lambda epoch: _saw_epoch(plan, epoch),
            )
        last_check = time.monotonic()
        while not _trained(data_nodes):
            now = time.monotonic()
            if now - started > timeout_s:
                raise GwtfError(f"the swarm did not finish within {timeout_s:g} s")
            if epochs is not None:
                epochs.trained(int((read_status(data) or {}).get("iterations_done", 0)))
            if now - last_check >= 1.0:
                _record_injected_crashes(plan)  # and kills by hand, shown as they happen
                last_check = now
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
        if epochs is not None:
            plan.last_epoch = epochs.settle()
        summary = summarise(
            plan, [plan.procs[p.name] for p in data_nodes], time.monotonic() - started
        )
        if before_stop is not None:
            before_stop(plan, summary)
        succeeded = True
        return summary
    finally:
        for proc in plan.procs.values():
            if proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in plan.procs.values():
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
        if plan.chain is not None and not (keep_chain and succeeded):
            plan.chain.stop()


def live_addresses(plan: SwarmPlan) -> list[str]:
    """The addresses of the swarm's live nodes (strangers aside), as the auditor dials them:
    each node's first direct address now, else its first. The auditor dials no circuit, and a
    node whose reachability is not yet known (or stays unknown) still offers its circuit
    first."""
    return [
        _direct_first([str(a) for a in status.get("addresses") or [status["address"]]])
        for name, proc in plan.procs.items()
        if name not in plan.strangers
        and proc.popen.poll() is None
        and (status := read_status(proc)) is not None
    ]


def _direct_first(addresses: list[str]) -> str:
    return next((a for a in addresses if "/p2p-circuit" not in a), addresses[0])


def _trained(data_nodes: list[Proc]) -> bool:
    """Every data node has trained its iterations, or is gone (killed, or failed)."""
    for proc in data_nodes:
        if proc.popen.poll() is None and not (read_status(proc) or {}).get("finished"):
            return False
    return True


def _certified(plan: SwarmPlan, data_nodes: list[Proc], last: int) -> bool:
    """Every live data node has settled every epoch up to ``last`` (certified, or nothing to)."""
    for proc in data_nodes:
        if proc.popen.poll() is not None:
            continue
        cycle = ((read_status(proc) or {}).get("receipts") or {}).get("cycle", {})
        if any(str(epoch) not in cycle.get("certificates", {}) for epoch in range(last + 1)):
            return False
    return True


def _claimed(plan: SwarmPlan) -> bool:
    """Every live relay has reported all its receipts and claimed every epoch it worked in (a
    relay slashed by the audit is never paid, and no longer admitted to report)."""
    slashed = plan.audit.slashed() if plan.audit is not None else set()
    for name, proc in plan.procs.items():
        if proc.popen.poll() is not None or name in plan.strangers:
            continue
        node = plan.chain.registered.get(name) if plan.chain is not None else None
        if node is not None and node.node_address.lower() in slashed:
            continue
        status = read_status(proc)
        if status is None:
            if any(join["node"] == name for join in plan.joins):
                return False  # restarting, or a joiner starting: it claims once it is up
            continue  # an entrant whose time never came
        receipts = status.get("receipts")
        if status.get("role") == "data" or receipts is None:
            continue
        if receipts["unreported"] or receipts["cycle"]["pending"]:
            return False
    return True


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
    """Give the node its key and, with a chain, put it in the run (staked, as a relay or a data
    node) before it starts."""
    node = settings["node"]
    if plan.chain is None:
        ensure_node_key(plan.out_dir, node["name"])
        return
    plan.chain.register(node["name"], int(node["capacity"]), data_node=node["role"] == "data")


def _prestart_entrants(
    plan: SwarmPlan, events: list[dict[str, Any]], bootstrap: list[str], log: IO[bytes] | None
) -> None:
    """Start joiners' and strangers' processes now (loading torch takes seconds); each waits
    for its go file, which the churn schedule creates at the event's time."""
    counts = {"joiner": 0, "stranger": 0}
    for event in (e for e in events if "join" in e or "stranger" in e):
        kind = "joiner" if "join" in event else "stranger"
        stage = entrant_stage(plan.run["stages"], event["join" if "join" in event else "stranger"])
        label = "auto" if stage == AUTO_STAGE else stage
        event["_name"] = name = f"{kind}-{label}-{counts[kind]}"
        counts[kind] += 1
        speed = speed_of(plan, len(plan.procs))
        settings = node_settings(
            plan, name, "relay", stage, len(plan.procs), join=kind == "joiner", emulated_speed=speed
        )
        settings["p2p"]["bootstrap_peers"] = bootstrap
        scrypt_n = plan.chain.scrypt_n if plan.chain else DEVNET_SCRYPT_N
        peer_id = peer_id_of_node(plan.out_dir, name, scrypt_n)  # its key, made before it starts
        if kind == "stranger" and plan.chain is not None:
            plan.strangers[name] = peer_id
        start_node(plan, settings, log, start_file=plan.out_dir / f"{name}.go")


def _sampling(plan: SwarmPlan) -> Sampling | None:
    """What the swarm's audit re-executes, with the run's model on CPU."""
    assert plan.chain is not None
    hops = plan.chain.plan.audit_sample
    if hops == 0:
        return None
    run = plan.run
    config = model_for_run(
        str(run["model"]), int(run["seq_len"]), int(run["stages"]), int(run["vocab_size"])
    )
    settings = TrainingSettings(device="cpu", seq_len=int(run["seq_len"]))
    # Every node of the local swarm trains on CPU in float32: the CPU tolerance is the one.
    return Sampling(hops, Replayer(plan_partition(config, int(run["stages"])), settings))


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
        join = {"t": round(at_s, 2), "node": name, "stage": event["join"]}
        plan.joins.append(join)
        join["serving"] = _hold_for_entrant(plan, name)


def _restart(plan: SwarmPlan, name: str, at_s: float, log: IO[bytes] | None) -> None:
    """Start a killed node again from its settings file, with its identity, as a joiner."""
    _record_injected_crashes(plan)  # before its dead process is forgotten
    proc = plan.procs.get(name)
    if proc is not None and proc.killed:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=10)  # a SIGKILLed process in a disk write dies late
    if proc is None or proc.popen.poll() is None:
        return  # never started, or still running (its kill came later than planned)
    settings = tomllib.loads((plan.out_dir / f"{name}.toml").read_text())
    settings["node"]["join"] = True
    start_node(plan, settings, log)
    join = {"t": round(at_s, 2), "node": name, "restart": True}
    plan.joins.append(join)
    if settings["node"]["role"] == "relay":
        join["serving"] = _hold_for_entrant(plan, name)


def _hold_for_entrant(plan: SwarmPlan, name: str) -> bool:
    """Hold the data nodes after the iteration in flight until relay ``name`` (a joiner, or a
    relay restarted) serves: it has loaded its stage's state and told the data nodes it is
    alive (``gwtf.node.swarm.pacing``). The data nodes take it into their flows within a few
    iterations of traffic (none form while they are held), so it takes traffic however fast
    the iterations before it ran. Whether it served within the hold's bound."""
    assert plan.pacing is not None
    proc = plan.procs[name]
    done = max((_iterations_done(p) for p in plan.procs.values() if _is_data_node(p)), default=0)

    def serving() -> bool:
        return proc.popen.poll() is None and read_status(proc) is not None

    def settled() -> bool:  # serving, or gone: a dead entrant holds nobody up
        return serving() or proc.popen.poll() is not None

    plan.pacing.hold_until(f"{name} entering", done + 1, settled)
    return serving()


def _is_data_node(proc: Proc) -> bool:
    status = read_status(proc)
    return proc.popen.poll() is None and status is not None and status.get("role") == "data"


def _iterations_done(proc: Proc) -> int:
    return int((read_status(proc) or {}).get("iterations_done", 0))


def _saw_epoch(plan: SwarmPlan, epoch: int) -> bool:
    """Every live data node has read ``epoch`` (or a later one) off the chain's clock."""
    for proc in plan.procs.values():
        if _is_data_node(proc):
            receipts = (read_status(proc) or {}).get("receipts") or {}
            if int(receipts.get("epoch", epoch)) < epoch:
                return False
    return True


def _record_injected_crashes(plan: SwarmPlan) -> None:
    """Nodes that died by SIGKILL, not by the schedule: fault injection's (the node names
    itself in the crash lock it took), or a person's (``kill -9`` by hand)."""
    dead = [n for n, p in plan.procs.items() if not p.killed and p.popen.poll() == -signal.SIGKILL]
    injected = set()
    for lock in plan.out_dir.glob("crash-*.lock"):  # read after the deaths: each named itself
        try:
            injected.add(lock.read_text())
        except OSError:
            continue
    for name in dead:
        plan.procs[name].killed = True
        how = "injected" if name in injected else "by_hand"
        plan.crashes.append({"t": None, "node": name, how: True})


def _api_view(status: dict[str, Any] | None, proc: Proc) -> dict[str, Any] | None:
    """What a live node's own API says of its health and earnings (None: not running)."""
    url = (status or {}).get("api_url")
    if url is None or proc.popen.poll() is not None:
        return None
    try:
        health = _health(url)
        earnings = _get_json(f"{url}/v1/earnings")
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    return {
        "health": health["status"],
        "claimed_wei": earnings["total_claimed"]["wei"],
        "epochs": len(earnings["epochs"]),
    }


def _health(url: str) -> Any:
    try:
        return _get_json(f"{url}/healthz")
    except urllib.error.HTTPError as exc:  # 503: not "ok", and its body says which
        return json.loads(exc.read())


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def summarise(plan: SwarmPlan, data_nodes: list[Proc], wall_s: float) -> dict[str, Any]:
    """The run's summary. The first data node must have finished; another one may have been
    killed on the schedule (its iterations until then count)."""
    data = data_nodes[0]
    status = read_status(data)
    # A data node with receipts serves on after training (workers claim from it) until the
    # swarm stops it; one without exits when it is done.
    exit_code = data.popen.poll()
    if exit_code not in (None, 0) or status is None or not status.get("finished"):
        raise GwtfError(f"the data node failed (exit {exit_code}); see its log")
    for proc in data_nodes[1:]:
        if not proc.killed and proc.popen.poll() not in (None, 0):
            raise GwtfError(
                f"data node {proc.name} failed (exit {proc.popen.returncode}); see its log"
            )
    results = read_results(data.status_file)
    statuses = {name: read_status(proc) for name, proc in plan.procs.items()}
    stats = [s["stats"] for s in statuses.values() if s is not None]
    # A restarted data node appends to its predecessor's results file.
    all_results = [r for proc in data_nodes for r in read_results(proc.status_file)]
    microbatches = sum(r["microbatches"] for r in all_results)
    train_s = sum(r["duration_s"] for r in results)
    losses: dict[int, list[float]] = {}
    for result in all_results:
        losses.setdefault(result["iteration"], []).append(result["loss"])
    run_step = status.get("step")  # the first data node's: it steps once per iteration
    asked = plan.run["iterations"] * plan.run["microbatches_per_iteration"]
    asked *= plan.swarm["data_nodes"]
    relays = {
        name: {key: s.get(key) for key in ("stage", "step", "state_digest", "hops_recorded")}
        for name, s in statuses.items()
        if s is not None
        and s.get("role") != "data"
        and name not in plan.strangers
        and not plan.procs[name].killed
    }
    summary = {
        "iterations": len(results),
        "microbatches": microbatches,
        # The mean over the data nodes that finished the iteration (each over its own shard).
        "loss_per_iteration": [round(sum(v) / len(v), 8) for _, v in sorted(losses.items())],
        # The first data node's validation loss of the swarm's model, [iteration, loss] pairs.
        "validation_loss": [
            [r["iteration"], round(r["validation_loss"], 8)]
            for r in results
            if r.get("validation_loss") is not None
        ],
        # Of those, the iterations whose loss rests on one relay's weights of some stage
        # (any one relay could have forged it): two relays of each stage agree on the rest.
        "validation_unverified": [
            r["iteration"]
            for r in results
            if r.get("validation_loss") is not None and not r.get("validation_verified")
        ],
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
        # What the run asked (every data node's microbatches of every iteration) and what
        # became of it; a gradient is one microbatch's at one stage. Redone: it died with a
        # replica before its stage averaged and was computed again on a live one; lost: it
        # died and could not be; duplicated: two replicas held it (it counted twice).
        "work": {
            "microbatches_asked": asked,
            "microbatches_completed": microbatches,
            "microbatches_lost": max(0, asked - microbatches),
            "microbatches_redone": sum(s.get("microbatches_redone", 0) for s in stats),
            "gradients_redone": sum(s.get("gradients_redone", 0) for s in stats),
            "gradients_lost": sum(s.get("gradients_lost", 0) for s in stats),
            "gradients_duplicated": sum(s.get("gradients_duplicated", 0) for s in stats),
        },
        # (iteration, stage) pairs in which no replica of the stage stepped: the relays of that
        # stage trained nothing that iteration, which a healthy swarm never shows.
        "stages_not_stepped": sum(s.get("stages_not_stepped", 0) for s in stats),
        # Data nodes the others left out while they were alive, which asked back in.
        "data_nodes_taken_back_in": sum(s.get("taken_back_in", 0) for s in stats),
        # Microbatches data nodes started on flows another data node lent them.
        "microbatches_on_loans": sum(s.get("microbatches_on_loans", 0) for s in stats),
        "relays": relays,
        # Live relays that did not end with their stage's step and weights (a healthy swarm has
        # none, whatever crashed or came back).
        "replicas_out_of_step": replicas_out_of_step(relays, run_step),
        "data_nodes": {
            proc.name: {key: status.get(key) for key in ("step", "state_digest")}
            for proc in data_nodes
            if (status := statuses[proc.name]) is not None and not proc.killed
        },
        "chain": chain_facts(plan.chain, plan.strangers, statuses),
    }
    if plan.chain is not None and plan.last_epoch >= 0:
        names = {node.node_address: name for name, node in plan.chain.registered.items()}
        earned = rewards(plan.chain, plan.last_epoch, names)
        for name, entry in earned["nodes"].items():
            receipts = (statuses.get(name) or {}).get("receipts") or {}
            entry["receipts"] = {
                key: receipts.get(key)
                for key in ("signed", "countersigned", "completed", "refused", "reported")
            }
            entry["claims"] = list((receipts.get("cycle") or {}).get("claims", {}).values())
            host = plan.hosts.get(name)
            # A node placed on another host serves its API on that host's loopback only.
            elsewhere = host is not None and bool(host.prefix)
            entry["api"] = None if elsewhere else _api_view(statuses.get(name), plan.procs[name])
        summary["chain"]["epochs"] = earned["epochs"]
        summary["chain"]["earnings"] = earned["nodes"]
        if plan.audit is not None:
            summary["chain"]["audit"] = plan.audit.summary()
    (plan.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
