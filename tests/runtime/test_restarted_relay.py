"""A relay that failed a liveness probe and came back steps with its stage again.

The data node's flow neighbours are stage 1 and the last stage; a middle stage's relay is known
to it only through discovery. One that died and failed the end-of-iteration probe, then came
back under its identity, must be asked to end iterations again: else it takes hops whose
gradients never reach the average, reloads its replicas' state at each next iteration, and
ends the run a step behind them with other weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import trio

from gwtf.node.runtime.roles.data import DataRole, IterationResult
from gwtf.node.training.checkpoint import state_digest
from tests.runtime.swarm_harness import Swarm, run_relay, run_swarm

ITERATIONS = 12
BATCH = 4
STAGES = 3
#: Each hop lasts at least this long, so the run outlasts the restarted relay's start (loading
#: its stage's state) on a busy machine.
HOP_S = 0.05


@dataclass
class Seen:
    """The stage-2 replicas once training is done."""

    back_at: int = -1  # iterations the data node had finished when the relay served again
    steps: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    hops_after: int = 0  # hops the restarted relay computed in later iterations


@pytest.mark.slow  # ~25 s of a three-stage swarm with a restart
def test_a_middle_stage_relay_restarted_after_a_failed_probe_steps_with_its_replica(
    tmp_path: Path,
) -> None:
    swarm = Swarm()
    seen = Seen()

    async def kill_and_restart(swarm: Swarm) -> None:
        while "data" not in swarm.nodes:
            await trio.sleep(0.01)
        data = swarm.nodes["data"].role
        assert isinstance(data, DataRole)
        while not data.results:  # the relays are up and training runs
            await trio.sleep(0.01)
        old = swarm.nodes["b2"]
        swarm.crash("b2")
        # The next iteration's end probes it and finds it gone.
        while old.plane.node_id not in data.roster.unreachable:
            await trio.sleep(0.01)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_relay, replace(old.config, join=True), swarm)
            while swarm.nodes["b2"] is old:  # loading its stage's state from b1
                await trio.sleep(0.01)
            seen.back_at = len(data.results)
            await swarm.training_done.wait()
            for name in ("b1", "b2"):
                worker = swarm.nodes[name].role.worker
                seen.steps[name] = worker.step_count
                seen.digests[name] = state_digest(worker)
            hops = swarm.hops.get("b2", [])
            seen.hops_after = sum(1 for h in hops if h.iteration > seen.back_at)
            nursery.cancel_scope.cancel()

    async def main() -> list[IterationResult]:
        with trio.fail_after(150):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a1": 1, "b1": 2, "b2": 2, "c1": 3},
                kill_and_restart,
                swarm,
                stages=STAGES,
                # Stage 2 needs both its replicas for the data node's four flows: the restarted
                # one takes traffic.
                data_capacity=4,
                capacities={"a1": 4, "c1": 4},
                relay_settings={"emulated_hop_s": HOP_S},
            )

    results = trio.run(main)
    assert len(results) == ITERATIONS
    assert 0 <= seen.back_at < ITERATIONS - 3, "back well before the run ended"
    assert seen.hops_after > 0, "the restarted relay took traffic"
    assert seen.steps == {"b1": ITERATIONS, "b2": ITERATIONS}
    assert seen.digests["b1"] == seen.digests["b2"], "bit for bit its stage's other replica"
    assert results[-1].relays_stepped == 4, "every relay stepped at the last iteration's end"
