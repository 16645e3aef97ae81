"""Crash handling as data: deadlines with attempts, forward re-sends, probes and one-hop repair."""

from __future__ import annotations

from gwtf.coordinator_free.repair import (
    HopKey,
    HopTracker,
    averaging_group,
    dead_stages,
    plan_forward_resend,
    plan_hop_repair,
    plan_probe,
)
from gwtf.coordinator_free.wire import BACKWARD, FORWARD, HopAck

PATH = ("d0", "a1", "b2", "c3", "d1")  # origin, stages 1..3, sink


def test_an_ack_of_the_current_attempt_settles_the_hop() -> None:
    tracker = HopTracker(ack_deadline_s=20.0)
    key = HopKey("mb-1", 2, FORWARD)
    hop = tracker.sent(key, "b2", now=0.0)
    assert hop.attempt == 0 and hop.deadline_s == 20.0
    assert not tracker.acked("xx", HopAck("mb-1", 2, FORWARD, 0, b"d"))  # wrong peer
    assert tracker.acked("b2", HopAck("mb-1", 2, FORWARD, 0, b"d"))
    assert tracker.expired(100.0) == []


def test_a_missed_ack_expires_once_and_a_resend_is_a_new_attempt() -> None:
    tracker = HopTracker(ack_deadline_s=20.0)
    key = HopKey("mb-1", 2, FORWARD)
    tracker.sent(key, "b2", now=0.0)
    assert tracker.expired(19.0) == []
    (missed,) = tracker.expired(20.5)
    assert tracker.expired(30.0) == []
    plan = plan_forward_resend(missed, lambda dead: "b2x" if dead == "b2" else None)
    assert plan is not None and plan.to == "b2x" and plan.attempt == 1
    again = tracker.sent(key, plan.to, now=21.0)
    assert again.attempt == 1
    # A late ack of attempt 0 does not settle attempt 1.
    assert not tracker.acked("b2", HopAck("mb-1", 2, FORWARD, 0, b"d"))
    assert tracker.acked("b2x", HopAck("mb-1", 2, FORWARD, 1, b"d"))


def test_no_resend_without_another_replica() -> None:
    tracker = HopTracker(ack_deadline_s=1.0)
    tracker.sent(HopKey("mb", 1, FORWARD), "a1", now=0.0)
    (missed,) = tracker.expired(2.0)
    assert plan_forward_resend(missed, lambda dead: None) is None
    assert plan_forward_resend(missed, lambda dead: dead) is None


def test_a_stalled_backward_probes_the_relays_and_repairs_only_the_dead_hop() -> None:
    probe = plan_probe("mb-1", PATH, now=50.0, timeout_s=5.0)
    assert probe.targets == ("a1", "b2", "c3") and probe.deadline_s == 55.0
    assert dead_stages(PATH, answered={"a1", "c3"}) == [2]
    tracker = HopTracker(ack_deadline_s=20.0)
    tracker.sent(HopKey("mb-1", 2, BACKWARD), "b2", now=40.0)
    repair = plan_hop_repair("mb-1", PATH, 2, lambda stage, dead: "b2x", tracker)
    assert repair is not None
    assert (repair.dead, repair.replacement) == ("b2", "b2x")
    assert (repair.upstream, repair.downstream) == ("a1", "c3")
    assert repair.attempt == 1


def test_no_repair_without_a_replacement_or_outside_the_relays() -> None:
    assert plan_hop_repair("mb", PATH, 2, lambda stage, dead: None) is None
    assert plan_hop_repair("mb", PATH, 0, lambda stage, dead: "x") is None
    assert plan_hop_repair("mb", PATH, 4, lambda stage, dead: "x") is None


def test_gradient_averaging_proceeds_without_dead_replicas() -> None:
    assert averaging_group(["a", "b", "c"], {"b"}) == ("a", "c")
    assert averaging_group(["a"], {"a"}) == ()


def test_forgetting_a_finished_microbatch_drops_its_records() -> None:
    tracker = HopTracker(ack_deadline_s=1.0)
    tracker.sent(HopKey("mb", 1, FORWARD), "a1", now=0.0)
    tracker.forget("mb")
    assert tracker.pending() == [] and tracker.attempt(HopKey("mb", 1, FORWARD)) == 0
