"""Where the swarm's CPU goes with receipts on and off, per microbatch, by part.

    .venv/bin/python bench/receipt_cost.py [--model gpt-125m:50257] [--iterations 3] [--runs 1]

The loopback swarm of ``swarm_throughput.py --models`` (a data node and one relay per stage as
OS processes on their chain, 4 microbatches of 2 x 32 tokens an iteration), receipts on and off,
alternating. Every node runs with ``cpu_sampler/sitecustomize.py``, which adds each thread's CPU
(the kernel's count) to its Python stack every 5 ms; the CPU from the data node's first training
iteration to its last is sorted into parts by the frames of each stack (the first part in
``PARTS`` with a matching frame takes it) and printed per microbatch, as ratios to the
compute (the stages' and data part's forward and backward, receipts off). The sampler's own
thread is not counted; it costs a few percent of each process besides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from swarm_throughput import MODEL_RUN, _statuses, seconds_per_iteration, swarm_file

from gwtf.node.status_file import read_results
from gwtf.node.swarm.plan import plan_from_file
from gwtf.node.swarm.run import run_swarm

SAMPLER = Path(__file__).resolve().parent / "cpu_sampler"
OUT = Path(__file__).resolve().parent / "out"

#: (part, pattern of a frame ``file:function``), in order: a stack is the first part's whose
#: pattern matches one of its frames.
PARTS: list[tuple[str, str]] = [
    ("chain: the local API's view (polled)", r"/node/local_api/"),
    (
        "evidence: the iteration's weights kept",
        r"^thread:evidence-writer|relay\.py:_keep_state$|evidence\.py:keep_state$",
    ),
    ("evidence: hop frames kept", r"relay\.py:_keep_frames$|evidence\.py:keep_frame$"),
    ("signing and recovery", r"/(eth_keys|coincurve|eth_account)/"),
    ("SQLite (node store, writer threads)", r"/node/store/(?!evidence)|sqlite3"),
    ("receipts: book, reports, certificates", r"/node/receipts/"),
    ("frame digests (SHA-256 of each hop)", r":frame_digest$"),
    ("chain (web3, RPC)", r"/(web3|eth_abi|requests|urllib3|gwtf/node/chain)/"),
    ("status file: the part state's digest each step", r"checkpoint\.py:state_digest$"),
    ("compute: forward and backward", r"/node/training/(?!codec)"),
    ("wire codec", r"/node/training/codec\.py"),
    ("network (libp2p, noise, yamux)", r"/(libp2p|multiaddr|nacl|cryptography)/"),
]
OTHER = "event loop and the rest"
#: The local API's view of the chain: read every ``api.chain_period_s`` (1 s in a swarm file, 5 s
#: by default) whenever the node has a chain, so with receipts on only; no part of the hop path.
VIEW = "chain: the local API's view (polled)"


def part_of(stack: str) -> str:
    """The part of a ``node|thread|frames`` stack (the thread is a frame ``thread:<name>``)."""
    _, thread, frames = stack.split("|", 2)
    frames = [f"thread:{thread}", *frames.split(";")]
    for part, pattern in PATTERNS:
        if any(pattern.search(frame) for frame in frames):
            return part
    return OTHER


PATTERNS = [(part, re.compile(pattern)) for part, pattern in PARTS]


def read_samples(folder: Path) -> dict[str, dict[str, int]]:
    """Each process's CPU ns per stack, by the node its command line names ("data", ...)."""
    by_node: dict[str, dict[str, int]] = {}
    for path in folder.glob("*.json"):
        try:
            sample = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        match = re.search(r"--config \S*/([^/ ]+)\.toml", sample["argv"])
        by_node[match.group(1) if match else f"other:{path.stem}"] = sample["stacks"]
    return by_node


class _Window(threading.Thread):
    """Copies the samples when the data node starts training and when it has finished."""

    def __init__(self, run_dir: Path, samples: Path, copies: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.samples, self.copies = run_dir, samples, copies
        self.stop = threading.Event()

    def run(self) -> None:
        started = False
        while not self.stop.wait(0.05):
            data = _statuses(self.run_dir).get("data", {})
            if data.get("training") and not started:
                started = True
                shutil.copytree(self.samples, self.copies / "start", dirs_exist_ok=True)
            if data.get("finished"):
                shutil.copytree(self.samples, self.copies / "end", dirs_exist_ok=True)
                return


def profiled_run(name: str, body: str, out: Path) -> tuple[dict[str, float], dict[str, Any]]:
    """One swarm run: CPU ms per node, thread and stack over the training window, and the
    swarm's summary."""
    samples, copies = out / f"{name}.samples", out / f"{name}.copies"
    samples.mkdir()
    swarm = out / f"{name}.toml"
    swarm.write_text(body)
    plan = plan_from_file(swarm, out / name)
    window = _Window(out / name, samples, copies)
    saved = {key: os.environ.get(key) for key in ("BENCH_CPU_SAMPLES", "PYTHONPATH")}
    os.environ["BENCH_CPU_SAMPLES"] = str(samples)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SAMPLER), saved["PYTHONPATH"]]))
    window.start()
    try:
        with (out / f"{name}.log").open("wb") as log:
            summary = run_swarm(plan, log, timeout_s=900)
    finally:
        window.stop.set()
        window.join()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    summary["data_results"] = read_results(out / name / "data.status.json")
    start, end = read_samples(copies / "start"), read_samples(copies / "end")
    ms: dict[str, float] = defaultdict(float)
    for node, stacks in end.items():
        before = start.get(node, {})
        for stack, ns in stacks.items():
            ms[f"{node}|{stack}"] += (ns - before.get(stack, 0)) / 1e6
    return ms, summary


