"""Placement: initial relays go to the stage of highest demand / speed-weighted capacity, a joiner
to the stage with the least live capacity for the flows the run needs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtf.coordinator_free.flow_errors import PlacementError
from gwtf.coordinator_free.placement import (
    StageLoad,
    choose_bottleneck,
    choose_stage,
    place_relays,
    slots_per_s,
    stage_capacities,
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


# ---- a joiner: the least live capacity for the flows the run needs -------------------------


def test_a_stage_down_to_one_relay_is_the_bottleneck() -> None:
    """The churn example: two stages of two relays (capacity 2) for a data node that needs four
    flows; stage 1 lost a relay. Its survivor carries two flows on capacity 2 and stage 2 four on
    4, the same flow / capacity; what decides is that stage 1 can hold only two of the four."""
    decision = choose_bottleneck(2, [(1, 2, 100.0), (2, 2, 100.0), (2, 2, 100.0)], demand=4)
    assert decision.stage == 1
    assert decision.reason.startswith(
        "stage 1 is the bottleneck: 1 live replica of capacity 2 for the 4 flows the run needs"
    )


def test_a_stage_that_lost_its_fast_relay_is_chosen_over_a_larger_one() -> None:
    """The 3 x 3 run: speeds 1.0, 0.6 and 0.35 in every stage, capacity 2 each, six flows
    needed. Stage 3 lost its fastest relay; stage 2 already took a joiner."""
    speeds = (1.0, 0.6, 0.35)
    replicas = [(stage, 2, 100.0 / speed) for stage in (1, 2, 3) for speed in speeds]
    replicas.remove((3, 2, 100.0))
    replicas.append((2, 2, 100.0))
    assert choose_bottleneck(3, replicas, demand=6).stage == 3


def test_a_joiner_chooses_among_the_stages_it_can_hold() -> None:
    """Stage 1 is the bottleneck, but a joiner whose memory holds only stages 2 and 3 takes the
    weaker of those; one that holds none is told so."""
    replicas = [(2, 2, 100.0), (3, 2, 100.0), (3, 2, 100.0)]
    assert choose_bottleneck(3, replicas, demand=4).stage == 1
    decision = choose_bottleneck(3, replicas, demand=4, allowed=(2, 3))
    assert decision.stage == 2 and decision.reason.startswith("stage 2 is the bottleneck")
    with pytest.raises(PlacementError, match="none of the run's stages"):
        choose_bottleneck(3, replicas, demand=4, allowed=())


def test_capacity_counts_speed_and_only_the_slots_the_demand_can_fill() -> None:
    # More slots on GPUs three times slower: stage 1 turns the run's flows over slowest.
    assert choose_bottleneck(2, [(1, 6, 1800.0), (2, 4, 600.0)], demand=4).stage == 1
    # One relay with 8 slots fills 4 of them (40 slots/s); two faster ones with 2 each fill
    # all of theirs (50 slots/s): the big one is the bottleneck for four flows.
    big, fast = [(1, 8, 100.0)], [(2, 2, 80.0), (2, 2, 80.0)]
    assert choose_bottleneck(2, big + fast, demand=4).stage == 1
    # With the demand unknown (no data node answered), every slot counts.
    assert choose_bottleneck(2, big + fast, demand=0).stage == 2
    # The fastest slots are filled first: a slow relay added to a stage never weakens it.
    loads = stage_capacities(1, [(1, 4, 100.0)], demand=4)
    more = stage_capacities(1, [(1, 4, 100.0), (1, 4, 1000.0)], demand=4)
    assert more[0].usable_slots_per_s == loads[0].usable_slots_per_s == pytest.approx(40.0)


def test_empty_stages_come_first_then_less_capacity_fewer_replicas_lower_stage() -> None:
    assert choose_bottleneck(3, [(1, 2, 100.0), (3, 2, 100.0)], demand=2).stage == 2
    # Both hold the two flows needed: the one with less capacity in all.
    assert choose_bottleneck(2, [(1, 4, 100.0), (2, 2, 100.0)], demand=2).stage == 2
    # The same capacity: in one relay rather than two.
    one, two = [(1, 4, 100.0)], [(2, 2, 100.0), (2, 2, 100.0)]
    assert choose_bottleneck(2, two + one, demand=4).stage == 1
    assert choose_bottleneck(2, [(1, 2, 100.0), (2, 2, 100.0)], demand=4).stage == 1
    assert choose_bottleneck(2, [], demand=4).stage == 1
    with pytest.raises(PlacementError):
        choose_bottleneck(0, [], demand=4)


@given(
    st.lists(st.lists(st.integers(1, 4), max_size=4), min_size=1, max_size=5),
    st.integers(1, 12),
    st.integers(1, 4),
)
def test_a_joiner_goes_where_it_raises_the_run_s_throughput_most(
    stages: list[list[int]], demand: int, joiner: int
) -> None:
    """Equal GPUs, every relay of a stage linked to every relay of the next: the run carries
    min(demand, each stage's capacity) flows. No stage gains more from the joiner than the one
    it takes."""

    def carried(capacities: list[int]) -> int:
        return min([demand, *capacities])

    replicas = [(s + 1, c, 100.0) for s, caps in enumerate(stages) for c in caps]
    totals = [sum(caps) for caps in stages]
    gain = [
        carried([t + joiner * (s == k) for s, t in enumerate(totals)]) for k in range(len(totals))
    ]
    chosen = choose_bottleneck(len(stages), replicas, demand).stage
    assert gain[chosen - 1] == max(gain)
