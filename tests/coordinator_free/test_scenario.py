"""Scenario schema: valid files load, and every kind of mistake is named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf.coordinator_free.sim.scenario import ScenarioError, load_scenario, parse_scenario
from gwtf.errors import ConfigError
from tests.coordinator_free.sim_helpers import DELETE, edited, scenario_document


def test_valid_document_loads_with_its_values() -> None:
    scenario = parse_scenario(scenario_document(relays_per_stage=3, stages=2, iterations=5))
    assert scenario.model.stages == 2
    assert scenario.iterations == 5
    assert [n.id for n in scenario.nodes if n.role == "relay"][:2] == ["r1_0", "r1_1"]
    assert scenario.nodes[0].stage is None  # data nodes have no stage


def test_to_json_round_trips() -> None:
    scenario = parse_scenario(
        scenario_document(events=[{"t": 3, "node": "r1_0", "event": "crash"}])
    )
    assert parse_scenario(json.loads(json.dumps(scenario.to_json()))) == scenario


def test_scenario_error_is_a_config_error() -> None:
    assert issubclass(ScenarioError, ConfigError)


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (["extra"], 1, "unknown key 'extra'"),
        (["model", "layers"], 3, "model has unknown key 'layers'"),
        (["nodes", 0, "gpu"], "a100", "nodes[0] has unknown key 'gpu'"),
        (["churn", "events"], [{"t": 1, "node": "r1_0", "event": "crash", "x": 1}], "unknown key"),
        (["name"], DELETE, "missing key 'name'"),
        (["workload", "iterations"], DELETE, "workload is missing key 'iterations'"),
        (["nodes", 1, "capacity"], DELETE, "nodes[1] is missing key 'capacity'"),
        (["topology", "bandwidth_gbps"], DELETE, "missing key 'bandwidth_gbps'"),
    ],
)
def test_unknown_and_missing_keys_are_named(
    path: list[str | int], value: object, fragment: str
) -> None:
    with pytest.raises(ScenarioError, match=None) as info:
        parse_scenario(edited(scenario_document(), path, value))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (["seed"], "7", "seed must be an integer"),
        (["seed"], True, "seed must be an integer"),
        (["model", "stages"], 0, "model.stages is 0"),
        (["model", "stage_compute_ms"], float("nan"), "model.stage_compute_ms"),
        (["nodes", 1, "role"], "worker", 'use "data" or "relay"'),
        (["nodes", 1, "region"], "mars", "not in topology.regions"),
        (["nodes", 1, "stage"], 9, "nodes[1].stage is 9"),
        (["nodes", 0, "stage"], 1, "must be null for a data node"),
        (["nodes", 1, "speed"], -1, "nodes[1].speed"),
        (["nodes", 2, "id"], "r1_0", "used twice"),
        (["topology", "latency_ms"], [[5.0, 1.0]], "needs 1"),
        (["topology", "bandwidth_gbps"], [[0.0]], "bandwidth_gbps[0][0]"),
        (["churn", "rejoin"], 1, "churn.rejoin"),
        (["churn", "events"], [{"t": 1, "node": "ghost", "event": "crash"}], "'ghost'"),
        (["churn", "events"], [{"t": 1, "node": "r1_0", "event": "leave"}], '"crash" or'),
        (["nodes"], [], "no data node"),
    ],
)
def test_bad_values_are_refused(path: list[str | int], value: object, fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(edited(scenario_document(), path, value))
    assert fragment in str(info.value)


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(ScenarioError, match="must be a JSON object"):
        parse_scenario([1, 2])


def test_load_reports_bad_json_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "absent.json")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(scenario_document()))
    assert load_scenario(good).name == "hand-built"