def by_part(ms: dict[str, float]) -> dict[str, float]:
    parts: dict[str, float] = defaultdict(float)
    for stack, value in ms.items():
        parts[part_of(stack)] += value
    return parts


def print_top(ms: dict[str, float], count: int, top: int) -> None:
    """The costliest places, by node, thread and the innermost frames that are not a library's."""
    places: dict[str, float] = defaultdict(float)
    for stack, value in ms.items():
        node, thread, frames = stack.split("|", 2)
        own = [f for f in frames.split(";") if "site-packages" not in f and "/lib/python" not in f]
        inner = " < ".join(re.sub(r".*/", "", f) for f in own[:3])
        part = part_of(stack).split(":")[0].split(" (")[0]
        places[f"{part:<14.14} {node} [{re.sub(r'[0-9]+', '', thread)[:24]}] {inner}"] += (
            value / count
        )
    for place, value in sorted(places.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{value:>9.1f}  {place}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-125m:50257", help="model[:vocabulary]")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--top", type=int, default=0, help="also print the N costliest stacks")
    parser.add_argument(
        "--again",
        nargs="?",
        const="",
        help="sort the samples of the last run (bench/out, or this file) again",
    )
    args = parser.parse_args()
    model, _, vocab = args.model.partition(":")
    saved = OUT / f"receipt_cost-{model}.json"
    if args.again is not None:
        runs = json.loads(Path(args.again or saved).read_text())
    else:
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(args.runs):
                for on in (True, False):
                    body = swarm_file(
                        args.iterations, "gwtf", False, [], receipts=on, model=model,
                        vocab_size=int(vocab or 0), **MODEL_RUN,
                    )  # fmt: skip
                    name = f"{'on' if on else 'off'}-{run}"
                    ms, summary = profiled_run(name, body, Path(tmp))
                    per_it = seconds_per_iteration(summary["data_results"])
                    runs.append([on, run, ms, summary["microbatches"], per_it])
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        OUT.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(runs))
    per_mb: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for on, run, ms, microbatches, per_it in runs:
        count = max(microbatches, 1)
        per_mb[on].append({part: v / count for part, v in by_part(ms).items()})
        seconds[on].append(per_it)
        if args.top:
            print(f"\nreceipts {'on' if on else 'off'}, run {run}: CPU ms per microbatch")
            print_top(ms, count, args.top)
    parts = [part for part, _ in PARTS] + [OTHER]
    on = {p: statistics.median(r.get(p, 0.0) for r in per_mb[True]) for p in parts}
    off = {p: statistics.median(r.get(p, 0.0) for r in per_mb[False]) for p in parts}
    compute = off["compute: forward and backward"] or 1.0
    print(
        f"\n{args.model}, loopback swarm, 1 relay per stage, {MODEL_RUN['microbatches']} "
        f"microbatches of {MODEL_RUN['batch_size']} x {MODEL_RUN['seq_len']} tokens an "
        f"iteration, {args.iterations} iterations, median of {len(seconds[True])}; CPU ms per "
        f"microbatch while training, all nodes\n"
        f"{'part':<42}{'off':>9}{'on':>9}{'on - off':>10}{'/ compute':>11}"
    )
    for part in parts:
        extra = on[part] - off[part]
        print(f"{part:<42}{off[part]:>9.1f}{on[part]:>9.1f}{extra:>10.1f}{extra / compute:>11.3f}")
    total_on, total_off = sum(on.values()), sum(off.values())
    extra = total_on - total_off
    print(f"{'all':<42}{total_off:>9.1f}{total_on:>9.1f}{extra:>10.1f}{extra / compute:>11.3f}")
    view = on[VIEW] - off[VIEW]
    on_s, off_s = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(
        f"s / iteration off {off_s:.2f}, on {on_s:.2f}: throughput on / off {off_s / on_s:.3f} "
        f"(goal >= 0.98); receipt CPU / compute {extra / compute:.3f} (goal <= 0.02), "
        f"{(extra - view) / compute:.3f} without the local API's chain view"
    )


if __name__ == "__main__":
    main()
