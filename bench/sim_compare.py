"""GWTF vs SWARM vs DT-FM vs a central heuristic, against a provable lower bound (simulated).

For every cell of the grid (GPUs homogeneous/heterogeneous x 1/10 regions x churn 0/33/100/300 % of
relays per hour) every algorithm runs the same scenarios and crashes. Seeds are split: the
*tuning* seeds (0-9) choose the central heuristic's slot rule per cell (and are where GWTF's own
parameters were chosen); the *reporting* seeds (10-29) are the tables. Per cell it prints medians
of training time, throughput and wasted GPU time split by cause, and per-seed paired ratios
(median and interquartile range) against SWARM, DT-FM, the central heuristic and the lower bound
of ``gwtf/coordinator_free/sim/bound.py``, which no algorithm can beat, the fastest run per seed
that the bound is about ("best") over the bound, and GWTF against its adapter reading the world
("gwtf-oracles", the ablation of what the live node asks or measures). Churn
runs are made long enough to expect ``--min-crashes`` crashes each (``iterations_of``).

    OMP_NUM_THREADS=1 .venv/bin/python bench/sim_compare.py [--quick] [--seeds 20] [--jobs 2]
        [--cells het-1reg-churn0,...] [--algorithms gwtf,gwtf-oracles,swarm,dtfm,central,...]
        [--timeout 20|30|60|600] [--trainers 1|8] [--swarm-8bit]
    OMP_NUM_THREADS=1 .venv/bin/python bench/sim_compare.py --sweep [--seeds 5]
        [--iterations 100] [--timeout S] [--trainers 8] [--swarm-8bit]

``--timeout``: SWARM's forward timeout (its backward one 2.5 times it, as released) and DT-FM's
hop timeout; by default each as shipped (30 s). ``--trainers``: each data node split into that
many trainers (``GridSize.trainers_per_data_node``), for every algorithm. ``--sweep``: GWTF, SWARM
and DT-FM on the 10-region heterogeneous cell at churn 0, 10, 33, 100 and 300 %/h, a fixed number
of iterations, median and quartiles over the seeds, plotted per baseline against churn
(``bench/out/sim_sweep-*.png``; below 1 GWTF wins). Ablations of the baselines' modelling choices
(``baselines/README.md``): "swarm-barrier" (the global barrier the release does not have),
"gwtf-nobarrier" (GWTF injecting continuously, as SWARM does),
"swarm-rebalance" (the paper's rebalancing, not in the release), "dtfm-rematch" (DT-FM re-matching
only the broken pipeline instead of relaunching the iteration).

The central heuristic ("central") is networkx min-cost max-flow with full knowledge, with every
relay slot or with slots in proportion to speed (``placement.offered_slots``) at each scale of
``CENTRAL_SCALES``; per heterogeneous cell the scale with the best median throughput on the tuning
seeds is the one reported. Variants: "gwtf-allslots" (every slot offered), "gwtf-like" (pipelines
of like GPUs, heterogeneous cells only), ``gwtf@FIELD=VALUE+FIELD=VALUE`` (``FlowConfig`` fields),
"central-allslots". Plots go to ``bench/out/``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path

from gwtf.coordinator_free.baselines.central import CentralPolicy
from gwtf.coordinator_free.baselines.dtfm import DtfmPolicy
from gwtf.coordinator_free.baselines.swarm import REBALANCE_PERIOD_S, SwarmPolicy
from gwtf.coordinator_free.protocol.config import FlowConfig
from gwtf.coordinator_free.sim.algorithms import make_policy
from gwtf.coordinator_free.sim.bound import lower_bound
from gwtf.coordinator_free.sim.engine import EngineConfig, run_scenario
from gwtf.coordinator_free.sim.generator import (
    GridCell,
    GridSize,
    build_scenario,
    iterations_for_crashes,
    paper_grid,
)
from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy
from gwtf.coordinator_free.sim.policy import RoutingPolicy
from gwtf.errors import ConfigError, GwtfError

OUT = Path(__file__).resolve().parent / "out"
KEY_CELL = "het-10reg-churn33"
TUNING_SEEDS = range(0, 10)
FIRST_REPORTING_SEED = 10
#: Runs that cannot finish are cut here (deterministic); they count as not finished (DNF).
MAX_EVENTS = 6_000_000
#: The central heuristic's slot rules: every slot (None), then speed-proportional slots.
CENTRAL_SCALES: tuple[float | None, ...] = (None, 1.0, 1.25, 1.5, 2.0)
CENTRAL, CENTRAL_ALL = "central", "central-allslots"
#: GWTF's adapter reading the world where the live node asks or measures (the ablation).
ORACLES = "gwtf-oracles"
#: GWTF with pipelines of like GPUs (``protocol/like_speed.py``), off by default in the core.
LIKE = "gwtf-like"
LIKE_SETTINGS = "like_speed_weight=3+slot_speed_scale=2"
WASTE_CAUSES = ("lost_with_replica", "recomputed", "restarted", "cut_by_crash", "superseded")
#: The sweep's churn levels (relays crashing per hour) on the 10-region heterogeneous cell.
SWEEP_CHURN = (0.0, 0.1, 0.33, 1.0, 3.0)
DEFAULT_ALGORITHMS = f"gwtf,{ORACLES},swarm,dtfm,{CENTRAL}"


@dataclass(frozen=True)
class Setup:
    """What every run of one invocation shares: the baselines' timeouts (None: as shipped), the
    trainers per data node, SWARM's 8-bit activations."""

    timeout_s: float | None = None
    trainers: int = 1
    swarm_8bit: bool = False

    def size(self, iterations: int) -> GridSize:
        return GridSize(iterations=iterations, trainers_per_data_node=self.trainers)

    def swarm(self, **kwargs: object) -> SwarmPolicy:
        timeout = {} if self.timeout_s is None else {"forward_timeout_s": self.timeout_s}
        return SwarmPolicy(**timeout, compress_8bit=self.swarm_8bit, **kwargs)  # type: ignore[arg-type]

    def dtfm(self, on_failure: str = "relaunch") -> DtfmPolicy:
        timeout = {} if self.timeout_s is None else {"hop_timeout_s": self.timeout_s}
        return DtfmPolicy(**timeout, on_failure=on_failure)  # type: ignore[arg-type]


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
    waste: tuple[float, ...] = (0.0,) * len(WASTE_CAUSES)
    bound_s: float = math.nan
    iterations: int = 0
    bound_binding: str = ""
    #: crashes while computing a forward, a backward, nothing
    crash_phases: tuple[int, int, int] = (0, 0, 0)

    @property
    def wasted_but_recompute_s(self) -> float:
        """Waste other than recomputed forwards (SWARM recomputes every one by design), to the
        microsecond: the two are sums of the same floats in different orders."""
        other = self.wasted_gpu_s - self.waste[WASTE_CAUSES.index("recomputed")]
        return round(max(0.0, other), 6)


