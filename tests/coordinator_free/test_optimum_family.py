"""The benchmark's optimum is the best run of its family per scenario, never below the every-slot
optimum, and the family collapses to one run where every GPU is equally fast."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from coordinator_free.baselines.optimal import OptimalPolicy
from coordinator_free.sim.engine import run_scenario
from coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.errors import ConfigError


def _sim_compare() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "sim_compare.py"
    spec = importlib.util.spec_from_file_location("sim_compare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sim_compare"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SC = _sim_compare()


def run(algorithm: str, seed: int, throughput: float, finished: bool = True) -> object:
    time_s = 100.0 / throughput if finished else math.inf
    return SC.Run("c", algorithm, seed, finished, time_s, throughput, 0.0, 0, 0.0)


def test_best_of_family_keeps_the_fastest_variant_per_seed_and_the_every_slot_run() -> None:
    runs = [
        run("gwtf", 0, 2.0),
        run("optimal@all", 0, 2.5),
        run("optimal@1.5", 0, 2.8),
        run("optimal@2", 0, 2.7),
        run("optimal@all", 1, 2.4),
        run("optimal@1", 1, 9.9, finished=False),  # a run that did not finish never wins
        run("optimal@2", 1, 2.4),  # a tie goes to the earlier variant
    ]
    kept, winners = SC.best_of_family(runs)
    best = {r.seed: r for r in kept if r.algorithm == "optimal"}
    every = {r.seed: r for r in kept if r.algorithm == "optimal-allslots"}
    assert best[0].throughput == 2.8 and best[1].throughput == 2.4
    assert every[0].throughput == 2.5 and every[1].throughput == 2.4
    assert winners == {"c": ["1.5", "all"]}
    assert [r.algorithm for r in kept if r.seed == 0 and r.algorithm == "gwtf"] == ["gwtf"]
    assert not any("@" in r.algorithm for r in kept)


def test_family_is_run_only_where_speeds_differ() -> None:
    homogeneous, heterogeneous = GridCell(False, True, 0.0), GridCell(True, True, 0.0)
    assert SC.expand(homogeneous, "optimal") == ["optimal@all"]
    assert SC.expand(heterogeneous, "optimal") == [
        SC.variant_name(scale) for scale in SC.OPTIMUM_SCALES
    ]
    assert SC.expand(heterogeneous, "optimal-allslots") == ["optimal@all"]
    assert SC.expand(heterogeneous, "gwtf") == ["gwtf"]
    policy = SC.policy_for("optimal@1.25")
    assert isinstance(policy, OptimalPolicy) and policy.slot_speed_scale == 1.25
    assert SC.policy_for("optimal@all").slot_speed_scale is None


def test_gwtf_variants_set_flow_config_fields_and_refuse_unknown_ones() -> None:
    assert SC.parse_overrides("like_speed_weight=0+slot_speed_scale=1.5") == {
        "like_speed_weight": 0.0,
        "slot_speed_scale": 1.5,
    }
    with pytest.raises(ConfigError, match="no_such_field"):
        SC.policy_for("gwtf@no_such_field=1")
    # Heterogeneous GPUs: pipelines of like GPUs change the run; in a cell of equal GPUs the
    # same setting changes nothing (every speed-gap term is 0).
    het, hom = GridCell(True, False, 0.0), GridCell(False, False, 0.0)
    like = "gwtf@like_speed_weight=3"
    results = {
        (cell.label, algorithm): run_scenario(
            build_scenario(cell, 1, GridSize(iterations=4)), SC.policy_for(algorithm)
        )
        for cell in (het, hom)
        for algorithm in ("gwtf", like)
    }
    assert results[(hom.label, "gwtf")] == results[(hom.label, like)]
    assert results[(het.label, "gwtf")].sim_time_s != results[(het.label, like)].sim_time_s


def test_like_speed_variant_runs_only_where_speeds_differ() -> None:
    assert SC.expand(GridCell(False, True, 0.0), SC.LIKE) == []
    assert SC.expand(GridCell(True, True, 0.0), SC.LIKE) == [SC.LIKE]
    policy = SC.policy_for(SC.LIKE)
    assert isinstance(policy, SC.TunedGwtfPolicy)
