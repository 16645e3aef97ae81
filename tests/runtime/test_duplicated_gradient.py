"""A gradient computed twice counts once: a late ack makes a stage's backward run on two
replicas, and one of them drops its whole sum, the rest of which is redone.

A relay's ack can come after its sender's deadline (a busy machine, a slow link): the sender
repairs the backward around it, on another replica of the stage, while the late one has
accumulated the gradient too. Left alone, that microbatch counts twice in the stage's average
and training drifts from the whole model (~3e-5 on the loss within two iterations here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf.coordinator_free.decisions.gradient_redo import Answer, holder_to_drop
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import Kept
from gwtf.node.runtime.dataplane.hop import BACKWARD, HopHeader
from gwtf.node.runtime.roles.data import DataRole
from tests.runtime.swarm_harness import Swarm, reference_losses, run_swarm

ITERATIONS = 3
BATCH = 4
EXACT = 2e-6  # as in test_gradient_redo.py: what a swarm without any fault reaches


def answer(stage: int, *held: int, step: int = 5) -> Answer:
    return Answer(stage, step, frozenset(held))


def test_the_holder_whose_sum_is_cheapest_to_redo_drops_it() -> None:
    # 1 is held at stage 2 by both b1 and b2; b1 alone holds 2 and 3, b2 alone holds nothing.
    answers = {"a1": answer(1, 1, 2, 3), "b1": answer(2, 1, 2, 3), "b2": answer(2, 1)}
    assert holder_to_drop([1, 2, 3], 5, answers) == "b2"
    # b2 refused (it holds another origin's microbatches too): b1 drops, 2 and 3 are redone.
    assert holder_to_drop([1, 2, 3], 5, answers, refused={"b2"}) == "b1"
    assert holder_to_drop([1, 2, 3], 5, answers, refused={"b1", "b2"}) is None


def test_nothing_is_dropped_unless_held_twice_at_one_stage_in_step() -> None:
    answers = {"a1": answer(1, 1, 2), "b1": answer(2, 1), "b2": answer(2, 2)}
    assert holder_to_drop([1, 2], 5, answers) is None
    out_of_step = {"b1": answer(2, 1), "b2": answer(2, 1, step=4)}
    assert holder_to_drop([1], 5, out_of_step) is None
    # Held twice, but only stage 1 is still to step.
    assert holder_to_drop([1], 5, {"b1": answer(2, 1), "b2": answer(2, 1)}, only={1}) is None
    # Another origin's microbatch held twice is not this data node's to fix.
    assert holder_to_drop([1], 5, {"b1": answer(2, 7), "b2": answer(2, 7)}) is None


def test_a_discard_request_is_checked() -> None:
    request = control.Discard(4)
    assert control.decode_request(control.encode_request(request)) == request


def test_a_late_backward_ack_does_not_count_a_gradient_twice(tmp_path: Path) -> None:
    swarm = Swarm()
    slowed: list[str] = []

    async def scenario(sw: Swarm) -> None:
        """The first stage-2 relay to compute a backward of iteration 1 acks it 8 s late (the
        data node's deadline is 3 s)."""
        while not all(name in sw.nodes for name in ("b1", "b2")):
            await trio.sleep(0.01)
        for name in ("b1", "b2"):
            plane = sw.nodes[name].plane
            compute = plane.compute
            assert compute is not None

            async def late(
                header: HopHeader, frame: bytes, compute=compute, name=name
            ) -> Kept | None:
                kept = await compute(header, frame)
                if header.direction == BACKWARD and header.iteration == 1 and not slowed:
                    slowed.append(name)
                    await trio.sleep(8)
                return kept

            plane.compute = late

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(150):
            relays = {"a1": 1, "b1": 2, "b2": 2}
            return await run_swarm(tmp_path, ITERATIONS, BATCH, relays, scenario, swarm)

    results = trio.run(main)
    role = swarm.nodes["data"].role
    assert isinstance(role, DataRole)
    assert slowed and role.stats.backward_repairs >= 1  # the backward ran on both replicas
    assert role.stats.gradient_sums_dropped >= 1
    assert role.stats.gradients_duplicated == 0
    expected = reference_losses(ITERATIONS, BATCH)
    assert [r.loss for r in results] == pytest.approx(expected, rel=EXACT)