class TunedGwtfPolicy(GwtfPolicy):
    """GWTF with some ``FlowConfig`` fields set (``gwtf@field=value+field=value``), to measure a
    parameter against the defaults in the same run."""

    def __init__(self, overrides: dict[str, float]) -> None:
        super().__init__()
        self._overrides = overrides

    def _flow_config(self, world: object) -> FlowConfig:  # type: ignore[override]
        return replace(super()._flow_config(world), **self._overrides)  # type: ignore[arg-type]


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


def policy_for(algorithm: str, setup: Setup | None = None) -> RoutingPolicy:
    """A policy by name; ``central@S`` is the central heuristic at slot scale S (``all``: every
    slot); ``gwtf@field=value+...`` is GWTF with those ``FlowConfig`` fields; the baselines and
    their ablations take the setup's timeouts and options."""
    setup = setup or Setup()
    baselines: dict[str, Callable[[], RoutingPolicy]] = {
        "swarm": lambda: setup.swarm(),
        "swarm-barrier": lambda: setup.swarm(barrier=True),
        "swarm-rebalance": lambda: setup.swarm(rebalance_period_s=REBALANCE_PERIOD_S),
        "dtfm": lambda: setup.dtfm(),
        "dtfm-rematch": lambda: setup.dtfm("rematch"),
    }
    if algorithm in baselines:
        return baselines[algorithm]()
    if algorithm == "gwtf-nobarrier":  # GWTF under SWARM's continuous injection (an ablation)
        policy = GwtfPolicy()
        policy.iteration_barrier = False
        return policy
    if algorithm.startswith(CENTRAL + "@"):
        scale = algorithm.partition("@")[2]
        return CentralPolicy(slot_speed_scale=None if scale == "all" else float(scale))
    if algorithm == "gwtf-allslots":
        return GwtfPolicy(slot_speed_scale=0.0)
    if algorithm.startswith("gwtf@"):
        return TunedGwtfPolicy(parse_overrides(algorithm.partition("@")[2]))
    if algorithm == LIKE:
        return TunedGwtfPolicy(parse_overrides(LIKE_SETTINGS))
    return make_policy(algorithm)


