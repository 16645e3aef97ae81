"""A node process's status carries its part's state digest at its step, computed in the node's
compute thread (serialised with its steps), never on the event loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
import trio

from gwtf.node.process import run_process
from gwtf.node.training import checkpoint
from gwtf.node.training.checkpoint import DigestAtStep, state_digest
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.stage_worker import StageWorker
from tests.runtime.swarm_harness import MODEL, SEED, TRAINING, Swarm, node_config, run_relay

ITERATIONS = 3
BATCH = 4


def test_a_digest_is_of_the_state_at_the_step_and_taken_once_per_state() -> None:
    worker = StageWorker(plan_partition(MODEL, 2), 0, TRAINING, SEED)
    digest = DigestAtStep(worker)
    assert digest.current() is None  # nothing computed yet: never computed by reading
    assert digest.refresh() == state_digest(worker) == digest.current()
    digest.refresh()
    assert digest.computed == 1  # the same state is not digested again
    worker.step_count += 1  # the step is part of the state
    assert digest.current() is None
    at_step_one = digest.refresh()
    assert at_step_one == state_digest(worker) == digest.current() and digest.computed == 2
    with torch.no_grad():
        next(iter(worker.module.parameters())).add_(1.0)  # the weights moved, same step
    assert digest.current() is None
    assert digest.refresh() == state_digest(worker) != at_step_one


def test_the_status_digest_is_the_final_state_and_computed_off_the_event_loop(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    loop_thread = threading.current_thread()
    calls: list[bool] = []  # per digest taken: whether on the event loop's thread
    digests: list[DigestAtStep] = []
    real = checkpoint.state_digest

    def counted(trainer):  # type: ignore[no-untyped-def]
        calls.append(threading.current_thread() is loop_thread)
        return real(trainer)

    class Recorded(DigestAtStep):
        def __init__(self, trainer) -> None:  # type: ignore[no-untyped-def]
            super().__init__(trainer)
            digests.append(self)

    monkeypatch.setattr(checkpoint, "state_digest", counted)
    monkeypatch.setattr("gwtf.node.process.DigestAtStep", Recorded)
    status_file = tmp_path / "data.status.json"

    async def main() -> None:
        config = node_config(tmp_path, "data", "data", 0, iterations=ITERATIONS, batch=BATCH)
        swarm = Swarm()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:

                async def data_node() -> None:
                    await run_process(config, status_file)  # trains, writes its final status
                    nursery.cancel_scope.cancel()

                nursery.start_soon(data_node)
                while not status_file.exists():
                    await trio.sleep(0.05)
                bootstrap = (json.loads(status_file.read_text())["address"],)
                for name, stage in (("a1", 1), ("b1", 2)):
                    relay = node_config(tmp_path, name, "relay", stage, bootstrap=bootstrap)
                    nursery.start_soon(run_relay, relay, swarm)

    trio.run(main)
    status = json.loads(status_file.read_text())
    assert status["finished"] and status["step"] == ITERATIONS
    assert calls and not any(calls), "every digest is taken off the event loop"
    assert len(calls) <= ITERATIONS + 1, "at most one digest per state (steps 0..3)"
    monkeypatch.undo()
    (recorded,) = digests
    assert status["state_digest"] == state_digest(recorded.trainer)
