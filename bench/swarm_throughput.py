"""Live swarm throughput on loopback, against baselines measured on this machine in the same run.

1. Loopback, no emulated delay: a swarm (1 data node, 2 stages x 2 relays, separate processes)
   against one process running the same stages in sequence on the same microbatches: the limit
   the issue compares with (goal: >= 0.7 of it). Run with each relay holding 2 and 4
   microbatches in flight (the data node starts up to twice that at once), and broken down:
   each node's mean send-to-ack time, compute time and queue wait per hop (from the nodes'
   status files), the share of each iteration spent ending it (averaging, steps), and the CPU
   seconds the whole swarm spent per microbatch against the one process's, which bounds what
   the swarm can reach on this machine's cores however it is scheduled. Then the same at
   larger microbatches (``--sizes``, batch x sequence length): the swarm's cost per hop is
   mostly fixed (py-libp2p's CPU per request), so the ratio shows where compute outweighs it.
2. Ten-region link emulation with churn: the same swarm (3 relays per stage, of emulated GPU
   speeds ``--speeds``, by default 1.0 / 0.6 / 0.35 in every stage like the simulator's key
   heterogeneous cell, each relay hop lasting at least ``--hop-ms`` before its speed stretches
   it, so that the relays' time is spent as on GPUs and not on the shared CPUs) routed by
   GWTF's flow table and by SWARM's throughput-weighted wiring (a policy switch in the live
   node), with the same kills, alternating, ``--runs`` times each; the medians are compared.
   Churn is compressed in time: two relays die within a minute-long run, the number that 33 %
   of relays per hour would kill over a run of hours.
3. Receipts: the loopback swarm on its chain at 16 x 64-token microbatches with receipts on
   (every hop signed, countersigned, committed to each node's database and reported to the data
   node) and off, alternating, ``--runs`` times each; the medians are compared (goal >= 0.98).
4. ``--models``: the same on/off comparison per model size (e.g. gpt-tiny against GPT-2 124M),
   one relay per stage on short microbatches: seconds per iteration, throughput on / off and the
   share of the swarm's CPU per microbatch that receipts take.

Usage: python bench/swarm_throughput.py [--iterations 8] [--runs 3] [--sizes 16x64]
       [--speeds 1.0,0.6,0.35] [--hop-ms 100] [--quick | --routing-only | --receipts-only]
       [--models gpt-tiny,gpt-125m:50257]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from gwtf.node.status_file import read_results
from gwtf.node.swarm.plan import plan_from_file
from gwtf.node.swarm.run import run_swarm
from gwtf.node.training.config import named_config, total_param_count
from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.local_pipeline import LocalPipeline, round_robin
from gwtf.node.training.partition import model_for_run, plan_partition
from gwtf.node.training.settings import TrainingSettings

REGIONS_FILE = (
    Path(__file__).resolve().parents[1] / "gwtf/coordinator_free/sim/data/regions-10.json"
)
BATCH_SIZE, SEQ_LEN, MICROBATCHES = 2, 32, 8


def single_process_mb_per_s(
    iterations: int, batch_size: int = BATCH_SIZE, seq_len: int = SEQ_LEN
) -> tuple[float, float]:
    """The same model and microbatches, all stages in one process, one after another:
    (microbatches/s, CPU ms per microbatch)."""
    torch.set_num_threads(1)
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    settings = TrainingSettings(device="cpu")
    sampler = MicrobatchSampler(load_default_corpus(), batch_size, seq_len)
    pipeline = LocalPipeline(plan, settings, 0, sampler, n_replicas=1)
    started, cpu = time.perf_counter(), time.process_time()
    for iteration in range(iterations):
        for j in range(MICROBATCHES):
            pipeline.run_microbatch(iteration * MICROBATCHES + j, lambda m, s: round_robin(m, s, 1))
        pipeline.finish_iteration()
    count = iterations * MICROBATCHES
    return count / (time.perf_counter() - started), 1000.0 * (time.process_time() - cpu) / count


def swarm_run(name: str, body: str, out: Path) -> dict[str, Any]:
    """Run one swarm; the summary gains ``cpu_ms_per_mb`` (every node's CPU while training)."""
    swarm_file = out / f"{name}.toml"
    swarm_file.write_text(body)
    plan = plan_from_file(swarm_file, out / name)
    watcher = _CpuWatcher(out / name)
    watcher.start()
    try:
        with (out / f"{name}.log").open("wb") as log:
            summary = run_swarm(plan, log, timeout_s=900)
    finally:
        watcher.stop.set()
        watcher.join()
    summary["statuses"] = _statuses(out / name)
    summary["data_results"] = read_results(out / name / "data.status.json")
    cpu_end = watcher.cpu_at_end or sum(s.get("cpu_s", 0.0) for s in summary["statuses"].values())
    cpu_s = cpu_end - watcher.cpu_at_start
    summary["cpu_ms_per_mb"] = 1000.0 * cpu_s / max(summary["microbatches"], 1)
    return summary


def _statuses(folder: Path) -> dict[str, dict[str, Any]]:
    statuses = {}
    for path in sorted(folder.glob("*.status.json")):
        try:
            statuses[path.name.removesuffix(".status.json")] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a node killed mid-write leaves its last whole status, or none
    return statuses


class _CpuWatcher(threading.Thread):
    """Notes the swarm's CPU seconds when the data node starts training and when it has
    finished (what a run with receipts does after, certifying and claiming, is left out)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.stop = folder, threading.Event()
        self.cpu_at_start, self.cpu_at_end = 0.0, 0.0

    def run(self) -> None:
        while not self.stop.wait(0.05):
            statuses = _statuses(self.folder)
            data = statuses.get("data", {})
            cpu = sum(s.get("cpu_s", 0.0) for s in statuses.values())
            if data.get("training") and not self.cpu_at_start:
                self.cpu_at_start = cpu
            if data.get("finished"):
                self.cpu_at_end = cpu
                return


def print_breakdown(summary: dict[str, Any], local_cpu_ms: float) -> None:
    """Where a loopback swarm's time goes, per node and per iteration."""
    print(
        f"  {'node':<12}{'hops out':>9}{'ack ms':>8}{'max out':>8}{'hops in':>8}"
        f"{'compute ms':>11}{'queue ms':>9}"
    )
    for name, status in summary["statuses"].items():
        t = status.get("hop_timings")
        if not t:
            continue
        sent, computed = max(t["sent"], 1), max(t["computed"], 1)
        print(
            f"  {name:<12}{t['sent']:>9}{1000 * t['send_to_ack_s'] / sent:>8.1f}"
            f"{t['in_flight_max']:>8}{t['computed']:>8}{1000 * t['compute_s'] / computed:>11.1f}"
            f"{1000 * t['queue_wait_s'] / computed:>9.1f}"
        )
    results = summary["data_results"]
    total_s = sum(r["duration_s"] for r in results) or 1.0
    ending = sum(r.get("end_s", 0.0) for r in results) / total_s
    per_iteration = max(len(results), 1)
    relays = [s["stats"] for name, s in summary["statuses"].items() if name != "data"]
    if relays:
        relay_end_ms = 1000 * sum(r.get("ending_s", 0.0) for r in relays) / len(relays)
        averaging_ms = 1000 * sum(r.get("averaging_s", 0.0) for r in relays) / len(relays)
        print(
            f"  per iteration: the data node's ending {1000 * ending * total_s / per_iteration:.0f}"
            f" ms; a relay's {relay_end_ms / per_iteration:.0f} ms, of which averaging "
            f"{averaging_ms / per_iteration:.0f} ms"
        )
    cores = os.cpu_count() or 1
    bound = cores * local_cpu_ms / summary["cpu_ms_per_mb"]
    print(
        f"  ending iterations (probe, averaging, steps): {100 * ending:.0f} % of training time\n"
        f"  CPU per microbatch, all nodes: {summary['cpu_ms_per_mb']:.0f} ms, one process: "
        f"{local_cpu_ms:.0f} ms -> on {cores} idle cores the swarm could reach at most "
        f"{bound:.2f} of one process"
    )


def swarm_file(
    iterations: int,
    routing: str,
    regions: bool,
    kills: list[tuple[float, str]],
    capacity: int = 2,
    relays_per_stage: int = 2,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    speeds: tuple[float, ...] = (1.0,),
    hop_ms: float = 0.0,
    receipts: bool = True,
    model: str = "gpt-tiny",
    vocab_size: int = 0,
    microbatches: int = MICROBATCHES,
    audit_sample: int = 32,
) -> str:
    events = ", ".join(f'{{t = {t}, kill = "{node}"}}' for t, node in kills)
    region_lines = (
        f'regions = ["oregon", "tokyo", "frankfurt", "virginia", "sydney"]\n'
        f'topology = "{REGIONS_FILE}"\n'
        if regions
        else ""
    )
    return (
        f"[run]\niterations = {iterations}\nmicrobatches_per_iteration = {microbatches}\n"
        f'batch_size = {batch_size}\nseq_len = {seq_len}\nmodel = "{model}"\n'
        f"vocab_size = {vocab_size}\n"
        f'routing = "{routing}"\n[swarm]\nrelays_per_stage = {relays_per_stage}\n'
        f"capacity = {capacity}\nspeeds = [{', '.join(map(str, speeds))}]\nhop_ms = {hop_ms}\n"
        f"{region_lines}"
        f"[chain]\nreceipts = {str(receipts).lower()}\naudit_sample = {audit_sample}\n"
        f"[churn]\nevents = [{events}]\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="ten-region runs per routing")
    parser.add_argument("--quick", action="store_true", help="loopback comparison only")
    parser.add_argument("--routing-only", action="store_true", help="ten-region comparison only")
    parser.add_argument("--receipts-only", action="store_true", help="receipts on/off only")
    parser.add_argument(
        "--models",
        default="",
        help="receipts on/off per model instead, e.g. gpt-tiny,gpt-125m (model[:vocabulary])",
    )
    parser.add_argument(
        "--speeds", default="1.0,0.6,0.35", help="emulated GPU speeds of each stage's relays"
    )
    parser.add_argument(
        "--hop-ms", type=float, default=100.0, help="a relay hop's emulated least compute time"
    )
    parser.add_argument(
        "--sizes", default="16x64", help="larger microbatches (batch x sequence), '' for none"
    )
    args = parser.parse_args()
    speeds = tuple(float(v) for v in args.speeds.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if args.routing_only:
            compare_routings(args.iterations, args.runs, out, speeds, args.hop_ms)
            return
        if args.receipts_only:
            compare_receipts(args.iterations, args.runs, out)
            return
        if args.models:
            compare_models(args.iterations, args.runs, out, args.models.split(","))
            return
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        local, local_cpu_ms = single_process_mb_per_s(args.iterations)
        print(f"{'setting':<44}{'mb/s':>8}{'ratio':>8}")
        print(f"{'one process, stages in sequence':<44}{local:>8.2f}{1.0:>8.2f}")
        best = 0.0
        for capacity in (2, 4):
            body = swarm_file(args.iterations, "gwtf", False, [], capacity)
            loopback = swarm_run(f"loopback-{capacity}", body, out)
            rate = loopback["throughput_mb_per_s"]
            best = max(best, rate / local)
            label = f"swarm on loopback (GWTF), {capacity} in flight per relay"
            print(f"{label:<44}{rate:>8.2f}{rate / local:>8.2f}")
            print_breakdown(loopback, local_cpu_ms)
        print(f"goal: swarm >= 0.7 of one process -> {'PASS' if best >= 0.7 else 'FAIL'}")
        for size in filter(None, args.sizes.split(",")):
            compare_size(args.iterations, size, out)
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        if args.quick:
            return
        compare_receipts(args.iterations, args.runs, out)
        compare_routings(args.iterations, args.runs, out, speeds, args.hop_ms)


def compare_receipts(iterations: int, runs: int, out: Path) -> None:
    """The loopback swarm at 16 x 64-token microbatches, receipts on and off, alternating."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    hops: list[int] = []
    for run in range(runs):
        for on in (True, False):  # alternating, so a slow spell of the machine hits both
            body = swarm_file(iterations, "gwtf", False, [], batch_size=16, seq_len=64, receipts=on)
            summary = swarm_run(f"receipts-{'on' if on else 'off'}-{run}", body, out)
            rates[on].append(summary["throughput_mb_per_s"])
            if on:
                earned = summary["chain"].get("earnings", {}).values()
                hops.append(sum(e["receipts"]["signed"] or 0 for e in earned))
    on, off = (statistics.median(rates[flag]) for flag in (True, False))
    print(
        f"\nreceipts on every hop, loopback, 16 x 64-token microbatches, {iterations} iterations"
        f"\n{'setting':<44}{'mb/s (each run)':>24}{'median':>8}"
    )
    for flag, label in ((False, "receipts off"), (True, "receipts on (signed, kept, reported)")):
        each = " ".join(f"{r:.2f}" for r in rates[flag])
        print(f"{label:<44}{each:>24}{statistics.median(rates[flag]):>8.2f}")
    verdict = "PASS" if on / off >= 0.98 else "FAIL"
    print(f"receipts on / off: {on / off:.3f} (goal >= 0.98 -> {verdict}); signed per run: {hops}")


#: What ``--models`` runs: a relay per stage, 4 microbatches of 2 x 32 tokens an iteration,
#: small enough for a 125M model on two shared cores; no audit after the run (it re-executes
#: hops from the relays' evidence, minutes at 125M, and is no part of training).
MODEL_RUN = {
    "batch_size": 2,
    "seq_len": 32,
    "microbatches": 4,
    "relays_per_stage": 1,
    "audit_sample": 0,
}


def compare_models(iterations: int, runs: int, out: Path, models: list[str]) -> None:
    """Each model's loopback swarm with receipts on and off, alternating, ``runs`` times each:
    seconds per iteration, the throughput with receipts against without, and the share of the
    swarm's CPU per microbatch while training that receipts add. ``gpt-125m:50257`` gives the
    vocabulary."""
    rows = []
    for spec in models:
        model, _, vocab = spec.partition(":")
        vocab_size = int(vocab or 0)
        config = model_for_run(model, MODEL_RUN["seq_len"], 2, vocab_size or None)
        seconds: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for run in range(runs):
            for on in (True, False):
                body = swarm_file(
                    iterations, "gwtf", False, [], receipts=on, model=model,
                    vocab_size=vocab_size, **MODEL_RUN,
                )  # fmt: skip
                name = f"{model}-{'on' if on else 'off'}-{run}"
                summary = swarm_run(name, body, out)
                seconds[on].append(seconds_per_iteration(summary["data_results"]))
                cpu[on].append(summary["cpu_ms_per_mb"])
        on_s, off_s = statistics.median(seconds[True]), statistics.median(seconds[False])
        on_cpu, off_cpu = statistics.median(cpu[True]), statistics.median(cpu[False])
        rows.append((spec, total_param_count(config), off_s, on_s, on_cpu, off_cpu))
    print(
        f"\nloopback swarm, 1 relay per stage, {MODEL_RUN['microbatches']} microbatches of "
        f"{MODEL_RUN['batch_size']} x {MODEL_RUN['seq_len']} tokens an iteration, "
        f"{iterations} iterations, median of {runs}\n"
        f"{'model':<18}{'params':>8}{'s/it off':>10}{'s/it on':>10}{'on / off':>10}"
        f"{'CPU ms/mb off':>15}{'on':>8}{'receipt CPU share':>19}"
    )
    for spec, params, off_s, on_s, on_cpu, off_cpu in rows:
        print(
            f"{spec:<18}{params / 1e6:>7.1f}M{off_s:>10.2f}{on_s:>10.2f}{off_s / on_s:>10.3f}"
            f"{off_cpu:>15.0f}{on_cpu:>8.0f}{(on_cpu - off_cpu) / on_cpu:>19.3f}"
        )


def seconds_per_iteration(results: list[dict[str, Any]]) -> float:
    """Mean duration of the iterations after the first (which waits for the flows)."""
    durations = [r["duration_s"] for r in results]
    timed = durations[1:] or durations
    return sum(timed) / max(len(timed), 1)


def compare_size(iterations: int, size: str, out: Path) -> None:
    """The loopback comparison (2 in flight per relay) at microbatches of ``size``
    (batch x sequence length): more compute per hop against the same messages."""
    batch_size, seq_len = (int(part) for part in size.lower().split("x"))
    local, local_cpu_ms = single_process_mb_per_s(iterations, batch_size, seq_len)
    body = swarm_file(iterations, "gwtf", False, [], batch_size=batch_size, seq_len=seq_len)
    loopback = swarm_run(f"loopback-{batch_size}x{seq_len}", body, out)
    rate = loopback["throughput_mb_per_s"]
    print(f"\nmicrobatches of {batch_size} x {seq_len} tokens")
    print(f"{'one process, stages in sequence':<44}{local:>8.2f}{1.0:>8.2f}")
    print(f"{'swarm on loopback (GWTF), 2 in flight':<44}{rate:>8.2f}{rate / local:>8.2f}")
    print_breakdown(loopback, local_cpu_ms)


def compare_routings(
    iterations: int, runs: int, out: Path, speeds: tuple[float, ...], hop_ms: float
) -> None:
    """GWTF against SWARM routing under the ten-region emulation with the same kills."""
    kills = [(4.0, "relay-1-0"), (10.0, "relay-2-1")]
    results: dict[str, list[dict[str, Any]]] = {"gwtf": [], "swarm": []}
    for run in range(runs):
        for routing in results:  # alternating, so a slow spell of the machine hits both
            body = swarm_file(
                iterations, routing, True, kills, relays_per_stage=3, speeds=speeds, hop_ms=hop_ms
            )
            results[routing].append(swarm_run(f"regions-{routing}-{run}", body, out))
    print(
        f"\nrelay speeds {'/'.join(map(str, speeds))} in every stage, a hop at least {hop_ms:g} ms"
        f"\n{'10 regions, 3 relays/stage, 2 killed':<40}{'mb/s (each run)':>24}{'median':>8}"
        f"{'resent':>8}{'fwd rep':>8}{'grad res':>9}{'restart':>8}"
    )
    medians = {}
    for routing, summaries in results.items():
        rates = [s["throughput_mb_per_s"] for s in summaries]
        medians[routing] = statistics.median(rates)
        recovered = [s["recovered_hops"] for s in summaries]
        resent = sum(r["forward_resends"] + r["backward_repairs"] for r in recovered)
        print(
            f"{routing + ' routing':<40}{' '.join(f'{r:.2f}' for r in rates):>24}"
            f"{medians[routing]:>8.2f}{resent:>8}"
            f"{sum(r['forward_repairs'] for r in recovered):>8}"
            f"{sum(r['gradient_resumes'] for r in recovered):>9}"
            f"{sum(r['restarted_microbatches'] for r in recovered):>8}"
        )
    ratio = medians["gwtf"] / medians["swarm"]
    print(f"GWTF / SWARM median throughput: {ratio:.2f} (the simulator's direction: GWTF > SWARM)")
    print(json.dumps({k: [s["loss_per_iteration"] for s in v] for k, v in results.items()}))


if __name__ == "__main__":
    main()