def variant_name(scale: float | None) -> str:
    return f"{CENTRAL}@{'all' if scale is None else f'{scale:g}'}"


def expand(cell: GridCell, algorithm: str, central_scale: dict[str, str]) -> list[str]:
    """The runs one algorithm of the table needs in ``cell`` on the reporting seeds."""
    if algorithm == CENTRAL:
        return [f"{CENTRAL}@{central_scale.get(cell.label, 'all')}"]
    if algorithm == CENTRAL_ALL:
        return [variant_name(None)]
    if algorithm == LIKE and not cell.heterogeneous:
        return []
    return [algorithm]


def choose_central_scales(runs: list[Run]) -> dict[str, str]:
    """Per cell, the slot scale of the central heuristic with the best median throughput over
    the tuning runs (the earlier scale of ``CENTRAL_SCALES`` on a tie)."""
    chosen: dict[str, str] = {}
    for cell in sorted({r.cell for r in runs}):
        variants = [v for v in dict.fromkeys(r.algorithm for r in runs if r.cell == cell)]
        score = {
            v: median(
                [
                    r.throughput if r.finished else 0.0
                    for r in runs
                    if (r.cell, r.algorithm) == (cell, v)
                ]
            )
            for v in variants
        }
        best = max(variants, key=lambda v: (score[v], -variants.index(v)))
        chosen[cell] = best.partition("@")[2]
    return chosen


def iterations_of(cell: GridCell, fixed: int | None, min_crashes: float) -> int:
    """``fixed``, or enough iterations for a churn run to expect ``min_crashes`` crashes: the
    bound would be safe but is loose (about 0.4-0.7 of the runs), so an iteration is estimated
    as 0.9 of the central heuristic's without churn (tuning seed 0, 3 iterations); a run faster
    than that estimate sees fewer crashes, which the tables' "min" column shows."""
    if fixed is not None:
        return fixed
    size = GridSize()
    calm = replace(cell, churn_per_hour=0.0)
    scenario = build_scenario(calm, 0, replace(size, iterations=3))
    per_iteration = 0.9 * run_scenario(scenario, CentralPolicy()).sim_time_s / 3
    return iterations_for_crashes(cell, size, min_crashes, per_iteration)


Job = tuple[GridCell, str, int, int, Setup]


def run_one(job: Job) -> Run:
    cell, algorithm, seed, iterations, setup = job
    scenario = build_scenario(cell, seed, setup.size(iterations))
    bound = lower_bound(scenario)
    started = time.perf_counter()
    config = EngineConfig(max_sim_time_s=200.0 * iterations, max_events=MAX_EVENTS)
    try:
        metrics = run_scenario(scenario, policy_for(algorithm, setup), config)
    except GwtfError as err:
        print(f"  {cell.label} {algorithm} seed {seed}: {err}", file=sys.stderr)
        return Run(
            cell.label,
            algorithm,
            seed,
            False,
            math.inf,
            0.0,
            math.inf,
            0,
            0.0,
            bound_s=bound.total_s,
        )
    finished = metrics.stopped_reason == "finished"
    causes = metrics.waste_by_cause()
    return Run(
        cell.label,
        algorithm,
        seed,
        finished,
        metrics.sim_time_s if finished else math.inf,
        metrics.throughput_mb_per_s,
        metrics.wasted_gpu_s,
        metrics.crashes,
        time.perf_counter() - started,
        tuple(causes[c] for c in WASTE_CAUSES),
        bound.total_s,
        iterations,
        bound.binding,
        tuple(metrics.crashes_by_phase[p] for p in ("forward", "backward", "idle")),
    )


