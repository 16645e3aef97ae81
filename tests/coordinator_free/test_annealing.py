"""The acceptance rule of the local moves: relative to the path costs, greedy at T = 0."""

from __future__ import annotations

import math
import random

import pytest

from gwtf.coordinator_free.flow_errors import FlowConfigError
from gwtf.coordinator_free.protocol import FlowConfig
from gwtf.coordinator_free.protocol.annealing import FlowView, SwapMove, TakeOverMove, is_accepted
from gwtf.coordinator_free.wire import TableEntry


def entry(prefix_ms: float, edge_out_ms: float, suffix_ms: float) -> TableEntry:
    return TableEntry(1, "f", "u", "n", prefix_ms, 5.0, edge_out_ms, suffix_ms)


def acceptance_rate(gain_ms: float, scale_ms: float, temperature: float) -> float:
    rng = random.Random(0)
    draws = 20_000
    return sum(is_accepted(gain_ms, scale_ms, temperature, rng) for _ in range(draws)) / draws


def test_a_move_worse_by_t_of_the_path_cost_is_accepted_with_probability_1_over_e() -> None:
    assert acceptance_rate(-50.0, 1000.0, 0.05) == pytest.approx(math.exp(-1), abs=0.01)
    assert acceptance_rate(-100.0, 1000.0, 0.05) == pytest.approx(math.exp(-2), abs=0.01)


def test_the_rule_depends_on_the_gain_relative_to_the_path_cost_not_on_its_unit() -> None:
    for seed in range(50):
        in_ms = is_accepted(-30.0, 600.0, 0.1, random.Random(seed))
        in_s = is_accepted(-0.03, 0.6, 0.1, random.Random(seed))
        assert in_ms == in_s


def test_better_moves_are_always_taken_and_no_moves_never() -> None:
    rng = random.Random(0)
    assert is_accepted(1.0, 1000.0, 0.0, rng)
    assert not is_accepted(0.0, 1000.0, 1.0, rng)
    assert not is_accepted(math.nan, 1000.0, 1.0, rng)
    assert not is_accepted(-1.0, math.inf, 1.0, rng)
    # Float rounding of equal path costs is no move either way, at any temperature.
    assert not is_accepted(1e-10, 1000.0, 0.0, rng)
    assert not is_accepted(-1e-10, 1000.0, 100.0, rng)


def test_temperature_0_is_greedy_and_draws_no_random_number() -> None:
    rng = random.Random(3)
    state = rng.getstate()
    assert not any(is_accepted(-1e-3, 1000.0, 0.0, rng) for _ in range(100))
    assert rng.getstate() == state
    FlowConfig(stages=2, activation_bytes=1.0, relay_temperature=0.0, data_temperature=0.0)
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(FlowConfigError, match="relay_temperature"):
            FlowConfig(stages=2, activation_bytes=1.0, relay_temperature=bad)
        with pytest.raises(FlowConfigError, match="data_temperature"):
            FlowConfig(stages=2, activation_bytes=1.0, data_temperature=bad)


def test_a_moves_scale_is_the_larger_affected_path_cost_before_it() -> None:
    mine = FlowView(
        slot=0, next_hop="m", prefix_cost_ms=100.0, edge_out_ms=10.0, suffix_cost_ms=90.0
    )
    assert SwapMove(mine, entry(300.0, 20.0, 80.0), -1.0).scale_ms == 400.0
    assert SwapMove(mine, entry(50.0, 20.0, 80.0), -1.0).scale_ms == 200.0
    assert TakeOverMove(entry(50.0, 20.0, 80.0), 1.0, 1.0, -1.0).scale_ms == 150.0
