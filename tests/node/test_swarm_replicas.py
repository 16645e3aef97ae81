"""The swarm summary names every live replica that did not end with its stage's step and weights."""

from __future__ import annotations

from gwtf.node.swarm.replicas import replicas_out_of_step


def relay(stage: int, step: int, digest: str) -> dict[str, object]:
    return {"stage": stage, "step": step, "state_digest": digest, "hops_recorded": 3}


def test_replicas_in_step_are_not_named() -> None:
    relays = {
        "relay-1-0": relay(1, 16, "a"),
        "relay-1-1": relay(1, 16, "a"),
        "relay-2-0": relay(2, 16, "b"),  # alone in its stage: its own digest is its stage's
    }
    assert replicas_out_of_step(relays, run_step=16) == []


def test_a_restarted_replica_a_step_behind_is_named_with_what_was_expected() -> None:
    # The run: relay-2-0 came back, was never asked to step, and ended at 15.
    relays = {
        "relay-2-0": relay(2, 15, "old"),
        "relay-2-1": relay(2, 16, "b"),
        "relay-2-2": relay(2, 16, "b"),
        "relay-1-0": relay(1, 16, "a"),
    }
    assert replicas_out_of_step(relays, run_step=16) == [
        {
            "node": "relay-2-0",
            "stage": 2,
            "step": 15,
            "state_digest": "old",
            "expected_step": 16,
            "expected_digest": "b",
        }
    ]


def test_a_minority_digest_is_named_and_a_tie_names_both() -> None:
    majority = {"x": relay(1, 4, "a"), "y": relay(1, 4, "a"), "z": relay(1, 4, "c")}
    assert [e["node"] for e in replicas_out_of_step(majority, run_step=4)] == ["z"]
    tie = {"x": relay(1, 4, "a"), "y": relay(1, 4, "c")}
    flagged = replicas_out_of_step(tie, run_step=4)
    assert [e["node"] for e in flagged] == ["x", "y"]
    assert all(e["expected_digest"] is None for e in flagged)


def test_a_whole_stage_behind_the_run_is_named() -> None:
    relays = {"x": relay(1, 7, "a"), "y": relay(1, 7, "a")}
    assert [e["node"] for e in replicas_out_of_step(relays, run_step=8)] == ["x", "y"]
    # Without the run's step (no data node status), the stage's newest step is expected.
    assert replicas_out_of_step(relays, run_step=None) == []
