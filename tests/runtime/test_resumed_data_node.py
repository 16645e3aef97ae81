"""A lone data node stopped in the middle of a run resumes it from its resume point: at the
next iteration, with its embedding, head, optimizer and step, and the swarm goes on training
exactly like the whole model, no gradient of the interrupted iteration counted twice and no hop
key used twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

from gwtf.node.runtime.dataplane.hop import ATTEMPT_BLOCK, BACKWARD
from gwtf.node.runtime.roles.data import DataRole, IterationResult
from gwtf.node.training.resume_points import ATTEMPT_RESERVE, point_name, points
from tests.runtime.swarm_harness import (
    Swarm,
    node_config,
    reference_losses,
    run_data_node,
    run_swarm,
)

ITERATIONS = 5
BATCH = 4
STOPPED_AFTER = 1  # the data node stops once iteration 1 ended and iteration 2 has begun


def test_a_lone_data_node_stopped_mid_run_resumes_at_its_next_iteration(tmp_path: Path) -> None:
    folder = tmp_path / "home" / "checkpoints" / "run-1"
    resumed = STOPPED_AFTER + 1
    swarm = Swarm()
    before: list[IterationResult] = []
    after: list[IterationResult] = []
    stopped: list[DataRole] = []

    def relay_hops_of(iteration: int) -> int:
        return sum(
            1
            for name in ("a1", "b1")
            for record in swarm.hops.get(name, [])
            if record.iteration == iteration and record.direction == BACKWARD
        )

    async def stop_and_resume(swarm: Swarm) -> None:
        # Stopped once the resume point of the next iteration is written and that iteration's
        # gradients are on their way: the relays hold some of them.
        while not (folder / point_name(resumed)).exists() or not relay_hops_of(resumed):
            await trio.sleep(0.01)
        role = swarm.nodes["data"].role
        assert isinstance(role, DataRole)
        before.extend(role.results)
        stopped.append(role)
        swarm.crash("data")
        config = node_config(
            tmp_path,
            "data",
            "data",
            0,
            iterations=ITERATIONS,
            batch=BATCH,
            bootstrap=(swarm.nodes["a1"].address, swarm.nodes["b1"].address),
            resume_dir=folder,
        )
        after.extend(await run_data_node(config, swarm))

    async def main() -> None:
        with trio.fail_after(150):
            await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a1": 1, "b1": 2},
                stop_and_resume,
                swarm,
                data_settings={"resume_dir": folder},
            )

    trio.run(main)
    assert [r.iteration for r in before] == list(range(resumed))
    assert [r.iteration for r in after] == list(range(resumed, ITERATIONS))
    # The stopped process let go of the iteration it was in: no record of its microbatches,
    # and none of their embedding outputs in its worker.
    assert stopped[0].microbatches == {}
    assert stopped[0].worker.in_flight == ()
    losses = [r.loss for r in before + after]
    assert losses == pytest.approx(reference_losses(ITERATIONS, BATCH), rel=1e-4)
    assert all(r.relays_stepped == 2 for r in before + after)
    assert [p.name for p in points(folder)] == [point_name(ITERATIONS), point_name(ITERATIONS - 1)]
    # Every hop key a relay worked under is its own: the resumed iteration's hops took attempt
    # numbers above any the stopped process could have used.
    records = swarm.hop_records()
    keys = Counter(
        (r.microbatch_id, r.stage, r.direction, r.attempt, r.worker, r.counterparty)
        for r in records
    )
    assert not [key for key, count in keys.items() if count > 1]
    redone = [r for r in records if r.iteration == resumed and r.attempt >= ATTEMPT_BLOCK]
    assert redone and all(r.attempt >= ATTEMPT_RESERVE * ATTEMPT_BLOCK for r in redone)
