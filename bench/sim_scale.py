"""How the simulator's wall time grows with the number of nodes (one core, 100 iterations).

Scenarios: 10 regions, heterogeneous GPUs, 8 stages, no churn; one data node per 50 nodes, each
injecting 16 microbatches per iteration, so the work per iteration grows with the swarm. Prints
wall time, events per second and the time per node relative to the smallest size measured in the
same run; writes ``bench/out/sim_scale.png``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sim_scale.py [--quick] [--algorithm swarm]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from coordinator_free.sim.algorithms import make_policy
from coordinator_free.sim.engine import EngineConfig, run_scenario
from coordinator_free.sim.generator import GridCell, GridSize, build_scenario

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
    started = time.perf_counter()
    metrics = run_scenario(scenario, make_policy(algorithm), EngineConfig())
    wall = time.perf_counter() - started
    return {
        "nodes": nodes,
        "wall_s": wall,
        "events": metrics.events_processed,
        "microbatches": metrics.microbatches_completed,
        "finished": metrics.stopped_reason == "finished",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="up to 500 nodes, 30 iterations")
    parser.add_argument("--algorithm", default="round_robin")
    parser.add_argument("--iterations", type=int, default=None)
    args = parser.parse_args()
    sizes = [50, 100, 250, 500] if args.quick else [50, 100, 250, 500, 1000, 2000]
    iterations = args.iterations or (30 if args.quick else 100)
    rows = [measure(n, iterations, args.algorithm) for n in sizes]
    base = rows[0]["wall_s"] / rows[0]["nodes"]
    print(f"\nalgorithm {args.algorithm}, {iterations} iterations, 1 process")
    print("| nodes | wall s | events | events/s | microbatches | wall per node / smallest |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        per_node = row["wall_s"] / row["nodes"] / base
        print(
            f"| {row['nodes']:.0f} | {row['wall_s']:.2f} | {row['events']:.0f} | "
            f"{row['events'] / row['wall_s']:.0f} | {row['microbatches']:.0f} | {per_node:.2f} |"
            + ("" if row["finished"] else " (not finished)")
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["nodes"] for r in rows], [r["wall_s"] for r in rows], marker="o")
    ax.set_xlabel("nodes")
    ax.set_ylabel(f"wall time for {iterations} iterations (s)")
    ax.set_title(f"simulator scaling ({args.algorithm})")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = OUT / "sim_scale.png"
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
