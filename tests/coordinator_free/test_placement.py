"""Joining goes to the bottleneck stage (highest flow/capacity)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator_free.flow_errors import PlacementError
from coordinator_free.placement import StageLoad, choose_stage, place_relays, stage_loads


def test_the_stage_with_the_highest_flow_per_capacity_is_chosen() -> None:
    loads = [StageLoad(1, 4, 8), StageLoad(2, 4, 5), StageLoad(3, 2, 6)]
    decision = choose_stage(loads)
    assert decision.stage == 2
    assert decision.pressure == pytest.approx(0.8)
    assert "stage 2" in decision.reason


def test_an_empty_stage_comes_first_and_ties_go_to_less_capacity_then_lower_stage() -> None:
    assert choose_stage([StageLoad(1, 3, 3), StageLoad(2, 0, 0)]).stage == 2
    assert choose_stage([StageLoad(1, 0, 0), StageLoad(2, 0, 0)]).stage == 1
    assert math.isinf(StageLoad(1, 0, 0).pressure)
    assert choose_stage([StageLoad(1, 2, 4), StageLoad(2, 1, 2)]).stage == 2


def test_before_any_routing_the_demand_makes_the_smallest_stage_the_bottleneck() -> None:
    loads = stage_loads(3, [(1, 0, 4), (2, 0, 2), (3, 0, 3)], demand=6)
    assert [load.flows for load in loads] == [6, 6, 6]
    assert choose_stage(loads).stage == 2


def test_initial_placement_balances_capacity_across_stages() -> None:
    newcomers = [(f"r{i}", 2) for i in range(9)]
    chosen = place_relays(3, [], newcomers, demand=6)
    per_stage = [sum(1 for s in chosen.values() if s == k) for k in (1, 2, 3)]
    assert per_stage == [3, 3, 3]


def test_no_stage_to_choose_is_a_typed_error() -> None:
    with pytest.raises(PlacementError):
        choose_stage([])


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 20)), min_size=1, max_size=8))
def test_a_join_always_goes_to_a_stage_no_less_pressed_than_any_other(
    raw: list[tuple[int, int]],
) -> None:
    loads = [StageLoad(i + 1, min(f, c), c) for i, (f, c) in enumerate(raw)]
    decision = choose_stage(loads)
    assert all(decision.pressure >= load.pressure for load in loads)
