"""A dead hop of a backward repaired alone, and a stalled microbatch waited on or started over
(``decisions/repair.py``)."""

from __future__ import annotations

from gwtf.coordinator_free.decisions import MAX_STALL_DEADLINES, keep_waiting, plan_hop_repair

PATH = ("d0", "a1", "b2", "c3", "d1")  # origin, relays of stages 1..3, sink


def test_a_dead_hop_is_recomputed_alone_between_its_neighbours() -> None:
    asked: list[tuple[int, str]] = []

    def choose(stage: int, dead: str) -> str:
        asked.append((stage, dead))
        return "b2x"

    repair = plan_hop_repair(PATH, 2, choose)
    assert repair is not None and asked == [(2, "b2")]
    assert (repair.stage, repair.dead, repair.replacement) == (2, "b2", "b2x")
    assert (repair.upstream, repair.downstream) == ("a1", "c3")


def test_no_repair_without_a_stand_in_or_outside_the_relays() -> None:
    assert plan_hop_repair(PATH, 2, lambda stage, dead: None) is None
    assert plan_hop_repair(PATH, 2, lambda stage, dead: dead) is None
    assert plan_hop_repair(PATH, 0, lambda stage, dead: "x") is None  # the origin's own
    assert plan_hop_repair(PATH, 4, lambda stage, dead: "x") is None


def test_a_stalled_microbatch_is_waited_on_only_while_it_progresses_and_not_for_ever() -> None:
    assert [keep_waiting(n, True) for n in range(1, MAX_STALL_DEADLINES + 2)] == [
        True, True, True, False, False,
    ]  # fmt: skip
    assert not any(keep_waiting(n, False) for n in range(1, MAX_STALL_DEADLINES + 1))