# ---- statistics ----


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """25th, 50th and 75th percentile (inclusive method); NaN if empty."""
    if not values:
        return (math.nan,) * 3
    if len(values) == 1:
        return (values[0],) * 3
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def held_to_bound(algorithm: str) -> bool:
    """Whether the lower bound is about runs of ``algorithm``: it is per iteration behind the
    barrier, so SWARM as released (and its ablations but the barrier one) and GWTF without the
    barrier are not held to it; nor is SWARM with 8-bit activations (``--swarm-8bit``)."""
    if algorithm == "gwtf-nobarrier":
        return False
    return not algorithm.startswith("swarm") or algorithm == "swarm-barrier"


def best_runs(runs: list[Run], cell: str) -> dict[int, Run]:
    """Per seed, the fastest finished run of ``cell`` among the algorithms held to the bound."""
    best: dict[int, Run] = {}
    for r in runs:
        if r.cell != cell or not held_to_bound(r.algorithm) or not r.finished:
            continue
        if r.seed not in best or r.sim_time_s < best[r.seed].sim_time_s:
            best[r.seed] = r
    return best


def paired(runs: list[Run], cell: str, a: str, b: str, key: str) -> list[float]:
    """Per seed, ``a``'s ``key`` over ``b``'s (``bound``: over the scenario's lower bound;
    ``a`` = ``best``: the fastest run held to the bound)."""
    if a == "best":
        mine = best_runs(runs, cell)
    else:
        mine = {r.seed: r for r in runs if (r.cell, r.algorithm) == (cell, a)}
    if b == "bound":
        return [r.sim_time_s / r.bound_s for r in mine.values()]
    theirs = {r.seed: r for r in runs if (r.cell, r.algorithm) == (cell, b)}
    ratios = []
    for seed in sorted(mine.keys() & theirs.keys()):
        x, y = getattr(mine[seed], key), getattr(theirs[seed], key)
        # Nothing against nothing (no waste either way), or two unfinished runs, is no ratio.
        if (x or y) and not (math.isinf(x) and math.isinf(y)):
            ratios.append(_safe_ratio(x, y))
    return ratios


def summarise(runs: list[Run]) -> dict[tuple[str, str], dict[str, float]]:
    table: dict[tuple[str, str], dict[str, float]] = {}
    for key in sorted({(r.cell, r.algorithm) for r in runs}):
        group = [r for r in runs if (r.cell, r.algorithm) == key]
        row = {
            "time_s": median([r.sim_time_s for r in group]),
            "throughput": median([r.throughput for r in group]),
            "wasted_s": median([r.wasted_gpu_s for r in group]),
            "crashes": median([float(r.crashes) for r in group]),
            "min_crashes": float(min(r.crashes for r in group)),
            **{
                f"crashes_{p}": float(sum(r.crash_phases[i] for r in group))
                for i, p in enumerate(("forward", "backward", "idle"))
            },
            "finished": sum(r.finished for r in group) / len(group),
            "bound_s": median([r.bound_s for r in group]),
            "iterations": float(group[0].iterations),
        }
        for index, cause in enumerate(WASTE_CAUSES):
            row[cause] = median([r.waste[index] for r in group])
        table[key] = row
    return table


def bound_terms(runs: list[Run]) -> dict[str, str]:
    """Per cell, the term of the lower bound that binds in most of its scenarios."""
    return {
        cell: Counter(r.bound_binding for r in runs if r.cell == cell).most_common(1)[0][0]
        for cell in {r.cell for r in runs}
    }


# ---- printing ----


