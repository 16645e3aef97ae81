"""Joining goes to the bottleneck stage (highest flow / speed-weighted capacity)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator_free.flow_errors import PlacementError
from coordinator_free.placement import (
    StageLoad,
    choose_stage,
    place_relays,
    slots_per_s,
    stage_loads,
)


def load(stage: int, flows: int, capacity: int, compute_ms: float = 1000.0) -> StageLoad:
    return StageLoad(stage, flows, capacity, slots_per_s(capacity, compute_ms))


def test_the_stage_with_the_highest_flow_per_capacity_is_chosen() -> None:
    loads = [load(1, 4, 8), load(2, 4, 5), load(3, 2, 6)]
    decision = choose_stage(loads)
    assert decision.stage == 2
    assert decision.pressure == pytest.approx(0.8)
    assert "stage 2" in decision.reason


def test_capacity_is_weighted_by_speed() -> None:
    # Stage 1 has more slots, but on GPUs three times slower: it turns its flows over slowest.
    slow = stage_loads(2, [(1, 6, 6, 1800.0), (2, 4, 4, 600.0)], demand=8)
    assert [round(s.slots_per_s, 6) for s in slow] == [round(6 / 1.8, 6), round(4 / 0.6, 6)]
    assert choose_stage(slow).stage == 1
    # Equal speeds: the plain flow / capacity rule.
    even = stage_loads(2, [(1, 6, 6, 600.0), (2, 4, 5, 600.0)], demand=8)
    assert choose_stage(even).stage == 1


def test_an_empty_stage_comes_first_and_ties_go_to_less_capacity_then_lower_stage() -> None:
    assert choose_stage([load(1, 3, 3), load(2, 0, 0)]).stage == 2
    assert choose_stage([load(1, 0, 0), load(2, 0, 0)]).stage == 1
    assert math.isinf(load(1, 0, 0).pressure)
    assert choose_stage([load(1, 2, 4), load(2, 1, 2)]).stage == 2


def test_before_any_routing_the_demand_makes_the_smallest_stage_the_bottleneck() -> None:
    loads = stage_loads(3, [(1, 0, 4, 600.0), (2, 0, 2, 600.0), (3, 0, 3, 600.0)], demand=6)
    assert [load.flows for load in loads] == [6, 6, 6]
    assert choose_stage(loads).stage == 2


def test_initial_placement_balances_capacity_across_stages() -> None:
    newcomers = [(f"r{i}", 2, 600.0) for i in range(9)]
    chosen = place_relays(3, [], newcomers, demand=6)
    per_stage = [sum(1 for s in chosen.values() if s == k) for k in (1, 2, 3)]
    assert per_stage == [3, 3, 3]


def test_initial_placement_balances_speed_not_only_slots() -> None:
    # Two fast relays and four at a third of their speed, fastest deciding first: each fast one
    # anchors a stage and the slow ones split evenly, as a stage's speed sum says they should.
    newcomers = [("fast0", 4, 600.0), ("fast1", 4, 600.0)]
    newcomers += [(f"slow{i}", 4, 1800.0) for i in range(4)]
    chosen = place_relays(2, [], newcomers, demand=8)
    assert chosen["fast0"] != chosen["fast1"]
    assert sorted(sum(1 for s in chosen.values() if s == k) for k in (1, 2)) == [3, 3]


def test_no_stage_to_choose_is_a_typed_error() -> None:
    with pytest.raises(PlacementError):
        choose_stage([])


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 20)), min_size=1, max_size=8))
def test_a_join_always_goes_to_a_stage_no_less_pressed_than_any_other(
    raw: list[tuple[int, int]],
) -> None:
    loads = [load(i + 1, min(f, c), c) for i, (f, c) in enumerate(raw)]
    decision = choose_stage(loads)
    assert all(decision.pressure >= load.pressure for load in loads)
