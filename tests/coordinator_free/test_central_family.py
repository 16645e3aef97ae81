"""The comparison benchmark's rules: the central heuristic's slot rule is tuned on other seeds
than those reported, ratios are paired per seed, GWTF variants set FlowConfig fields, the
baselines take their timeouts and options."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gwtf.coordinator_free.baselines.central import CentralPolicy
from gwtf.coordinator_free.baselines.swarm import BLOCKWISE_8BIT_RATIO
from gwtf.coordinator_free.sim.engine import run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.policy import PolicyTiming
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


def test_the_central_slot_rule_is_chosen_on_tuning_runs_by_median_throughput() -> None:
    runs = [
        run("central@all", 0, 2.5),
        run("central@all", 1, 2.4),
        run("central@all", 2, 2.6),
        run("central@1.5", 0, 2.8),
        run("central@1.5", 1, 2.7),
        run("central@1.5", 2, 1.0),  # one bad seed does not move the median
        run("central@2", 0, 9.9, finished=False),  # a run that did not finish scores 0
        run("central@2", 1, 2.7),
        run("central@2", 2, 2.7),  # a tie goes to the earlier variant
    ]
    assert SC.choose_central_scales(runs) == {"c": "1.5"}


def test_the_chosen_rule_is_the_one_run_on_the_reporting_seeds() -> None:
    homogeneous, heterogeneous = GridCell(False, True, 0.0), GridCell(True, True, 0.0)
    chosen = {heterogeneous.label: "1.25"}
    assert SC.expand(homogeneous, "central", chosen) == ["central@all"]
    assert SC.expand(heterogeneous, "central", chosen) == ["central@1.25"]
    assert SC.expand(heterogeneous, "central-allslots", chosen) == ["central@all"]
    assert SC.expand(heterogeneous, "gwtf", chosen) == ["gwtf"]
    policy = SC.policy_for("central@1.25")
    assert isinstance(policy, CentralPolicy) and policy.slot_speed_scale == 1.25
    assert SC.policy_for("central@all").slot_speed_scale is None


def test_paired_ratios_compare_the_same_seed_and_quartiles_summarise_them() -> None:
    runs = [run("gwtf", s, 2.0 + s) for s in range(4)] + [run("swarm", s, 1.0) for s in range(3)]
    ratios = SC.paired(runs, "c", "gwtf", "swarm", "throughput")
    assert ratios == [2.0, 3.0, 4.0]  # seed 3 has no SWARM run to pair with
    assert SC.quartiles(ratios) == (2.5, 3.0, 3.5)


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
    assert SC.expand(GridCell(False, True, 0.0), SC.LIKE, {}) == []
    assert SC.expand(GridCell(True, True, 0.0), SC.LIKE, {}) == [SC.LIKE]
    policy = SC.policy_for(SC.LIKE)
    assert isinstance(policy, SC.TunedGwtfPolicy)


def test_the_comparison_builds_each_baseline_with_its_options() -> None:
    setup = SC.Setup(timeout_s=20.0, trainers=8, swarm_8bit=True)
    swarm = SC.policy_for("swarm", setup)
    assert swarm.timing() == PolicyTiming(20.0, 50.0)  # backward 2.5 x forward, as released
    assert swarm.activation_wire_ratio == BLOCKWISE_8BIT_RATIO
    assert not swarm.iteration_barrier and SC.policy_for("swarm-barrier").iteration_barrier
    assert SC.policy_for("dtfm", setup).timing() == PolicyTiming(20.0, 20.0)
    assert not SC.policy_for("gwtf-nobarrier").iteration_barrier
    assert SC.policy_for("swarm").timing() == PolicyTiming(30.0, 75.0)  # as shipped
    assert setup.size(5) == GridSize(iterations=5, trainers_per_data_node=8)
