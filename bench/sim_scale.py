"""How the simulator's wall time grows with the number of nodes (one core, 100 iterations).

Scenarios: 10 regions, heterogeneous GPUs, 8 stages, no churn; one data node per 50 nodes, each
injecting 16 microbatches per iteration, so the work per iteration grows with the swarm. Each
size runs the GWTF policy and, as the baseline of the same run, the reference round-robin policy
(the engine alone). Prints wall time, events, control messages, and GWTF's wall time over the
baseline's, and control messages per node per iteration; writes ``bench/out/sim_scale.png``. CPU
seconds count: on a shared machine the wall time also counts the time other processes held the
core. Goal: 1,000 nodes x 100 iterations in <= 60 CPU s and <= 4x round-robin's.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sim_scale.py [--quick] [--sizes 50,100,1000]
        [--algorithms gwtf,round_robin] [--iterations 100]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gwtf.coordinator_free.sim.algorithms import make_policy
from gwtf.coordinator_free.sim.engine import EngineConfig, run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario

OUT = Path(__file__).resolve().parent / "out"
NODES_PER_DATA_NODE = 50


def measure(nodes: int, iterations: int, algorithm: str) -> dict[str, float]:
    data_nodes = max(1, nodes // NODES_PER_DATA_NODE)
    size = GridSize(
        stages=8,
        relays=nodes - data_nodes,
        data_nodes=data_nodes,
        data_capacity=16,
        iterations=iterations,
    )
    scenario = build_scenario(GridCell(True, True, 0.0), 0, size)
    started, cpu_started = time.perf_counter(), time.process_time()
    metrics = run_scenario(scenario, make_policy(algorithm), EngineConfig())
    wall = time.perf_counter() - started
    row = {
        "nodes": nodes,
        "wall_s": wall,
        "events": metrics.events_processed,
        "microbatches": metrics.microbatches_completed,
        "messages": metrics.control_messages,
        "messages_per_node_iteration": metrics.control_messages
        / nodes
        / max(1, metrics.iterations_completed),
        "sim_s": metrics.sim_time_s,
        "finished": metrics.stopped_reason == "finished",
        "cpu_s": time.process_time() - cpu_started,
    }
    print(f"  {algorithm} {nodes} nodes: {wall:.1f} s wall, {row['cpu_s']:.1f} s cpu", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="up to 250 nodes, 30 iterations")
    parser.add_argument("--sizes", default=None, help="comma-separated node counts")
    parser.add_argument("--algorithms", default="gwtf,round_robin", help="first one is measured")
    parser.add_argument("--iterations", type=int, default=None)
    args = parser.parse_args()
    default_sizes = "50,100,250" if args.quick else "50,100,250,500,1000"
    sizes = [int(n) for n in (args.sizes or default_sizes).split(",")]
    algorithms = args.algorithms.split(",")
    iterations = args.iterations or (30 if args.quick else 100)
    rows = {a: [measure(n, iterations, a) for n in sizes] for a in algorithms}
    baseline = algorithms[-1]
    print(f"\n{iterations} iterations, 1 process; baseline: {baseline} (same sizes, same run)")
    print(
        "| nodes | algorithm | wall s | cpu s | sim s | events | control msgs "
        f"| msgs / node / iteration | cpu / {baseline} |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for index, nodes in enumerate(sizes):
        base_cpu = rows[baseline][index]["cpu_s"]
        for algorithm in algorithms:
            row = rows[algorithm][index]
            print(
                f"| {nodes} | {algorithm} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} | "
                f"{row['sim_s']:.0f} | {row['events']:,.0f} | {row['messages']:,.0f} | "
                f"{row['messages_per_node_iteration']:.2f} | {row['cpu_s'] / base_cpu:.2f} |"
                + ("" if row["finished"] else " (not finished)")
            )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for algorithm in algorithms:
        series = rows[algorithm]
        ax.plot([r["nodes"] for r in series], [r["cpu_s"] for r in series], marker="o")
    ax.legend(algorithms)
    ax.set_xlabel("nodes")
    ax.set_ylabel(f"CPU seconds for {iterations} iterations")
    ax.set_title("simulator scaling, one core")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = OUT / "sim_scale.png"
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
