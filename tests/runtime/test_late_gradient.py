"""A microbatch's gradient that reaches its origin late, on a live swarm over loopback (data
node, stage-1 relay ``a``, stage-2 relay ``b``).

* From a try given up: microbatch X's first try is given up once its gradient has left stage 1
  (as after a stall past its deadline), and that gradient reaches the origin while X's next try
  is in flight, before the next try's forward reaches the loss. Only the gradient of the try
  whose loss the origin keeps closes X: the late one is declined (X would close without a
  loss), and the next try finishes X. Its loss and the head's gradient enter the data node's
  step once, however many tries reached the loss: every step counts the batch's microbatches
  and the losses are the whole model's.
* While its loss is computed: X's first try is given up; the next try's forward from the same
  input takes the loss gradient computed meanwhile, and X counts once.
* During the repair that ends its last deadline: X's gradient comes back while the origin is
  tracing it after its stall deadline has passed. X is done: the origin does not start it
  again (its gradient is in the embedding already, and a new try could never finish).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from gwtf.node.p2p.rpc import Decline
from gwtf.node.runtime.dataplane.hop import BACKWARD, FORWARD, HopHeader
from gwtf.node.runtime.dataplane.stall_repair import Outcome
from gwtf.node.runtime.roles.data import DataRole
from gwtf.node.runtime.roles.flow_pool import Flow
from gwtf.node.training.trainer import StepReport
from tests.runtime.swarm_harness import STAGES, Swarm, reference_losses, run_swarm

ITERATIONS = 2
BATCH = 4
RELAYS = {"a": 1, "b": 2}
X = 0  # the first microbatch of iteration 0
#: Losses within this of the whole model's: a crash-free swarm's (~1e-7); one microbatch's
#: gradient counted twice moves iteration 1's by ~2e-5.
EXACT = 1e-6


async def data_role_of(swarm: Swarm) -> DataRole:
    while not {"data", *RELAYS} <= set(swarm.nodes):
        await trio.sleep(0.01)
    data = swarm.nodes["data"].role
    assert isinstance(data, DataRole)
    return data


def is_gradient_of_x(header: HopHeader) -> bool:
    return (header.iteration, header.microbatch_id) == (0, X) and (
        header.direction,
        header.stage,
    ) == (BACKWARD, 0)


def test_a_late_gradient_of_a_try_given_up_is_declined_and_the_next_try_finishes(
    tmp_path: Path,
) -> None:
    swarm = Swarm()
    late: list[tuple[HopHeader, bytes]] = []
    arrived = trio.Event()
    outcome: list[str] = []
    steps: list[StepReport] = []

    async def arm(swarm: Swarm) -> None:
        data = await data_role_of(swarm)
        compute, wait_or_repair = data.compute, data._wait_or_repair
        step = data.worker.step

        def counted_step() -> StepReport:
            steps.append(step())
            return steps[-1]

        async def hold_first_gradient(header: HopHeader, frame: bytes) -> None:
            if is_gradient_of_x(header) and not late:
                late.append((header, frame))  # acknowledged, and held back for now
                arrived.set()
                return
            if (
                late
                and not outcome
                and header.microbatch_id == X
                and (header.direction, header.stage) == (FORWARD, STAGES + 1)
            ):
                # The next try's forward reaches the loss: the first try's gradient first.
                try:
                    await compute(*late[0])
                    outcome.append("taken")
                except Decline as exc:
                    outcome.append("declined" if "no loss of that try" in str(exc) else str(exc))
            await compute(header, frame)

        async def give_up_first_try(key: tuple[int, int], event: trio.Event) -> bool:
            if key == (0, X) and not arrived.is_set():
                await arrived.wait()
                return False  # as if it stalled: started again under the next block
            return await wait_or_repair(key, event)

        data.plane.compute = hold_first_gradient
        data._wait_or_repair = give_up_first_try  # type: ignore[method-assign]
        data.worker.step = counted_step  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm)

    results = trio.run(main)
    assert outcome == ["declined"]
    assert [r.iteration for r in results] == list(range(ITERATIONS))
    assert results[0].restarts == 1
    data = swarm.nodes["data"].role
    assert isinstance(data, DataRole) and data.microbatches == {}
    # Both tries of X reached the loss: its loss and head gradient count once.
    assert [s.microbatch_count for s in steps] == [BATCH] * ITERATIONS
    expected = reference_losses(ITERATIONS, BATCH)
    assert [r.loss for r in results] == pytest.approx(expected, rel=EXACT, abs=0)


def test_a_gradient_back_during_the_last_repair_finishes_its_microbatch(tmp_path: Path) -> None:
    swarm = Swarm()
    held: list[tuple[HopHeader, bytes]] = []
    delivered: list[bool] = []
    tries: list[int] = []

    async def arm(swarm: Swarm) -> None:
        data = await data_role_of(swarm)
        compute, repair, run_microbatch = data.compute, data._repair, data._run_microbatch

        async def hold_gradient(header: HopHeader, frame: bytes) -> None:
            if is_gradient_of_x(header) and not held:
                held.append((header, frame))  # acknowledged; it comes in during the repair
                return
            await compute(header, frame)

        async def gradient_back_meanwhile(key: tuple[int, int]) -> Outcome | None:
            if key != (0, X) or not held:
                return await repair(key)
            # Past the stall deadline, as the trace of X goes on, its gradient comes in; the
            # trace finds nothing left to repair.
            await trio.sleep(data.stall_timeout_s)
            if not delivered:
                delivered.append(True)
                await compute(*held[0])
            return None

        async def count_tries(iteration: int, microbatch_id: int, flow: Flow, attempt: int) -> bool:
            if (iteration, microbatch_id) == (0, X):
                tries.append(attempt)
            return await run_microbatch(iteration, microbatch_id, flow, attempt)

        data.plane.compute = hold_gradient
        data._repair = gradient_back_meanwhile  # type: ignore[method-assign]
        data._run_microbatch = count_tries  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm,
                data_settings={"stall_timeout_s": 6.0},
            )  # fmt: skip

    results = trio.run(main)
    assert len(tries) == 1, f"X was started again after its gradient came back: {tries}"
    assert [r.iteration for r in results] == list(range(ITERATIONS))


def test_a_gradient_the_embedding_takes_while_its_try_is_given_up_finishes_it(
    tmp_path: Path,
) -> None:
    """X's gradient is in the embedding's backward (a worker thread) when its try is given up:
    the give-up's drop finds nothing left, so X is done, not started again (a next try would
    put its embedding gradient, and its loss, into the step a second time)."""
    swarm = Swarm()
    in_backward = trio.Event()
    given_up: list[tuple[int, int]] = []
    tries: list[int] = []
    steps: list[StepReport] = []

    async def arm(swarm: Swarm) -> None:
        data = await data_role_of(swarm)
        wait_or_repair, run_microbatch = data._wait_or_repair, data._run_microbatch
        backward_embedding, step = data.worker.backward_embedding, data.worker.step
        token = trio.lowlevel.current_trio_token()

        def slow_backward_embedding(microbatch_id: int, grad: object) -> None:
            if microbatch_id == X and not in_backward.is_set():
                trio.from_thread.run_sync(in_backward.set, trio_token=token)
                time.sleep(1.0)  # the give-up happens meanwhile
            backward_embedding(microbatch_id, grad)  # type: ignore[arg-type]

        async def give_up_in_backward(key: tuple[int, int], event: trio.Event) -> bool:
            if key != (0, X) or given_up:
                return await wait_or_repair(key, event)
            await in_backward.wait()
            given_up.append(key)
            return False  # stalled, as far as this try's deadline knows

        async def count_tries(iteration: int, microbatch_id: int, flow: Flow, attempt: int) -> bool:
            if (iteration, microbatch_id) == (0, X):
                tries.append(attempt)
            return await run_microbatch(iteration, microbatch_id, flow, attempt)

        def counted_step() -> StepReport:
            steps.append(step())
            return steps[-1]

        data.worker.backward_embedding = slow_backward_embedding  # type: ignore[method-assign]
        data.worker.step = counted_step  # type: ignore[method-assign]
        data._wait_or_repair = give_up_in_backward  # type: ignore[method-assign]
        data._run_microbatch = count_tries  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm)

    results = trio.run(main)
    assert in_backward.is_set()
    assert len(tries) == 1, f"X was started again after the embedding took its gradient: {tries}"
    assert results[0].restarts == 0
    assert [s.microbatch_count for s in steps] == [BATCH] * ITERATIONS
    expected = reference_losses(ITERATIONS, BATCH)
    assert [r.loss for r in results] == pytest.approx(expected, rel=EXACT, abs=0)


def test_a_try_given_up_while_its_loss_is_computed_counts_that_loss_once(
    tmp_path: Path,
) -> None:
    """X's first try is given up while the data node computes its loss (a worker thread): that
    loss is in the step already, so the next try's forward from the same input takes its
    gradient without computing the loss again, and the step counts X once."""
    swarm = Swarm()
    in_loss = trio.Event()
    given_up: list[tuple[int, int]] = []
    losses_of_x: list[float] = []
    steps: list[StepReport] = []

    async def arm(swarm: Swarm) -> None:
        data = await data_role_of(swarm)
        wait_or_repair = data._wait_or_repair
        loss_and_backward, step = data.worker.loss_and_backward, data.worker.step
        token = trio.lowlevel.current_trio_token()

        def slow_loss(microbatch_id: int, x: object) -> tuple[float, object]:
            if microbatch_id == X and not in_loss.is_set():
                trio.from_thread.run_sync(in_loss.set, trio_token=token)
                time.sleep(1.0)  # the give-up happens meanwhile
            loss, grad = loss_and_backward(microbatch_id, x)  # type: ignore[arg-type]
            if microbatch_id == X:
                losses_of_x.append(loss)
            return loss, grad

        async def give_up_in_loss(key: tuple[int, int], event: trio.Event) -> bool:
            if key != (0, X) or given_up:
                return await wait_or_repair(key, event)
            await in_loss.wait()
            given_up.append(key)
            return False  # stalled, as far as this try's deadline knows

        def counted_step() -> StepReport:
            steps.append(step())
            return steps[-1]

        data.worker.loss_and_backward = slow_loss  # type: ignore[method-assign,assignment]
        data.worker.step = counted_step  # type: ignore[method-assign]
        data._wait_or_repair = give_up_in_loss  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm)

    results = trio.run(main)
    assert in_loss.is_set()
    assert results[0].restarts == 1
    assert len(losses_of_x) == 1, f"X's loss was computed again from the same input: {losses_of_x}"
    assert [s.microbatch_count for s in steps] == [BATCH] * ITERATIONS
    expected = reference_losses(ITERATIONS, BATCH)
    assert [r.loss for r in results] == pytest.approx(expected, rel=EXACT, abs=0)
