"""No gradient dies with a replica: what a dead relay had accumulated is redone on a live one.

A relay that dies after it computed some microbatches' backward takes their gradients with it,
while the microbatches count as done. Before the relays end the iteration, the data node asks
each which microbatches it holds, and has each lost (microbatch, stage) redone on a live
replica from what the neighbours keep. Training then matches the whole model on the same
microbatch ids as closely as without any crash (summation order aside), not within the 1e-4
that hid the loss before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from gwtf.contracts.encoding import BACKWARD, FORWARD
from gwtf.coordinator_free.decisions.gradient_redo import Answer, RedoRun, plan_redo
from gwtf.errors import ProtocolError
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.dataplane.gradient_redo import RedoReport, decode_holds
from gwtf.node.runtime.dataplane.hop import FLAG_REDO, HopHeader
from gwtf.node.runtime.replicas.averaging import RoundResult
from gwtf.node.runtime.roles.data import DataRole, IterationResult
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.training.trainer import GradientShare
from tests.runtime.receipt_tap import ReceiptTap
from tests.runtime.swarm_harness import Scenario, Swarm, identity_for, reference_losses, run_swarm

ITERATIONS = 3
BATCH = 4
#: Losses within this of the whole model's: what a crash-free swarm reaches (~1e-7), far
#: below what one lost microbatch gradient moves them.
EXACT = 2e-6


def answer(stage: int, *held: int, step: int = 5) -> Answer:
    return Answer(stage, step, frozenset(held))


# ---- the plan -------------------------------------------------------------------------------


def test_a_stage_no_live_replica_holds_is_redone_on_the_least_loaded_replica() -> None:
    answers = {"a1": answer(1, 10, 11), "b1": answer(2, 10), "b2": answer(2, 12, 13)}
    plan = plan_redo([10, 11], 2, 5, answers)
    # 10 is held at both stages; 11 lost its stage-2 gradient: b1 holds less than b2.
    assert plan.runs == (RedoRun(11, 2, 2, ("b1",)),)
    assert plan.unsaved == plan.duplicated == ()


def test_consecutive_lost_stages_are_one_run_and_work_is_spread() -> None:
    answers = {
        "a1": answer(1),
        "b1": answer(2),
        "b2": answer(2),
        "c1": answer(3, 1, 2),
    }
    plan = plan_redo([1, 2], 3, 5, answers)
    assert plan.runs == (RedoRun(1, 1, 2, ("a1", "b1")), RedoRun(2, 1, 2, ("a1", "b2")))


def test_relays_out_of_step_hold_nothing_and_take_no_redo() -> None:
    answers = {"a1": answer(1, 1, step=4), "a2": answer(1, step=4), "b1": answer(2, 1)}
    plan = plan_redo([1], 2, 5, answers)
    assert plan.runs == ()
    assert plan.unsaved == ((1, 1),)


def test_a_gradient_held_twice_is_reported() -> None:
    answers = {"a1": answer(1, 1), "a2": answer(1, 1), "b1": answer(2, 1)}
    plan = plan_redo([1], 2, 5, answers)
    assert plan.runs == () and plan.duplicated == ((1, 1),)


def test_only_the_stages_still_to_step_are_looked_at() -> None:
    """After an end that missed a holder at stage 2, stage 1 has stepped: its relays answer at
    the next step and hold nothing, which is no loss."""
    answers = {"a1": answer(1, step=6), "b1": answer(2, 1), "b2": answer(2)}
    assert plan_redo([1, 2], 2, 5, answers, only={2}).runs == (RedoRun(2, 2, 2, ("b2",)),)
    assert plan_redo([1, 2], 2, 5, answers).unsaved == ((1, 1), (2, 1), (2, 2))


def test_an_iteration_is_ended_in_a_bounded_number_of_attempts() -> None:
    last = control.EndIteration(4, ("a",), ("a",), control.MAX_END_ATTEMPTS - 1)
    assert last.final and not control.EndIteration(4, ("a",), ("a",), 0).final
    assert control.decode_request(control.encode_request(last)) == last
    with pytest.raises(ProtocolError, match="attempts"):
        control.decode_request(control.encode_request(replace(last, attempt=last.attempt + 1)))


def test_holds_requests_and_replies_are_checked() -> None:
    request = control.Holds(3, 40, 4)
    assert control.decode_request(control.encode_request(request)) == request
    for count in (0, control.MAX_HOLDS + 1):
        with pytest.raises(ProtocolError, match="holds request"):
            control.decode_request(control.encode_request(control.Holds(3, 40, count)))
    assert decode_holds(control.encode_reply(True, stage=2, step=3, held=[0, 3]), 2, 4) == (
        2,
        3,
        [0, 3],
    )
    for bad in (
        {"stage": 3, "step": 3, "held": []},  # no such stage
        {"stage": 1, "step": -1, "held": []},
        {"stage": 1, "step": 3, "held": [4]},  # outside the asked range
        {"stage": 1, "step": 3, "held": [True]},
        {"stage": 1, "step": 3, "held": "0"},
    ):
        with pytest.raises(ProtocolError):
            decode_holds(control.encode_reply(True, **bad), 2, 4)


def check_refusals_at_the_end(relay: RelayRole, checked: list[int]) -> None:
    """Before ``relay`` ends its first iteration (all its buffers and gradients kept), check
    that only a microbatch's origin may have its gradient redone (anyone else could make a
    relay count a gradient twice), and that a redone gradient nobody announced is refused."""
    end_iteration = relay.end_iteration

    async def end(request: control.EndIteration) -> bytes:
        kept = [key for key in relay.buffers if key in relay.sender.passed]
        if kept and not checked:
            iteration_, microbatch = kept[0]
            with pytest.raises(ProtocolError, match="not its own"):
                relay.expect_redo("intruder", control.ExpectRedo(iteration_, microbatch, "x"))
            with pytest.raises(ProtocolError, match="not its own"):
                redo = control.RedoBack(iteration_, microbatch, "x", 9)
                await relay.sender.redo_backward("intruder", redo)
            unannounced = relay.sender.passed[kept[0]].header.onward(stage=1, flags=FLAG_REDO)
            with pytest.raises(ProtocolError, match="nobody announced"):
                relay._check_redo(unannounced)
            checked.append(request.iteration)
        return await end_iteration(request)

    relay.end_iteration = end  # type: ignore[method-assign]


# ---- live swarms ------------------------------------------------------------------------------


def run_with_kill(
    tmp_path: Path, stages: int, relays: dict[str, int], kill: Scenario, swarm: Swarm | None = None
) -> list[IterationResult]:
    swarm = swarm or Swarm()

    async def main() -> list[IterationResult]:
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, relays, kill, swarm, stages=stages)

    results = trio.run(main)
    assert [r.restarts for r in results] == [0] * ITERATIONS
    return results


async def data_role(swarm: Swarm, relays: dict[str, int]) -> DataRole:
    while not {"data", *relays} <= set(swarm.nodes):
        await trio.sleep(0.01)
    role = swarm.nodes["data"].role
    assert isinstance(role, DataRole)
    role.roster.probe_timeout_s = 2.0  # the dead relays' probes
    return role


@pytest.mark.slow  # ~11 s of live swarm
def test_relays_of_two_stages_dying_before_the_end_lose_no_gradient(tmp_path: Path) -> None:
    """A stage-1 and a stage-2 relay of one microbatch's path die once every microbatch of
    iteration 1 is done, holding their gradients: each lost (microbatch, stage) is redone, the
    two stages of a shared microbatch as one run."""
    relays = {"a1": 1, "a2": 1, "b1": 2, "b2": 2, "c1": 3, "c2": 3}
    killed: dict[str, list[int]] = {}

    async def kill(swarm: Swarm) -> None:
        data = await data_role(swarm, relays)
        save_lost = data.redo.save_lost

        async def crash_first(
            iteration: int,
            first: int,
            paths: Mapping[int, tuple[str, ...]],
            only: Collection[int] | None = None,
        ) -> RedoReport:
            # (``only``: the stages whose averaging missed a replica, redone again.)
            if iteration == 1 and only is None:
                path = paths[first]
                names = {swarm.nodes[n].plane.node_id: n for n in relays}
                for peer in path[1:3]:  # its stage-1 and stage-2 relays
                    killed[names[peer]] = sorted(m for m, p in paths.items() if peer in p)
                    swarm.crash(names[peer])
            return await save_lost(iteration, first, paths, only)

        data.redo.save_lost = crash_first  # type: ignore[method-assign]

    results = run_with_kill(tmp_path, 3, relays, kill)
    assert len(killed) == 2
    assert [r.loss for r in results] == pytest.approx(
        reference_losses(ITERATIONS, BATCH, 3), rel=EXACT
    )
    lost = sum(len(microbatches) for microbatches in killed.values())
    assert [(r.gradients_redone, r.gradients_lost) for r in results] == [(0, 0), (lost, 0), (0, 0)]
    shared = set.intersection(*(set(ms) for ms in killed.values()))
    assert results[1].microbatches_redone == lost - len(shared)


@pytest.mark.slow  # ~11 s of live swarm
def test_a_relay_dying_mid_iteration_after_its_backwards_loses_no_gradient(tmp_path: Path) -> None:
    """The relay dies as soon as a gradient it computed in iteration 1 is delivered: the rest of
    the iteration routes around it, and what it held is redone at the end."""
    relays = {"a1": 1, "a2": 1, "b1": 2, "b2": 2}
    died: list[str] = []

    checked: list[int] = []

    async def kill(swarm: Swarm) -> None:
        await data_role(swarm, relays)
        check_refusals_at_the_end(swarm.nodes["b1"].role, checked)  # type: ignore[arg-type]
        check_refusals_at_the_end(swarm.nodes["b2"].role, checked)  # type: ignore[arg-type]
        await crash_a_stage_2_relay_once_it_delivered(swarm, died)

    tap = ReceiptTap(tmp_path, 2, lambda name: identity_for(tmp_path, name))
    swarm = Swarm(tap)
    results = run_with_kill(tmp_path, 2, relays, kill, swarm)
    assert died and checked
    assert [r.loss for r in results] == pytest.approx(
        reference_losses(ITERATIONS, BATCH), rel=EXACT
    )
    assert results[1].gradients_redone >= 1 and results[1].gradients_lost == 0
    # Every hop the live relays trained is paid once, the redone forward and gradient too
    # (the replica keeps both outputs: it signs their receipts, their senders countersign).
    redone = tap.assert_every_hop_paid_once({swarm.nodes[died[0]].plane.node_id})
    assert redone[(2, FORWARD)] >= 1 and redone[(2, BACKWARD)] >= 1, redone


async def crash_a_stage_2_relay_once_it_delivered(swarm: Swarm, died: list[str]) -> None:
    """Crash the first of b1, b2 to have delivered a forward output of iteration 1 (its
    replica then redoes what died with it); its name goes into ``died``."""
    while not died:
        for name in ("b1", "b2"):
            role = swarm.nodes[name].role
            assert isinstance(role, RelayRole)
            delivered = [r for (i, _), r in role.sender.passed.items() if i == 1 and r.sent_to]
            if delivered:
                died.append(name)
                swarm.crash(name)
                return
        await trio.sleep(0.002)


@pytest.mark.slow  # ~12 s of live swarm
def test_a_stand_in_whose_forward_is_never_countersigned_signs_no_receipt_of_its_backward(
    tmp_path: Path,
) -> None:
    """Every sender withholds its countersignature of the forwards the stand-ins keep (it
    refuses their batches): a stand-in then holds no whole receipt of its forward, so a juror
    could not replay its backward, and its backward joins no batch (unpaid, and nothing of it
    can be slashed)."""
    relays = {"a1": 1, "a2": 1, "b1": 2, "b2": 2}
    died: list[str] = []

    async def kill(swarm: Swarm) -> None:
        await data_role(swarm, relays)
        for node in swarm.nodes.values():
            withhold_forward_countersignatures(node.plane)
        await crash_a_stage_2_relay_once_it_delivered(swarm, died)

    tap = ReceiptTap(tmp_path, 2, lambda name: identity_for(tmp_path, name))
    results = run_with_kill(tmp_path, 2, relays, kill, Swarm(tap))
    assert died and results[1].gradients_redone >= 1
    assert tap.backwards_without_their_forward() == []


def withhold_forward_countersignatures(plane: DataPlane) -> None:
    """``plane`` does not record the receipts of the kept forwards it sent, so it refuses any
    batch holding one (the stand-in's forward is never countersigned)."""
    record_kept_sent = plane._record_kept_sent

    async def withheld(to: str, header: HopHeader, sent: bytes, kept_digest: bytes) -> None:
        if header.direction != FORWARD:
            await record_kept_sent(to, header, sent, kept_digest)

    plane._record_kept_sent = withheld  # type: ignore[method-assign]


def die_while_averaging(swarm: Swarm, name: str, died: list[str]) -> None:
    """``name`` dies as it enters iteration 1's average holding gradients (the first to)."""
    averager = swarm.nodes[name].role.averager  # type: ignore[union-attr]
    average = averager.average

    async def dying(
        stage: int,
        iteration: int,
        own: GradientShare,
        replicas: Sequence[str],
        attempt: int = 0,
    ) -> RoundResult:
        if iteration == 1 and own.microbatch_count > 0 and not died:
            died.append(name)
            swarm.crash(name)
            await trio.sleep_forever()
        return await average(stage, iteration, own, replicas, attempt)

    averager.average = dying  # type: ignore[method-assign]


@pytest.mark.slow  # ~10 s of live swarm
def test_a_replica_dying_while_its_stage_averages_loses_no_gradient(tmp_path: Path) -> None:
    """A stage-2 replica holding gradients dies as iteration 1's end asks it to average, before
    its share reaches the round: the stage does not step, what it held is redone on the other
    replica from what stage 1 (stepped already) and the data node keep, and the stage is ended
    again."""
    relays = {"a1": 1, "b1": 2, "b2": 2}
    died: list[str] = []

    async def kill(swarm: Swarm) -> None:
        await data_role(swarm, relays)
        die_while_averaging(swarm, "b1", died)
        die_while_averaging(swarm, "b2", died)

    results = run_with_kill(tmp_path, 2, relays, kill)
    assert died
    assert [r.loss for r in results] == pytest.approx(
        reference_losses(ITERATIONS, BATCH), rel=EXACT
    )
    assert results[1].gradients_redone >= 1 and results[1].gradients_lost == 0
    assert [r.relays_stepped for r in results] == [3, 2, 2]


@pytest.mark.slow  # ~12 s of live swarm
def test_with_two_data_nodes_each_redoes_its_share_of_a_replica_dying_while_averaging(
    tmp_path: Path,
) -> None:
    """The replica held gradients of one data node or of both (the routing decides which
    microbatches pass it); the one in charge of the end is told the other's holders, and each
    data node whose gradients it held redoes its share before the stage ends again."""
    relays = {"a1": 1, "b1": 2, "b2": 2}
    died: list[str] = []
    swarm = Swarm()

    async def kill(swarm: Swarm) -> None:
        for name in ("data", "data-1"):
            while name not in swarm.nodes:
                await trio.sleep(0.01)
            swarm.nodes[name].role.roster.probe_timeout_s = 2.0  # type: ignore[union-attr]
        await data_role(swarm, relays)
        die_while_averaging(swarm, "b1", died)
        die_while_averaging(swarm, "b2", died)

    async def main() -> None:
        with trio.fail_after(150):
            await run_swarm(tmp_path, ITERATIONS, BATCH, relays, kill, swarm, data_nodes=2)

    trio.run(main)
    assert died
    first, second = swarm.results["data"], swarm.results["data-1"]
    losses = [(a.loss + b.loss) / 2 for a, b in zip(first, second, strict=True)]
    assert losses == pytest.approx(reference_losses(ITERATIONS, 2 * BATCH), rel=EXACT)
    # Whose gradients the dead replica held: the data nodes of the microbatches whose backward
    # it computed in iteration 1 (data node k's are the k-th BATCH of each iteration's ids).
    held = {
        (hop.microbatch_id // BATCH) % 2
        for hop in swarm.hops.get(died[0], [])
        if hop.iteration == 1 and hop.direction == BACKWARD
    }
    assert held, "the replica that died held gradients"
    redone = [sum(r.gradients_redone for r in share) for share in (first, second)]
    assert all(redone[k] >= 1 for k in held), f"shares {sorted(held)} held, redone {redone}"
    assert all(r.gradients_lost == 0 and r.restarts == 0 for r in first + second)
