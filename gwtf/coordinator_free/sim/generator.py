"""The paper-like grid of scenarios, built from the 10-region latency/bandwidth matrix.

Axes (as in the GWTF paper's evaluation): homogeneous vs heterogeneous GPUs (speeds drawn from
1.0 / 0.6 / 0.35), every node in one region vs spread over the 10 regions, and churn of 0, 33, 100
or 300 % of relays crashing per hour (crashed relays come back after ``mean_downtime_s`` on
average, so the swarm keeps its size while membership changes). At 33 %/h a run of a few hundred
seconds sees one or two crashes, too few to tell algorithms apart: ``iterations_for_crashes``
makes churn runs long enough to see a number of crashes. Every relay starts with ``stage`` null,
so each algorithm places relays its own way.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from gwtf.coordinator_free.sim.scenario import Scenario, parse_scenario
from gwtf.errors import ConfigError

HETEROGENEOUS_SPEEDS = (1.0, 0.6, 0.35)
CHURN_LEVELS_PER_HOUR = (0.0, 0.33, 1.0, 3.0)
#: The region used by one-region scenarios.
SINGLE_REGION = "frankfurt"


@dataclass(frozen=True)
class GridSize:
    """How big each generated scenario is; defaults keep a whole grid to seconds per run.

    Model defaults: a microbatch of 1 x 1024 tokens with hidden size 2048 in bf16 gives 4 MiB of
    activations; a stage of ~25 M parameters in bf16 gives 50 MB to average; 600 ms forward +
    backward per stage at speed 1.0. Data nodes (the sponsor's machines) are given speed 2.0 so
    that the head and loss, which every microbatch needs, are not the whole swarm's bottleneck.
    """

    stages: int = 4
    relays: int = 24
    data_nodes: int = 4
    data_capacity: int = 8
    data_speed: float = 2.0
    relay_capacity: int = 4
    iterations: int = 30
    activation_bytes: int = 4 * 1024 * 1024
    stage_compute_ms: float = 600.0
    stage_param_bytes: int = 50_000_000
    mean_downtime_s: float = 300.0
    #: Each data node's batch split over this many trainers of its region, each with its own
    #: machine and uplink (SWARM's experiments run many small trainers, each with one sample in
    #: flight); ``data_capacity`` must divide by it.
    trainers_per_data_node: int = 1


@dataclass(frozen=True)
class GridCell:
    """One point of the grid."""

    heterogeneous: bool
    ten_regions: bool
    churn_per_hour: float

    @property
    def label(self) -> str:
        gpus = "het" if self.heterogeneous else "hom"
        geo = "10reg" if self.ten_regions else "1reg"
        return f"{gpus}-{geo}-churn{round(self.churn_per_hour * 100)}"


def load_regions() -> dict[str, object]:
    """The packaged 10-region matrix (one-way latency in ms, bandwidth in Gbit/s)."""
    text = resources.files("gwtf.coordinator_free.sim").joinpath("data/regions-10.json").read_text()
    data: dict[str, object] = json.loads(text)
    return data


def paper_grid() -> list[GridCell]:
    return [
        GridCell(heterogeneous, ten_regions, churn)
        for heterogeneous in (False, True)
        for ten_regions in (False, True)
        for churn in CHURN_LEVELS_PER_HOUR
    ]


def build_scenario(cell: GridCell, seed: int, size: GridSize | None = None) -> Scenario:
    """One scenario of the grid; the same (cell, seed, size) always gives the same scenario."""
    size = size or GridSize()
    rng = random.Random(f"{cell.label}/{seed}")
    regions_data = load_regions()
    names = list(regions_data["regions"])  # type: ignore[call-overload]
    regions = names if cell.ten_regions else [SINGLE_REGION]
    index = [names.index(r) for r in regions]
    matrix = {
        key: [[regions_data[key][i][j] for j in index] for i in index]  # type: ignore[index]
        for key in ("latency_ms", "bandwidth_gbps")
    }
    split = size.trainers_per_data_node
    if split < 1 or size.data_capacity % split:
        raise ConfigError(
            f"trainers_per_data_node {split} must be >= 1 and divide data_capacity "
            f"{size.data_capacity}; choose a divisor such as 1 or 8"
        )
    nodes = []
    for d in range(size.data_nodes):
        region = rng.choice(regions)
        if split == 1:
            nodes.append(_node(f"data{d}", "data", region, size.data_speed, size.data_capacity))
            continue
        capacity = size.data_capacity // split
        nodes += [
            _node(f"data{d}t{t}", "data", region, size.data_speed, capacity) for t in range(split)
        ]
    for r in range(size.relays):
        speed = rng.choice(HETEROGENEOUS_SPEEDS) if cell.heterogeneous else 1.0
        nodes.append(_node(f"relay{r}", "relay", rng.choice(regions), speed, size.relay_capacity))
    document = {
        "name": f"{cell.label}-s{seed}" + (f"-t{split}" if split > 1 else ""),
        "seed": seed,
        "topology": {"regions": regions, **matrix},
        "model": {
            "stages": size.stages,
            "activation_bytes": size.activation_bytes,
            "stage_compute_ms": size.stage_compute_ms,
            "stage_param_bytes": size.stage_param_bytes,
        },
        "nodes": nodes,
        "churn": {
            "crash_rate_per_hour": cell.churn_per_hour,
            "rejoin": True,
            "mean_downtime_s": size.mean_downtime_s,
            "events": [],
        },
        "workload": {"iterations": size.iterations},
    }
    return parse_scenario(document)


def write_grid(outdir: str | Path, seeds: int = 5, size: GridSize | None = None) -> list[Path]:
    """Write every cell x seed of the grid as ``<label>-s<seed>.json``; return the paths."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for cell in paper_grid():
        for seed in range(seeds):
            scenario = build_scenario(cell, seed, size)
            path = out / f"{scenario.name}.json"
            path.write_text(json.dumps(scenario.to_json(), indent=1))
            paths.append(path)
    return paths


def iterations_for_crashes(
    cell: GridCell, size: GridSize, crashes: float, seconds_per_iteration: float
) -> int:
    """Iterations after which a run of ``cell`` expects at least ``crashes`` relay crashes, if
    no iteration takes less than ``seconds_per_iteration`` (a run that is faster sees fewer). A
    relay crashes at ``churn_per_hour`` while up and is up a share 1 / (1 + rate × mean
    downtime) of the time."""
    rate_per_s = cell.churn_per_hour / 3600.0
    if rate_per_s <= 0:
        return size.iterations
    up_share = 1.0 / (1.0 + rate_per_s * size.mean_downtime_s)
    seconds = crashes / (size.relays * rate_per_s * up_share)
    return max(size.iterations, math.ceil(seconds / seconds_per_iteration))


def scaled(size: GridSize, relays: int, data_nodes: int, iterations: int) -> GridSize:
    """A grid size with a different node count (for the scale benchmark)."""
    return replace(size, relays=relays, data_nodes=data_nodes, iterations=iterations)


def _node(node_id: str, role: str, region: str, speed: float, capacity: int) -> dict[str, object]:
    return {
        "id": node_id,
        "role": role,
        "region": region,
        "speed": speed,
        "capacity": capacity,
        "stage": None,
    }
