"""``gwtf-sim``: JSON output, the grid generator, and one-line errors with documented codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf.coordinator_free.sim.cli import main
from tests.coordinator_free.sim_helpers import scenario_document

REQUIRED = {
    "algorithm",
    "iterations_completed",
    "sim_time_s",
    "microbatches_completed",
    "throughput_mb_per_s",
    "wasted_gpu_s",
    "crashes",
    "joins",
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_document(iterations=2)))
    return path


@pytest.mark.parametrize("algorithm", ["swarm", "dtfm", "central"])
def test_json_output_has_the_required_fields(
    scenario_file: Path, algorithm: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(scenario_file), "--algorithm", algorithm, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= REQUIRED
    assert out["algorithm"] == algorithm
    assert out["iterations_completed"] == 2
    assert out["microbatches_completed"] == 8


def test_text_output_lists_the_metrics(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(scenario_file), "--algorithm", "swarm"]) == 0
    assert "throughput_mb_per_s" in capsys.readouterr().out


def test_bad_scenario_is_one_line_on_stderr_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    document = scenario_document()
    document["model"]["colour"] = "blue"
    bad.write_text(json.dumps(document))
    assert main([str(bad), "--algorithm", "swarm", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "unknown key 'colour'" in err


def test_unknown_algorithm_and_missing_flag_exit_2(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(scenario_file), "--algorithm", "magic"]) == 2
    assert main([str(scenario_file)]) == 2
    assert "gwtf-sim --help" in capsys.readouterr().err


def test_generate_writes_the_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid"
    assert main(["generate", str(out), "--seeds", "2", "--iterations", "3"]) == 0
    files = sorted(out.glob("*.json"))
    assert len(files) == 2 * 16
    names = {f.name for f in files}
    assert "het-10reg-churn300-s1.json" in names
    assert "hom-1reg-churn0-s0.json" in names
    assert main([str(files[0]), "--algorithm", "swarm", "--json"]) == 0
    capsys.readouterr()
    assert main(["generate", str(out), "--seeds", "0"]) == 2
