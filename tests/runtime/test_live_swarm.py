"""A live swarm on loopback trains the tiny model exactly like the whole model would."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.runtime.hop import BACKWARD, FORWARD, HopHeader
from tests.runtime.swarm_harness import Swarm, reference_losses, run_swarm

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


def crash_on_first(swarm: Swarm, name: str, direction: int, iteration: int) -> None:
    """Make relay ``name`` crash when the first hop of ``direction`` in ``iteration`` reaches it."""
    node = swarm.nodes[name]
    compute = node.plane.compute
    assert compute is not None

    async def crashing(header: HopHeader, frame: bytes) -> None:
        if header.direction == direction and header.iteration == iteration and not swarm.crashed:
            swarm.crash(name)
            await trio.sleep_forever()
        await compute(header, frame)

    node.plane.compute = crashing


@pytest.mark.parametrize("direction", [FORWARD, BACKWARD], ids=["forward", "backward"])
def test_a_relay_crashing_mid_hop_loses_no_microbatch(tmp_path: Path, direction: int) -> None:
    swarm = Swarm()
    # Whichever replica of the stage gets the first such hop of iteration 1 crashes.
    replicas = ("a1", "a2") if direction == FORWARD else ("b1", "b2")

    async def arm(swarm: Swarm) -> None:
        while not all(name in swarm.nodes for name in replicas):
            await trio.sleep(0.05)
        for name in replicas:
            crash_on_first(swarm, name, direction, iteration=1)

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path, ITERATIONS, BATCH, {"a1": 1, "a2": 1, "b1": 2, "b2": 2}, arm, swarm
            )

    results = trio.run(main)
    assert len(swarm.crashed) == 1 and swarm.crashed[0] in replicas
    victim = swarm.crashed[0]
    assert [r.microbatches for r in results] == [BATCH] * ITERATIONS
    assert all(r.restarts == 0 for r in results), "only the lost hop may be recomputed"
    expected = reference_losses(ITERATIONS, BATCH)
    assert results[0].loss == pytest.approx(expected[0], rel=1e-4)  # before the crash
    stats = [n.role.stats for name, n in swarm.nodes.items() if name != victim]
    if direction == FORWARD:
        assert sum(s.forward_resends for s in stats) >= 1
    else:
        assert sum(s.backward_repairs for s in stats) >= 1
        assert sum(s.repairs_served for s in stats) >= 1
    assert results[-1].relays_stepped == 3