def print_tables(
    table: dict[tuple[str, str], dict[str, float]],
    cells: list[str],
    algorithms: list[str],
    terms: dict[str, str],
) -> None:
    print(
        "\n| cell | it. | algorithm | time s | mb/s | wasted GPU s: lost / recomputed / restarted "
        "/ cut / superseded | crashes (min); all seeds in fwd / bwd / idle | done |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for cell in cells:
        for algorithm in algorithms:
            row = table.get((cell, algorithm))
            if row is None:
                continue
            split = " / ".join(f"{row[c]:.1f}" for c in WASTE_CAUSES)
            phases = " / ".join(
                f"{row[f'crashes_{p}']:.0f}" for p in ("forward", "backward", "idle")
            )
            print(
                f"| {cell} | {row['iterations']:.0f} | {algorithm} | {_fmt(row['time_s'])} | "
                f"{row['throughput']:.3f} | {_fmt(row['wasted_s'])}: {split} | "
                f"{row['crashes']:.0f} ({row['min_crashes']:.0f}); {phases} | "
                f"{row['finished']:.0%} |"
            )
        bound = next((r["bound_s"] for (c, _), r in table.items() if c == cell), math.nan)
        print(f"| {cell} | | lower bound ({terms.get(cell, '')}) | {_fmt(bound)} | | | | |")


RATIOS = (
    ("GWTF / SWARM time", "gwtf", "swarm", "sim_time_s"),
    ("GWTF / DT-FM time", "gwtf", "dtfm", "sim_time_s"),
    ("GWTF / SWARM thr", "gwtf", "swarm", "throughput"),
    ("GWTF / central thr", "gwtf", CENTRAL, "throughput"),
    ("GWTF / bound time", "gwtf", "bound", "sim_time_s"),
    ("GWTF / oracles time", "gwtf", ORACLES, "sim_time_s"),
    ("central / bound time", CENTRAL, "bound", "sim_time_s"),
    ("best / bound time", "best", "bound", "sim_time_s"),
    ("GWTF / SWARM wasted", "gwtf", "swarm", "wasted_gpu_s"),
    ("same, recompute aside", "gwtf", "swarm", "wasted_but_recompute_s"),
)


def print_ratios(runs: list[Run], cells: list[str], setup: Setup) -> None:
    """Per-seed ratios, paired on the same scenario: median [first quartile, third quartile]."""
    # Compressed activations are not what the bound is about: no SWARM run is "best" then.
    held = [r for r in runs if not (setup.swarm_8bit and r.algorithm.startswith("swarm"))]
    print("\n| cell | " + " | ".join(name for name, *_ in RATIOS) + " |")
    print("|---|" + "---|" * len(RATIOS))
    for cell in cells:
        parts = []
        for _, a, b, key in RATIOS:
            q1, q2, q3 = quartiles(paired(held if a == "best" else runs, cell, a, b, key))
            parts.append(
                "n/a" if math.isnan(q2) else f"{_fmt(q2, 2)} [{_fmt(q1, 2)}, {_fmt(q3, 2)}]"
            )
        print(f"| {cell} | " + " | ".join(parts) + " |")


def print_goals(runs: list[Run], cells: list[str], tuning_runs: list[Run], setup: Setup) -> None:
    def ratio(cell: str, a: str, b: str, key: str) -> float:
        return quartiles(paired(runs, cell, a, b, key))[1]

    print("\n| goal (median of per-seed ratios) | measured | target | verdict |")
    print("|---|---|---|---|")
    churn = [c for c in cells if not c.endswith("churn0")]
    calm = [c for c in cells if c.endswith("churn0")]
    if KEY_CELL in cells:
        _goal(
            f"{KEY_CELL}: GWTF / SWARM time", ratio(KEY_CELL, "gwtf", "swarm", "sim_time_s"), 0.55
        )
        _goal(f"{KEY_CELL}: GWTF / DT-FM time", ratio(KEY_CELL, "gwtf", "dtfm", "sim_time_s"), 0.7)
    for cell in calm:
        _goal(f"{cell}: GWTF / SWARM thr", ratio(cell, "gwtf", "swarm", "throughput"), 1.3, True)
    for cell in calm:
        _goal(f"{cell}: GWTF / central thr", ratio(cell, "gwtf", CENTRAL, "throughput"), 0.97, True)
    for cell in churn:
        _goal(f"{cell}: GWTF / SWARM wasted", ratio(cell, "gwtf", "swarm", "wasted_gpu_s"), 0.2)
    # The bound is per iteration behind a barrier, with activations as the model holds them:
    # SWARM as released (no barrier, maybe 8-bit) is not held to it.
    checked = [r for r in runs + tuning_runs if not r.algorithm.startswith("swarm")]
    checked += [r for r in runs if r.algorithm == "swarm-barrier" and not setup.swarm_8bit]
    beaten = [r for r in checked if r.finished and r.sim_time_s < r.bound_s]
    print(f"\nruns finishing below the lower bound: {len(beaten)} of {len(checked)} (must be 0)")


def _safe_ratio(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


def _goal(name: str, value: float, bound: float, higher: bool = False) -> None:
    target = f"{'>=' if higher else '<='} {bound:g}"
    if math.isnan(value):
        verdict = "n/a"
    else:
        verdict = "PASS" if (value >= bound if higher else value <= bound) else "FAIL"
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
    width = 0.8 / max(len(algos) + 1, 1)
    series = [*algos, "lower bound"]
    for index, algorithm in enumerate(series):
        xs = [c + index * width for c in range(len(cells))]
        if algorithm == "lower bound":
            times = [
                next((r["bound_s"] for (c, _), r in table.items() if c == cell), 0)
                for cell in cells
            ]
            wasted = [0.0 for _ in cells]
        else:
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


def run_all(jobs: list[Job], processes: int) -> list[Run]:
    jobs = list(dict.fromkeys(jobs))
    with ProcessPoolExecutor(max_workers=processes) as pool:
        return list(pool.map(run_one, jobs, chunksize=1))


SWEEP_ALGORITHMS = "gwtf,swarm,dtfm"


def sweep(setup: Setup, seeds: int, iterations: int, processes: int, algorithms: str) -> None:
    """GWTF against the baselines at each churn level of ``SWEEP_CHURN`` (10-region, heterogeneous
    GPUs, ``iterations`` each): median time and per-seed paired ratios, median [quartiles]."""
    names = (
        algorithms.split(",") if algorithms != DEFAULT_ALGORITHMS else SWEEP_ALGORITHMS.split(",")
    )
    cells = [GridCell(True, True, churn) for churn in SWEEP_CHURN]
    reporting = range(FIRST_REPORTING_SEED, FIRST_REPORTING_SEED + seeds)
    jobs = [(c, a, s, iterations, setup) for c in cells for a in names for s in reporting]
    print(
        f"sweep: {len(jobs)} runs, {iterations} iterations, seeds {reporting.start}-"
        f"{reporting.stop - 1}; timeouts {setup.timeout_s or 'as shipped'}, "
        f"{setup.trainers} trainer(s) per data node, SWARM 8-bit {setup.swarm_8bit}"
    )
    started = time.perf_counter()
    runs = run_all(jobs, processes)
    print(f"wall time {time.perf_counter() - started:.1f} s")
    baselines = [a for a in names if a != "gwtf"]
    header = " | ".join(f"{a} s" for a in names)
    ratios = " | ".join(f"GWTF / {a} time" for a in baselines)
    print(f"\n| churn %/h | crashes | {header} | {ratios} | not finished |")
    print("|---|---|" + "---|" * (len(names) + len(baselines)) + "---|")
    for cell in cells:
        mine = [r for r in runs if r.cell == cell.label]
        crashes = median([float(r.crashes) for r in mine if r.algorithm == "gwtf"])
        times = [_fmt(median([r.sim_time_s for r in mine if r.algorithm == a]), 0) for a in names]
        parts = []
        for other in baselines:
            q1, q2, q3 = quartiles(paired(runs, cell.label, "gwtf", other, "sim_time_s"))
            parts.append(f"{_fmt(q2, 2)} [{_fmt(q1, 2)}, {_fmt(q3, 2)}]")
        unfinished = sum(not r.finished for r in mine)
        print(
            f"| {cell.churn_per_hour * 100:g} | {crashes:.0f} | {' | '.join(times)} | "
            f"{' | '.join(parts)} | {unfinished} |"
        )
    print(f"\nplot: {plot_sweep(runs, cells, baselines, setup)}")


def plot_sweep(runs: list[Run], cells: list[GridCell], baselines: list[str], setup: Setup) -> Path:
    """GWTF's time over each baseline's against churn, median and quartiles: below 1 GWTF wins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(range(len(cells)))
    for other in baselines:
        stats = [quartiles(paired(runs, c.label, "gwtf", other, "sim_time_s")) for c in cells]
        mid = [q[1] for q in stats]
        low = [q[1] - q[0] for q in stats]
        high = [q[2] - q[1] for q in stats]
        ax.errorbar(xs, mid, yerr=[low, high], marker="o", capsize=3, label=f"GWTF / {other}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{c.churn_per_hour * 100:g}" for c in cells])
    ax.set_xlabel("churn, % of relays per hour")
    ax.set_ylabel("time ratio (below 1: GWTF faster)")
    ax.set_title(
        f"timeouts {setup.timeout_s or 'as shipped'}, {setup.trainers} trainer(s) per data node"
    )
    ax.legend()
    fig.tight_layout()
    path = OUT / f"sim_sweep-t{setup.trainers}-timeout{setup.timeout_s or 'shipped'}.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 cells, 5 reporting seeds")
    parser.add_argument("--seeds", type=int, default=None, help="reporting seeds (from 10)")
    parser.add_argument("--iterations", type=int, default=None, help="fixed, for every cell")
    parser.add_argument("--min-crashes", type=float, default=10.0, help="expected per churn run")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--algorithms",
        default=DEFAULT_ALGORITHMS,
        help=f"also: gwtf-allslots, {CENTRAL_ALL} (every relay slot), {LIKE} (GWTF with "
        f"{LIKE_SETTINGS}, heterogeneous cells only), gwtf@FIELD=VALUE+FIELD=VALUE",
    )
    parser.add_argument("--cells", default=None, help="only these cells (comma-separated labels)")
    parser.add_argument(
        "--timeout", type=float, default=None, help="SWARM's forward and DT-FM's hop timeout, s"
    )
    parser.add_argument("--trainers", type=int, default=1, help="trainers per data node (1, 8)")
    parser.add_argument("--swarm-8bit", action="store_true", help="SWARM's 8-bit activations")
    parser.add_argument(
        "--sweep", action="store_true", help="GWTF / SWARM / DT-FM over churn 0-300 %%/h"
    )
    args = parser.parse_args()
    setup = Setup(args.timeout, args.trainers, args.swarm_8bit)
    if args.sweep:
        sweep(setup, args.seeds or 5, args.iterations or 100, args.jobs, args.algorithms)
        return 0
    seeds = args.seeds or (5 if args.quick else 20)
    reporting = range(FIRST_REPORTING_SEED, FIRST_REPORTING_SEED + seeds)
    cells = paper_grid()
    if args.quick:
        keep = {"hom-1reg-churn0", "het-10reg-churn0", "het-10reg-churn100", KEY_CELL}
        cells = [c for c in cells if c.label in keep]
    if args.cells:
        wanted = set(args.cells.split(","))
        unknown = wanted - {c.label for c in cells}
        if unknown:
            parser.error(f"unknown cells {sorted(unknown)}; the grid's labels are like {KEY_CELL}")
        cells = [c for c in cells if c.label in wanted]
    algorithms = args.algorithms.split(",")
    started = time.perf_counter()
    length = {c.label: iterations_of(c, args.iterations, args.min_crashes) for c in cells}
    scales: dict[str, str] = {}
    tuning_runs: list[Run] = []
    if CENTRAL in algorithms:
        tuned = [c for c in cells if c.heterogeneous]
        tuning = [
            (c, variant_name(s), seed, length[c.label], setup)
            for c in tuned
            for s in CENTRAL_SCALES
            for seed in TUNING_SEEDS
        ]
        print(f"tuning the central heuristic's slot rule: {len(tuning)} runs on seeds 0-9")
        tuning_runs = run_all(tuning, args.jobs)
        scales = choose_central_scales(tuning_runs)
        print("  chosen: " + ", ".join(f"{c} {s}" for c, s in scales.items()))
    jobs = [
        (c, variant, s, length[c.label], setup)
        for c in cells
        for a in algorithms
        for variant in expand(c, a, scales)
        for s in reporting
    ]
    print(
        f"{len(jobs)} runs: {len(cells)} cells x {len(algorithms)} algorithms x seeds "
        f"{reporting.start}-{reporting.stop - 1}; iterations per cell "
        + ", ".join(f"{c} {n}" for c, n in length.items())
    )
    runs = run_all(jobs, args.jobs)
    print(f"wall time {time.perf_counter() - started:.1f} s")
    # Copies under the table's names: every slot first, before the chosen rule is renamed.
    if CENTRAL_ALL in algorithms:
        runs += [
            replace(r, algorithm=CENTRAL_ALL) for r in runs if r.algorithm == variant_name(None)
        ]
    runs = [
        replace(r, algorithm=CENTRAL)
        if r.algorithm == f"{CENTRAL}@{scales.get(r.cell, 'all')}" and CENTRAL in algorithms
        else r
        for r in runs
    ]
    table = summarise(runs)
    labels = [c.label for c in cells]
    print_tables(table, labels, algorithms, bound_terms(runs))
    print_ratios(runs, labels, setup)
    print_goals(runs, labels, tuning_runs, setup)
    print(f"\nplot: {plot(table, labels, algorithms)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
