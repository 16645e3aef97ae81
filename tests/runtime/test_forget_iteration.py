"""A relay drops what it holds of an iteration when the data node that sent all of it resumed
from its resume point and trains the iteration again (``control.Forget``), and for nobody else:
its gradient is one sum, and another origin's share of it could not be taken out."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import trio

from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.hop import FORWARD, HopHeader
from gwtf.node.runtime.roles.relay import Buffered, RelayRole
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

PLAN = plan_partition(named_config("gpt", "tiny"), 2)
ITERATION = 5


def relay_holding(origins: dict[int, str]) -> RelayRole:
    """A stage-1 relay at step ``ITERATION`` that computed the forward and backward of each
    microbatch (id -> its origin) of the iteration; only its own state is used."""
    worker = StageWorker(PLAN, 0, TrainingSettings(device="cpu"), seed=1)
    worker.step_count = ITERATION
    role = RelayRole(
        worker=worker,
        stage=1,
        plane=SimpleNamespace(ack_deadline_s=5.0, node_id="relay", stages=2),  # type: ignore[arg-type]
        flow=SimpleNamespace(),  # type: ignore[arg-type]
        averager=None,  # type: ignore[arg-type]
        limits=CodecLimits(),
        nursery=None,  # type: ignore[arg-type]
    )
    for microbatch, origin in origins.items():
        activation = torch.randn(2, 16, PLAN.config.d_model)
        output = worker.forward(microbatch, activation)
        worker.backward(microbatch, torch.ones_like(output))
        header = HopHeader(
            run_id=1, iteration=ITERATION, microbatch_id=microbatch, attempt=0,
            direction=FORWARD, stage=1, slot=0, flags=0, origin=origin, path=(origin,),
        )  # fmt: skip
        role.buffers[(ITERATION, microbatch)] = Buffered(header, b"", b"")
    role._closing = ITERATION  # its end had begun (a round that stepped nothing)
    return role


def forget(role: RelayRole, asker: str, iteration: int = ITERATION) -> dict[str, object]:
    async def ask() -> bytes:
        return await role.forget(asker, control.Forget(iteration))

    return control.decode_reply(trio.run(ask))


def has_gradient(role: RelayRole) -> bool:
    return any(p.grad is not None and bool(p.grad.any()) for p in role.worker.module.parameters())


def test_the_origin_of_everything_held_has_the_relay_drop_it_and_reopen_the_iteration() -> None:
    role = relay_holding({20: "data", 21: "data"})
    assert has_gradient(role) and role.worker.accumulated == {20, 21}
    assert forget(role, "data") == {"ok": True, "step": ITERATION}
    assert not has_gradient(role) and not role.worker.accumulated
    assert not role.buffers and role._closing == ITERATION - 1
    # The iteration's hops are computed again.
    header = HopHeader(
        run_id=1, iteration=ITERATION, microbatch_id=20, attempt=4096, direction=FORWARD,
        stage=1, slot=0, flags=0, origin="data", path=("data",),
    )  # fmt: skip
    assert role._in_step(header, lambda: "computed") == "computed"


def test_another_peer_or_another_origins_share_is_never_dropped() -> None:
    role = relay_holding({20: "data", 21: "data-2"})
    for asker in ("data", "data-2", "stranger"):
        assert forget(role, asker)["ok"] is False
    assert has_gradient(role) and role.worker.accumulated == {20, 21} and len(role.buffers) == 2


def test_a_relay_at_another_step_keeps_what_it_holds_and_says_its_step() -> None:
    role = relay_holding({20: "data"})
    assert forget(role, "data", ITERATION - 1) == {"ok": False, "step": ITERATION}
    assert has_gradient(role) and role.worker.accumulated == {20}


def test_a_relay_holding_nothing_of_an_iteration_it_is_not_ending_has_nothing_to_forget() -> None:
    role = relay_holding({})
    role._closing, ended = ITERATION - 1, role._ended
    assert forget(role, "stranger") == {"ok": False, "why": "nothing held", "step": ITERATION}
    assert role._closing == ITERATION - 1 and role._ended == ended


def test_a_forget_lifts_its_askers_seal_even_while_an_end_holds_the_relay() -> None:
    """A data node that asked ``Holds`` and then stopped resumes and trains the iteration again
    while the relay is still in that iteration's end (a round waiting on its replicas): its
    ``Forget`` times out at the asker, and the seal left in place would decline every backward
    of its microbatches trained again here."""
    role = relay_holding({20: "data"})
    assert role._sealed.seal(ITERATION, "data", 20, 22, step=ITERATION)

    async def main() -> None:
        ending = trio.Event()

        async def end_under_way() -> None:
            async with role._ending:
                ending.set()
                await trio.sleep(10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(end_under_way)
            await ending.wait()
            with trio.move_on_after(0.2):  # the asker's deadline
                await role.forget("data", control.Forget(ITERATION))
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not role._sealed.covers(ITERATION, "data", 20)
