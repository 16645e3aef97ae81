"""Small hand-built scenarios for the simulator and baseline tests."""

from __future__ import annotations

import copy
from typing import Any

from gwtf.coordinator_free.sim.scenario import Scenario, parse_scenario
from gwtf.coordinator_free.sim.world import World


def scenario_document(
    relays_per_stage: int = 2,
    stages: int = 2,
    data_nodes: int = 1,
    data_capacity: int = 4,
    relay_capacity: int = 2,
    iterations: int = 3,
    speeds: list[float] | None = None,
    regions: int = 1,
    events: list[dict[str, Any]] | None = None,
    crash_rate_per_hour: float = 0.0,
    activation_bytes: int = 1_000_000,
    preset_stages: bool = True,
) -> dict[str, Any]:
    """A scenario as a JSON document; relays are ``r<stage>_<i>`` when stages are preset."""
    names = ["a", "b", "c"][:regions]
    latency = [[5.0 if i == j else 50.0 for j in range(regions)] for i in range(regions)]
    bandwidth = [[2.0 if i == j else 0.5 for j in range(regions)] for i in range(regions)]
    nodes: list[dict[str, Any]] = [
        {
            "id": f"d{d}",
            "role": "data",
            "region": names[d % regions],
            "speed": 1.0,
            "capacity": data_capacity,
            "stage": None,
        }
        for d in range(data_nodes)
    ]
    index = 0
    for stage in range(1, stages + 1):
        for i in range(relays_per_stage):
            speed = speeds[index] if speeds else 1.0
            nodes.append(
                {
                    "id": f"r{stage}_{i}",
                    "role": "relay",
                    "region": names[index % regions],
                    "speed": speed,
                    "capacity": relay_capacity,
                    "stage": stage if preset_stages else None,
                }
            )
            index += 1
    return {
        "name": "hand-built",
        "seed": 7,
        "topology": {"regions": names, "latency_ms": latency, "bandwidth_gbps": bandwidth},
        "model": {
            "stages": stages,
            "activation_bytes": activation_bytes,
            "stage_compute_ms": 300.0,
            "stage_param_bytes": 10_000_000,
        },
        "nodes": nodes,
        "churn": {
            "crash_rate_per_hour": crash_rate_per_hour,
            "rejoin": crash_rate_per_hour > 0,
            "mean_downtime_s": 30.0,
            "events": events or [],
        },
        "workload": {"iterations": iterations},
    }


def small_scenario(**kwargs: Any) -> Scenario:
    return parse_scenario(scenario_document(**kwargs))


def edited(document: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    """A deep copy of ``document`` with ``value`` set at ``path`` (a missing value deletes)."""
    result = copy.deepcopy(document)
    target: Any = result
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return result


_DELETE = object()
DELETE = _DELETE


def live_world(scenario: Scenario, full_knowledge: bool = False) -> World:
    """A world in which every node of ``scenario`` is known and up, for a policy to read."""
    world = World(scenario, full_knowledge)
    for entry in world.scenario.nodes:
        world.mark_known(entry.id)
        world.nodes[entry.id].alive = True
    return world
