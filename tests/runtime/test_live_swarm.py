"""A live swarm on loopback trains the tiny model exactly like the whole model would."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.runtime.swarm_harness import reference_losses, run_swarm

ITERATIONS = 3
BATCH = 4


def test_swarm_of_two_stages_by_two_replicas_matches_the_reference(tmp_path: Path) -> None:
    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path, ITERATIONS, BATCH, {"a1": 1, "a2": 1, "b1": 2, "b2": 2}
            )

    results = trio.run(main)
    expected = reference_losses(ITERATIONS, BATCH)
    assert [r.iteration for r in results] == list(range(ITERATIONS))
    assert [r.loss for r in results] == pytest.approx(expected, rel=1e-4)
    assert results[-1].loss < results[0].loss
    assert all(r.relays_stepped == 4 for r in results)
    assert all(r.restarts == 0 for r in results)
