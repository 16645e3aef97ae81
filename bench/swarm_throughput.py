"""Live swarm throughput on loopback, against baselines measured on this machine in the same run.

1. Loopback, no emulated delay: a swarm (1 data node, 2 stages x 2 relays, separate processes)
   against one process running the same stages in sequence on the same microbatches: the limit
   the issue compares with (goal: >= 0.7 of it).
2. Ten-region link emulation with churn: the same swarm routed by GWTF's flow table and by
   SWARM's throughput-weighted wiring (a policy switch in the live node), with the same kills.
   Churn is compressed in time: a few relays die within a minute-long run, the number that 33 %
   of relays per hour would kill over a run of hours.

Usage: python bench/swarm_throughput.py [--iterations 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from node.swarm import plan_from_file, run_swarm
from node.training.config import named_config
from node.training.data import MicrobatchSampler, load_default_corpus
from node.training.local_pipeline import LocalPipeline, round_robin
from node.training.partition import plan_partition
from node.training.settings import TrainingSettings

REGIONS_FILE = Path(__file__).resolve().parents[1] / "coordinator_free/sim/data/regions-10.json"
BATCH_SIZE, SEQ_LEN, MICROBATCHES = 2, 32, 8


def single_process_mb_per_s(iterations: int) -> float:
    """The same model and microbatches, all stages in one process, one after another."""
    torch.set_num_threads(1)
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    settings = TrainingSettings(device="cpu")
    sampler = MicrobatchSampler(load_default_corpus(), BATCH_SIZE, SEQ_LEN)
    pipeline = LocalPipeline(plan, settings, 0, sampler, n_replicas=1)
    started = time.perf_counter()
    for iteration in range(iterations):
        for j in range(MICROBATCHES):
            pipeline.run_microbatch(iteration * MICROBATCHES + j, lambda m, s: round_robin(m, s, 1))
        pipeline.finish_iteration()
    return iterations * MICROBATCHES / (time.perf_counter() - started)


def swarm_run(name: str, body: str, out: Path) -> dict:  # type: ignore[type-arg]
    swarm_file = out / f"{name}.toml"
    swarm_file.write_text(body)
    plan = plan_from_file(swarm_file, out / name)
    with (out / f"{name}.log").open("wb") as log:
        return run_swarm(plan, log, timeout_s=900)


def swarm_file(iterations: int, routing: str, regions: bool, kills: list[tuple[float, str]]) -> str:
    events = ", ".join(f'{{t = {t}, kill = "{node}"}}' for t, node in kills)
    region_lines = (
        f'regions = ["oregon", "tokyo", "frankfurt", "virginia", "sydney"]\n'
        f'topology = "{REGIONS_FILE}"\n'
        if regions
        else ""
    )
    return (
        f"[run]\niterations = {iterations}\nmicrobatches_per_iteration = {MICROBATCHES}\n"
        f'routing = "{routing}"\n[swarm]\nrelays_per_stage = 2\ncapacity = 2\n{region_lines}'
        f"[churn]\nevents = [{events}]\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="loopback comparison only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        local = single_process_mb_per_s(args.iterations)
        loopback = swarm_run("loopback", swarm_file(args.iterations, "gwtf", False, []), out)
        rows = [
            ("one process, stages in sequence", local, 1.0),
            (
                "swarm on loopback (GWTF)",
                loopback["throughput_mb_per_s"],
                loopback["throughput_mb_per_s"] / local,
            ),
        ]
        print(f"{'setting':<44}{'mb/s':>8}{'ratio':>8}")
        for label, value, ratio in rows:
            print(f"{label:<44}{value:>8.2f}{ratio:>8.2f}")
        print(f"goal: swarm >= 0.7 of one process -> {'PASS' if rows[1][2] >= 0.7 else 'FAIL'}")
        if args.quick:
            return
        kills = [(3.0, "relay-1-0"), (6.0, "relay-2-1")]
        results = {}
        for routing in ("gwtf", "swarm"):
            results[routing] = swarm_run(
                f"regions-{routing}", swarm_file(args.iterations, routing, True, kills), out
            )
        print(f"\n{'10 regions, 2 relays killed':<44}{'mb/s':>8}{'time s':>8}{'resent':>8}")
        for routing, summary in results.items():
            recovered = summary["recovered_hops"]
            print(
                f"{routing + ' routing':<44}{summary['throughput_mb_per_s']:>8.2f}"
                f"{summary['training_time_s']:>8.1f}"
                f"{recovered['forward_resends'] + recovered['backward_repairs']:>8}"
            )
        ratio = results["gwtf"]["throughput_mb_per_s"] / results["swarm"]["throughput_mb_per_s"]
        print(f"GWTF / SWARM throughput: {ratio:.2f} (the simulator's direction: GWTF > SWARM)")
        print(json.dumps({k: v["loss_per_iteration"] for k, v in results.items()}))


if __name__ == "__main__":
    main()
