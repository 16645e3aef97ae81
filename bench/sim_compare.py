"""GWTF vs SWARM vs DT-FM vs the centralised optimum on the paper-like grid (simulated).

For every grid cell (GPUs homogeneous/heterogeneous x 1/10 regions x churn 0/10/33 % per hour)
and every algorithm, runs ``--seeds`` seeds of ``--iterations`` iterations and reports medians:
training time, throughput, wasted GPU time, and GWTF's throughput as a fraction of the optimum
measured in the same run. The issue's goals are printed as PASS/FAIL columns. Plots go to
``bench/out/``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sim_compare.py [--quick] [--seeds 5] [--jobs 2]
        [--sweep] [--cells het-1reg-churn0,...] [--algorithms gwtf,swarm,dtfm,optimal,...]

``--sweep`` adds the key cell's GPUs and regions at churn rates beyond the grid (100 and 200 % of
relays per hour) and prints how GWTF's time and waste compare with SWARM's as churn grows.

The optimum ("optimal") is the best of a family, per scenario: networkx min-cost max-flow with
every relay slot, and with relays given slots in proportion to their speed
(``placement.offered_slots`` against the fastest relay of their stage) at each scale of
``OPTIMUM_SCALES``; the run with the highest throughput counts. With heterogeneous GPUs a flow
through every slot is not the fastest schedule (slow relays then hold the iteration's tail), so
the optimum with every slot ("optimal-allslots", the definition before) was beaten by GWTF on
some seeds. In a cell of equal GPUs every member of the family is the same run, so only the
first is run. "gwtf-allslots" is GWTF with every slot offered (``slot_speed_scale`` 0);
"gwtf-like" is GWTF with pipelines of like GPUs (``like_speed_weight`` 3, slot scale 2), run in
the heterogeneous cells only; ``gwtf@FIELD=VALUE+FIELD=VALUE`` is GWTF with those ``FlowConfig``
fields, to measure a parameter against the defaults in the same run. ``--cells`` picks cells.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path

from coordinator_free.baselines.optimal import OptimalPolicy
from coordinator_free.protocol.config import FlowConfig
from coordinator_free.sim.algorithms import make_policy
from coordinator_free.sim.engine import EngineConfig, run_scenario
from coordinator_free.sim.generator import GridCell, GridSize, build_scenario, paper_grid
from coordinator_free.sim.gwtf_policy import GwtfPolicy
from coordinator_free.sim.policy import RoutingPolicy, WorldView
from gwtf.errors import ConfigError, GwtfError

OUT = Path(__file__).resolve().parent / "out"
KEY_CELL = "het-10reg-churn33"
#: Churn rates (of relays per hour) of ``--sweep``, beyond the grid's 0 / 10 / 33 %.
SWEEP_CHURN = (1.0, 2.0)
#: Runs that cannot finish are cut here (deterministic); they count as not finished (DNF).
MAX_EVENTS = 3_000_000
#: The optimum's family: every slot (None), then speed-proportional slots at these scales. With
#: the grid's capacity 4 and speeds 1.0 / 0.6 / 0.35 each scale gives other slot counts (1.75
#: gives 1.5's, 2.5 and above every slot).
OPTIMUM_SCALES: tuple[float | None, ...] = (None, 1.0, 1.25, 1.5, 2.0)
OPTIMAL, OPTIMAL_ALL = "optimal", "optimal-allslots"
#: GWTF with pipelines of like GPUs (``protocol/like_speed.py``), off by default in the core:
#: the weight and slot scale measured best on the heterogeneous cells. Run only where GPUs differ
#: (with equal GPUs it is GWTF to the last message).
LIKE = "gwtf-like"
LIKE_SETTINGS = "like_speed_weight=3+slot_speed_scale=2"


@dataclass(frozen=True)
class Run:
    cell: str
    algorithm: str
    seed: int
    finished: bool
    sim_time_s: float
    throughput: float
    wasted_gpu_s: float
    crashes: int
    wall_s: float


class TunedGwtfPolicy(GwtfPolicy):
    """GWTF with some ``FlowConfig`` fields set (``gwtf@field=value+field=value``), to measure a
    parameter against the defaults in the same run."""

    def __init__(self, overrides: dict[str, float]) -> None:
        super().__init__()
        self._overrides = overrides

    def _flow_config(self, world: WorldView) -> FlowConfig:
        return replace(super()._flow_config(world), **self._overrides)


def parse_overrides(spec: str) -> dict[str, float]:
    """``a=1+b=2`` -> {"a": 1.0, "b": 2.0}; a field FlowConfig lacks is a ConfigError."""
    overrides: dict[str, float] = {}
    known = {f.name for f in fields(FlowConfig)}
    for item in spec.split("+"):
        name, _, value = item.partition("=")
        if name not in known:
            raise ConfigError(f"gwtf@{spec}: FlowConfig has no field {name!r}; name one of it")
        overrides[name] = float(value)
    return overrides


def policy_for(algorithm: str) -> RoutingPolicy:
    """A policy by name; ``optimal@S`` is the optimum at slot scale S (``all``: every slot);
    ``gwtf@field=value+...`` is GWTF with those ``FlowConfig`` fields."""
    if algorithm.startswith(OPTIMAL + "@"):
        scale = algorithm.partition("@")[2]
        return OptimalPolicy(slot_speed_scale=None if scale == "all" else float(scale))
    if algorithm == "gwtf-allslots":
        return GwtfPolicy(slot_speed_scale=0.0)
    if algorithm.startswith("gwtf@"):
        return TunedGwtfPolicy(parse_overrides(algorithm.partition("@")[2]))
    if algorithm == LIKE:
        return TunedGwtfPolicy(parse_overrides(LIKE_SETTINGS))
    return make_policy(algorithm)


def variant_name(scale: float | None) -> str:
    return f"{OPTIMAL}@{'all' if scale is None else f'{scale:g}'}"


def expand(cell: GridCell, algorithm: str) -> list[str]:
    """The runs one algorithm of the table needs in ``cell`` (the optimum: its family)."""
    if algorithm == OPTIMAL:
        scales = OPTIMUM_SCALES if cell.heterogeneous else OPTIMUM_SCALES[:1]
        return [variant_name(scale) for scale in scales]
    if algorithm == OPTIMAL_ALL:
        return [variant_name(None)]
    if algorithm == LIKE and not cell.heterogeneous:
        return []
    return [algorithm]


def best_of_family(runs: list[Run]) -> tuple[list[Run], dict[str, list[str]]]:
    """Replace the optimum's variants by the best per (cell, seed) ("optimal") and the every-slot
    one ("optimal-allslots"); also return, per cell, the winning variant of each seed."""
    kept = [r for r in runs if not r.algorithm.startswith(OPTIMAL + "@")]
    groups: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        if run.algorithm.startswith(OPTIMAL + "@"):
            groups.setdefault((run.cell, run.seed), []).append(run)
    winners: dict[str, list[str]] = {}
    for (cell, _), group in sorted(groups.items()):
        # Highest throughput; the earlier variant (every slot first) on a tie.
        best = max(group, key=lambda r: (r.finished, r.throughput, -group.index(r)))
        kept.append(replace(best, algorithm=OPTIMAL))
        winners.setdefault(cell, []).append(best.algorithm.partition("@")[2])
        every = [r for r in group if r.algorithm == variant_name(None)]
        kept += [replace(r, algorithm=OPTIMAL_ALL) for r in every]
    return kept, winners


def run_one(job: tuple[GridCell, str, int, int]) -> Run:
    cell, algorithm, seed, iterations = job
    scenario = build_scenario(cell, seed, GridSize(iterations=iterations))
    started = time.perf_counter()
    config = EngineConfig(max_sim_time_s=200.0 * iterations, max_events=MAX_EVENTS)
    try:
        metrics = run_scenario(scenario, policy_for(algorithm), config)
    except GwtfError as err:
        print(f"  {cell.label} {algorithm} seed {seed}: {err}", file=sys.stderr)
        return Run(cell.label, algorithm, seed, False, math.inf, 0.0, math.inf, 0, 0.0)
    return Run(
        cell.label,
        algorithm,
        seed,
        metrics.stopped_reason == "finished",
        metrics.sim_time_s if metrics.stopped_reason == "finished" else math.inf,
        metrics.throughput_mb_per_s,
        metrics.wasted_gpu_s,
        metrics.crashes,
        time.perf_counter() - started,
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarise(runs: list[Run]) -> dict[tuple[str, str], dict[str, float]]:
    table: dict[tuple[str, str], dict[str, float]] = {}
    for key in sorted({(r.cell, r.algorithm) for r in runs}):
        group = [r for r in runs if (r.cell, r.algorithm) == key]
        table[key] = {
            "time_s": median([r.sim_time_s for r in group]),
            "throughput": median([r.throughput for r in group]),
            "wasted_s": median([r.wasted_gpu_s for r in group]),
            "crashes": median([float(r.crashes) for r in group]),
            "finished": sum(r.finished for r in group) / len(group),
        }
    return table


def print_tables(
    table: dict[tuple[str, str], dict[str, float]], cells: list[str], algorithms: list[str]
) -> None:
    print("\n| cell | algorithm | time s | mb/s | wasted GPU s | crashes | thr / optimal | done |")
    print("|---|---|---|---|---|---|---|---|")
    for cell in cells:
        optimal = table.get((cell, OPTIMAL), {}).get("throughput", math.nan)
        for algorithm in algorithms:
            row = table.get((cell, algorithm))
            if row is None:
                continue
            ratio = row["throughput"] / optimal if optimal else math.nan
            print(
                f"| {cell} | {algorithm} | {_fmt(row['time_s'])} | {row['throughput']:.3f} | "
                f"{_fmt(row['wasted_s'])} | {row['crashes']:.0f} | {ratio:.3f} | "
                f"{row['finished']:.0%} |"
            )


def print_goals(table: dict[tuple[str, str], dict[str, float]], cells: list[str]) -> None:
    def get(cell: str, algorithm: str, key: str) -> float:
        return table.get((cell, algorithm), {}).get(key, math.nan)

    print("\n| goal | measured | target | verdict |")
    print("|---|---|---|---|")
    if KEY_CELL in cells:
        gwtf_t, swarm_t = get(KEY_CELL, "gwtf", "time_s"), get(KEY_CELL, "swarm", "time_s")
        dtfm_t = get(KEY_CELL, "dtfm", "time_s")
        _goal(f"{KEY_CELL}: GWTF time / SWARM time", gwtf_t / swarm_t, "<= 0.60", 0.60)
        _goal(f"{KEY_CELL}: GWTF time / DT-FM time", gwtf_t / dtfm_t, "< 1.00", 1.0 - 1e-9)
        gwtf_w, swarm_w = get(KEY_CELL, "gwtf", "wasted_s"), get(KEY_CELL, "swarm", "wasted_s")
        _goal(
            f"{KEY_CELL}: GWTF wasted / SWARM wasted",
            _safe_ratio(gwtf_w, swarm_w),
            "<= 0.33",
            1 / 3,
        )
    for cell in cells:
        if cell.endswith("churn0"):
            ratio = get(cell, "gwtf", "throughput") / get(cell, "optimal", "throughput")
            _goal(f"{cell}: GWTF thr / optimal thr", ratio, ">= 0.95", 0.95, higher=True)
    for cell in cells:
        if cell.endswith("churn0") and (cell, LIKE) in table:
            ratio = get(cell, LIKE, "throughput") / get(cell, "optimal", "throughput")
            _goal(f"{cell}: {LIKE} thr / optimal thr", ratio, ">= 0.95", 0.95, higher=True)


def print_sweep(table: dict[tuple[str, str], dict[str, float]], cells: list[str]) -> None:
    """GWTF against SWARM (and the optimum against SWARM, the bound) as churn grows."""
    print("\n| cell | GWTF / SWARM time | optimum / SWARM time | GWTF / SWARM wasted |")
    print("|---|---|---|---|")
    for cell in cells:
        row = {a: table.get((cell, a), {}) for a in ("gwtf", "swarm", "optimal")}
        swarm_t = row["swarm"].get("time_s", math.nan)
        # Below 0.05 s a waste is the rounding of float sums (total - useful), not lost work.
        gwtf_w, swarm_w = (row[a].get("wasted_s", 0.0) for a in ("gwtf", "swarm"))
        wasted = math.nan if swarm_w < 0.05 else _safe_ratio(gwtf_w, swarm_w)
        print(
            f"| {cell} | {_fmt(row['gwtf'].get('time_s', math.nan) / swarm_t, 3)} | "
            f"{_fmt(row['optimal'].get('time_s', math.nan) / swarm_t, 3)} | {_fmt(wasted, 3)} |"
        )


def _safe_ratio(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


def _goal(name: str, value: float, target: str, bound: float, higher: bool = False) -> None:
    if math.isnan(value):
        verdict = "n/a"
    elif higher:
        verdict = "PASS" if value >= bound else "FAIL"
    else:
        verdict = "PASS" if value <= bound else "FAIL"
    print(f"| {name} | {_fmt(value, 3)} | {target} | {verdict} |")


def _fmt(value: float, digits: int = 1) -> str:
    if math.isinf(value):
        return "DNF"
    if math.isnan(value):
        return "n/a"
    return f"{value:.{digits}f}"


def plot(
    table: dict[tuple[str, str], dict[str, float]], cells: list[str], algos: list[str]
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    width = 0.8 / max(len(algos), 1)
    for index, algorithm in enumerate(algos):
        xs = [c + index * width for c in range(len(cells))]
        times = [table.get((cell, algorithm), {}).get("time_s", math.nan) for cell in cells]
        wasted = [table.get((cell, algorithm), {}).get("wasted_s", math.nan) for cell in cells]
        axes[0].bar(xs, [t if math.isfinite(t) else 0 for t in times], width, label=algorithm)
        axes[1].bar(xs, [w if math.isfinite(w) else 0 for w in wasted], width, label=algorithm)
    for ax, title in zip(
        axes, ("training time (s, median)", "wasted GPU time (s, median)"), strict=True
    ):
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cells))])
        ax.set_xticklabels(cells, rotation=45, ha="right", fontsize=8)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    path = OUT / "sim_compare.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 cells, 3 seeds, 20 iterations")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--algorithms",
        default="gwtf,swarm,dtfm,optimal",
        help=f"also: gwtf-allslots, optimal-allslots (every relay slot offered), {LIKE} "
        f"(GWTF with {LIKE_SETTINGS}, heterogeneous cells only), "
        "gwtf@FIELD=VALUE+FIELD=VALUE (GWTF with those FlowConfig fields)",
    )
    parser.add_argument("--cells", default=None, help="only these cells (comma-separated labels)")
    parser.add_argument("--sweep", action="store_true", help="the key cell at 100/200 %%/h churn")
    args = parser.parse_args()
    seeds = args.seeds or (3 if args.quick else 5)
    iterations = args.iterations or (20 if args.quick else 30)
    cells = paper_grid()
    key = next(c for c in cells if c.label == KEY_CELL)
    if args.quick:
        keep = {"hom-1reg-churn0", "het-10reg-churn0", "het-10reg-churn10", KEY_CELL}
        cells = [c for c in cells if c.label in keep]
    if args.cells:
        wanted = set(args.cells.split(","))
        unknown = wanted - {c.label for c in cells}
        if unknown:
            parser.error(f"unknown cells {sorted(unknown)}; the grid's labels are like {KEY_CELL}")
        cells = [c for c in cells if c.label in wanted]
    if args.sweep:
        cells += [GridCell(key.heterogeneous, key.ten_regions, rate) for rate in SWEEP_CHURN]
    algorithms = args.algorithms.split(",")
    jobs = [
        (c, variant, s, iterations)
        for c in cells
        for a in algorithms
        for variant in expand(c, a)
        for s in range(seeds)
    ]
    jobs = list(dict.fromkeys(jobs))  # optimal and optimal-allslots share the every-slot run
    print(
        f"{len(jobs)} runs: {len(cells)} cells x {len(algorithms)} algorithms x {seeds} seeds, "
        f"{iterations} iterations each, {args.jobs} processes"
    )
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(run_one, jobs, chunksize=1))
    print(f"wall time {time.perf_counter() - started:.1f} s")
    runs, winners = best_of_family(runs)
    table = summarise(runs)
    labels = [c.label for c in cells]
    print_tables(table, labels, algorithms)
    print_goals(table, labels)
    if any(len(set(w)) > 1 or w[0] != "all" for w in winners.values()):
        print("\nthe optimum's slot scale per seed (all: every slot)")
        for cell, scales in winners.items():
            print(f"  {cell}: {' '.join(scales)}")
    if args.sweep:
        same = [
            c.label
            for c in cells
            if (c.heterogeneous, c.ten_regions) == (key.heterogeneous, key.ten_regions)
        ]
        print_sweep(table, same)
    print(f"\nplot: {plot(table, labels, algorithms)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
