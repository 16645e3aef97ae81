"""Scenario files: the JSON schema of a simulated run, loaded into frozen dataclasses and validated.

The schema is fixed (see gwtf/coordinator_free/README.md, "Scenario schema"): unknown keys and
missing keys are errors, every number is range-checked, names must refer to things that exist. Any
problem raises ``ScenarioError`` with one line naming the offending key and what to do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from gwtf.errors import ConfigError

#: Scenario files larger than this are refused before parsing (untrusted input is bounded).
MAX_SCENARIO_BYTES = 64 * 1024 * 1024
MAX_NODES = 200_000


class ScenarioError(ConfigError):
    """A scenario file is malformed; the message names the key and how to fix it."""


@dataclass(frozen=True)
class Topology:
    regions: tuple[str, ...]
    latency_ms: tuple[tuple[float, ...], ...]
    bandwidth_gbps: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class ModelSpec:
    stages: int
    activation_bytes: int
    stage_compute_ms: float
    stage_param_bytes: int


@dataclass(frozen=True)
class NodeEntry:
    id: str
    role: Literal["data", "relay"]
    region: str
    speed: float
    capacity: int
    stage: int | None


@dataclass(frozen=True)
class ChurnEvent:
    t: float
    node: str
    event: Literal["crash", "join"]


@dataclass(frozen=True)
class Churn:
    crash_rate_per_hour: float
    rejoin: bool
    mean_downtime_s: float
    events: tuple[ChurnEvent, ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    topology: Topology
    model: ModelSpec
    nodes: tuple[NodeEntry, ...]
    churn: Churn
    iterations: int

    def to_json(self) -> dict[str, Any]:
        """The scenario as the JSON object ``parse_scenario`` reads back."""
        return {
            "name": self.name,
            "seed": self.seed,
            "topology": {
                "regions": list(self.topology.regions),
                "latency_ms": [list(row) for row in self.topology.latency_ms],
                "bandwidth_gbps": [list(row) for row in self.topology.bandwidth_gbps],
            },
            "model": {
                "stages": self.model.stages,
                "activation_bytes": self.model.activation_bytes,
                "stage_compute_ms": self.model.stage_compute_ms,
                "stage_param_bytes": self.model.stage_param_bytes,
            },
            "nodes": [
                {
                    "id": n.id,
                    "role": n.role,
                    "region": n.region,
                    "speed": n.speed,
                    "capacity": n.capacity,
                    "stage": n.stage,
                }
                for n in self.nodes
            ],
            "churn": {
                "crash_rate_per_hour": self.churn.crash_rate_per_hour,
                "rejoin": self.churn.rejoin,
                "mean_downtime_s": self.churn.mean_downtime_s,
                "events": [{"t": e.t, "node": e.node, "event": e.event} for e in self.churn.events],
            },
            "workload": {"iterations": self.iterations},
        }


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    file = Path(path)
    try:
        size = file.stat().st_size
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {file}: {exc.strerror}; check the path") from exc
    if size > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"scenario {file} is {size} bytes, over {MAX_SCENARIO_BYTES}; split it")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"scenario {file} is not valid JSON ({exc}); fix the file") from exc
    return parse_scenario(data)


def parse_scenario(data: object) -> Scenario:
    """Validate a decoded JSON object against the scenario schema."""
    top = _object(
        data, "scenario", ("name", "seed", "topology", "model", "nodes", "churn", "workload")
    )
    name = _str(top["name"], "name")
    seed = _int(top["seed"], "seed", 0, 2**63 - 1)
    topology = _topology(top["topology"])
    model = _model(top["model"])
    nodes = _nodes(top["nodes"], topology, model)
    churn = _churn(top["churn"], {n.id for n in nodes})
    workload = _object(top["workload"], "workload", ("iterations",))
    iterations = _int(workload["iterations"], "workload.iterations", 1, 10_000_000)
    return Scenario(name, seed, topology, model, nodes, churn, iterations)


def _topology(value: object) -> Topology:
    obj = _object(value, "topology", ("regions", "latency_ms", "bandwidth_gbps"))
    regions = tuple(
        _str(r, "topology.regions[]") for r in _list(obj["regions"], "topology.regions")
    )
    if not regions:
        raise ScenarioError("topology.regions is empty; list at least one region")
    if len(set(regions)) != len(regions):
        raise ScenarioError("topology.regions has duplicates; give each region once")
    latency = _matrix(obj["latency_ms"], "topology.latency_ms", len(regions), 0.0, 1e6)
    bandwidth = _matrix(obj["bandwidth_gbps"], "topology.bandwidth_gbps", len(regions), 1e-9, 1e6)
    return Topology(regions, latency, bandwidth)


def _model(value: object) -> ModelSpec:
    keys = ("stages", "activation_bytes", "stage_compute_ms", "stage_param_bytes")
    obj = _object(value, "model", keys)
    return ModelSpec(
        stages=_int(obj["stages"], "model.stages", 1, 10_000),
        activation_bytes=_int(obj["activation_bytes"], "model.activation_bytes", 1, 2**40),
        stage_compute_ms=_float(obj["stage_compute_ms"], "model.stage_compute_ms", 1e-6, 1e9),
        stage_param_bytes=_int(obj["stage_param_bytes"], "model.stage_param_bytes", 1, 2**50),
    )


def _nodes(value: object, topology: Topology, model: ModelSpec) -> tuple[NodeEntry, ...]:
    items = _list(value, "nodes")
    if len(items) > MAX_NODES:
        raise ScenarioError(f"nodes has {len(items)} entries, over {MAX_NODES}; simulate fewer")
    nodes: list[NodeEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"nodes[{index}]"
        obj = _object(item, where, ("id", "role", "region", "speed", "capacity", "stage"))
        node_id = _str(obj["id"], f"{where}.id")
        if node_id in seen:
            raise ScenarioError(f"{where}.id {node_id!r} is used twice; node ids must be unique")
        seen.add(node_id)
        role = obj["role"]
        if role not in ("data", "relay"):
            raise ScenarioError(f'{where}.role is {role!r}; use "data" or "relay"')
        region = _str(obj["region"], f"{where}.region")
        if region not in topology.regions:
            raise ScenarioError(f"{where}.region {region!r} is not in topology.regions; add it")
        stage: int | None = None
        if obj["stage"] is not None:
            stage = _int(obj["stage"], f"{where}.stage", 1, model.stages)
            if role == "data":
                raise ScenarioError(f"{where}.stage must be null for a data node; remove it")
        nodes.append(
            NodeEntry(
                id=node_id,
                role=role,
                region=region,
                speed=_float(obj["speed"], f"{where}.speed", 1e-6, 1e6),
                capacity=_int(obj["capacity"], f"{where}.capacity", 1, 1_000_000),
                stage=stage,
            )
        )
    if not any(n.role == "data" for n in nodes):
        raise ScenarioError('nodes has no data node; add one with role "data"')
    return tuple(nodes)


def _churn(value: object, node_ids: set[str]) -> Churn:
    keys = ("crash_rate_per_hour", "rejoin", "mean_downtime_s", "events")
    obj = _object(value, "churn", keys)
    rejoin = obj["rejoin"]
    if not isinstance(rejoin, bool):
        raise ScenarioError(f"churn.rejoin is {rejoin!r}; use true or false")
    events: list[ChurnEvent] = []
    for index, item in enumerate(_list(obj["events"], "churn.events")):
        where = f"churn.events[{index}]"
        ev = _object(item, where, ("t", "node", "event"))
        node = _str(ev["node"], f"{where}.node")
        if node not in node_ids:
            raise ScenarioError(f"{where}.node {node!r} is not in nodes; add it or fix the name")
        kind = ev["event"]
        if kind not in ("crash", "join"):
            raise ScenarioError(f'{where}.event is {kind!r}; use "crash" or "join"')
        t = _float(ev["t"], f"{where}.t", 0.0, 1e12)
        events.append(ChurnEvent(t, node, kind))
    return Churn(
        crash_rate_per_hour=_float(obj["crash_rate_per_hour"], "churn.crash_rate_per_hour", 0, 1e6),
        rejoin=rejoin,
        mean_downtime_s=_float(obj["mean_downtime_s"], "churn.mean_downtime_s", 0.0, 1e12),
        events=tuple(sorted(events, key=lambda e: e.t)),
    )


# ---- primitive checks ----


def _object(value: object, where: str, keys: tuple[str, ...]) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where} must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise ScenarioError(f"{where} has unknown key {unknown[0]!r}; allowed: {', '.join(keys)}")
    for key in keys:
        if key not in value:
            raise ScenarioError(f"{where} is missing key {key!r}; add it")
    return cast(Mapping[str, object], value)


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise ScenarioError(f"{where} must be a JSON array, got {type(value).__name__}")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ScenarioError(f"{where} must be a non-empty string of at most 256 characters")
    return value


def _int(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ScenarioError(f"{where} is {value}; use a value in [{low}, {high}]")
    return value


def _float(value: object, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise ScenarioError(f"{where} is {value}; use a finite number in [{low:g}, {high:g}]")
    return number


def _matrix(
    value: object, where: str, size: int, low: float, high: float
) -> tuple[tuple[float, ...], ...]:
    rows = _list(value, where)
    if len(rows) != size:
        raise ScenarioError(f"{where} has {len(rows)} rows; it needs one per region ({size})")
    matrix = []
    for i, row in enumerate(rows):
        cells = _list(row, f"{where}[{i}]")
        if len(cells) != size:
            raise ScenarioError(f"{where}[{i}] has {len(cells)} entries; it needs {size}")
        matrix.append(
            tuple(_float(c, f"{where}[{i}][{j}]", low, high) for j, c in enumerate(cells))
        )
    return tuple(matrix)
