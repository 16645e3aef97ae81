"""Replicas of a stage agree on the same gradient shares over real libp2p, even when one dies."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.abc import IHost

from gwtf.errors import ProtocolError
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import Decline, RequestResponse, RpcLimits
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.replicas.averaging import (
    RESULT_PROTOCOL_ID,
    GradientAverager,
    RoundCutOff,
    RoundResult,
    combine_shares,
)
from gwtf.node.runtime.replicas.share_codec import (
    decode_average,
    decode_shares,
    encode_average,
    encode_shares,
)
from gwtf.node.runtime.roles.data import DataRole
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.errors import TensorCodecError
from gwtf.node.training.partition import PartitionPlan, plan_partition
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import GradientShare
from tests.runtime.swarm_harness import MODEL, SEED, STAGES, TRAINING

LIMITS = CodecLimits(max_bytes=1 << 20, max_ndim=4)


def share_of(replica_id: str, count: int) -> GradientShare:
    generator = torch.Generator().manual_seed(count)
    return GradientShare(
        replica_id,
        count,
        {"w": torch.randn(4, 3, generator=generator), "b": torch.randn(3, generator=generator)},
    )


def same_shares(a: list[GradientShare], b: list[GradientShare]) -> bool:
    return [(s.replica_id, s.microbatch_count) for s in a] == [
        (s.replica_id, s.microbatch_count) for s in b
    ] and all(
        torch.equal(x.gradients[k], y.gradients[k])
        for x, y in zip(a, b, strict=True)
        for k in x.gradients
    )


def run_round(
    tmp_path: Path, n_replicas: int, alive: set[int]
) -> tuple[list[str], dict[str, RoundResult]]:
    """Start ``n_replicas`` hosts, let the ``alive`` ones average; the others never take part."""
    results: dict[str, RoundResult] = {}
    ids: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = []
            for _ in range(n_replicas):
                key = new_identity()
                hosts.append(await stack.enter_async_context(running_host(key)))
            ids.extend(str(h.get_id()) for h in hosts)
            averagers = []
            for host in hosts:
                averager = GradientAverager(RequestResponse(host), str(host.get_id()), LIMITS, 2.0)
                averager.serve()
                averagers.append(averager)
            for i in alive:
                for j in range(n_replicas):
                    if i != j:
                        await hosts[i].connect(peer_info(full_address(hosts[j])))
            dead = [hosts[i] for i in range(n_replicas) if i not in alive]
            for host in dead:
                await host.close()

            async def one(i: int) -> None:
                own = share_of(ids[i], i + 1)
                results[ids[i]] = await averagers[i].average(2, 7, own, ids)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in sorted(alive):
                        nursery.start_soon(one, i)

    trio.run(main)
    return ids, results


def same_result(a: RoundResult, b: RoundResult) -> bool:
    return a.contributors == b.contributors and same_shares([a.combined], [b.combined])


def expected_sum(ids: list[str], alive: set[int]) -> dict[str, torch.Tensor]:
    """The shares of the ``alive`` replicas added in replica-id order, as the gatherer must."""
    shares = sorted((share_of(ids[i], i + 1) for i in alive), key=lambda s: s.replica_id)
    return {k: sum((s.gradients[k] for s in shares), torch.zeros(v.shape)) for k, v in
            shares[0].gradients.items()}  # fmt: skip


def test_all_replicas_get_the_same_combined_share(tmp_path: Path) -> None:
    ids, results = run_round(tmp_path, 3, alive={0, 1, 2})
    first = results[ids[0]]
    expected = expected_sum(ids, {0, 1, 2})
    assert len(results) == 3
    assert first.contributors == tuple(sorted(ids))
    assert first.combined.microbatch_count == 1 + 2 + 3
    assert all(same_result(first, other) for other in results.values())
    assert all(torch.equal(first.combined.gradients[k], v) for k, v in expected.items())


# The replicas' ids are random, so which one is dead is a random position each time: one
# case by default, the others in the slow run.
@pytest.mark.parametrize(
    "dead", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_a_dead_replica_is_left_out_and_the_rest_agree(tmp_path: Path, dead: int) -> None:
    alive = {0, 1, 2} - {dead}
    ids, results = run_round(tmp_path, 3, alive=alive)
    lists = list(results.values())
    assert len(lists) == 2
    assert same_result(lists[0], lists[1])
    assert lists[0].combined.microbatch_count == sum(i + 1 for i in alive)
    assert lists[0].contributors == tuple(sorted(ids[i] for i in alive))
    expected = expected_sum(ids, alive)
    assert all(torch.equal(lists[0].combined.gradients[k], v) for k, v in expected.items())


def test_the_combined_share_is_the_sum_in_replica_id_order() -> None:
    ids = ["c", "a", "b"]
    result = combine_shares("a", [share_of(ids[i], i + 1) for i in range(3)])
    assert result.contributors == ("a", "b", "c")
    assert result.combined.microbatch_count == 6
    expected = expected_sum(ids, {0, 1, 2})
    assert all(torch.equal(result.combined.gradients[k], expected[k]) for k in expected)


def test_a_share_of_another_shape_is_left_out() -> None:
    odd = GradientShare("z", 9, {"w": torch.zeros(2, 2), "b": torch.zeros(3)})
    result = combine_shares("a", [share_of("a", 1), share_of("b", 2), odd])
    assert result.contributors == ("a", "b")
    assert result.combined.microbatch_count == 3


def test_the_gatherers_own_share_sets_the_shapes() -> None:
    """A share of another shape whose id sorts first cannot push the right ones out."""
    odd = GradientShare("a", 9, {"w": torch.zeros(2, 2), "b": torch.zeros(3)})
    result = combine_shares("b", [odd, share_of("b", 2), share_of("c", 3)])
    assert result.contributors == ("b", "c")


def test_a_share_from_outside_the_round_is_left_out(tmp_path: Path) -> None:
    """A peer that is not one of the round's replicas (another stage's relay with the same
    shapes, say) sends its share first: the round's result holds only the replicas'."""
    results: dict[str, RoundResult] = {}
    ids: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = []
            for _i in range(3):
                key = new_identity()
                hosts.append(await stack.enter_async_context(running_host(key)))
            ids.extend(sorted(str(h.get_id()) for h in hosts))
            by_id = {str(h.get_id()): h for h in hosts}
            averagers = {}
            for peer, host in by_id.items():
                averagers[peer] = GradientAverager(RequestResponse(host), peer, LIMITS, 2.0)
                averagers[peer].serve()
            gatherer, replica, outsider = ids  # the outsider's id sorts last
            for peer in (replica, outsider):
                await by_id[peer].connect(peer_info(full_address(by_id[gatherer])))

            async def one(peer: str, count: int) -> None:
                results[peer] = await averagers[peer].average(2, 7, share_of(peer, count), ids[:2])

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    # Only the outsider's share is in before the gatherer opens its round.
                    nursery.start_soon(averagers[outsider]._send_to, gatherer, (2, 7, 0),
                                       share_of(outsider, 5))  # fmt: skip
                    await trio.sleep(0.5)
                    nursery.start_soon(one, gatherer, 1)
                    nursery.start_soon(one, replica, 2)

    trio.run(main)
    for result in results.values():
        assert result.contributors == tuple(ids[:2])
        assert result.combined.microbatch_count == 1 + 2


def test_replicas_applying_the_combined_share_step_exactly_as_with_every_share() -> None:
    """What each replica did before (average every share itself) and what it does now (apply
    the gatherer's combined share) give bit-identical gradients on the real stage engine."""
    torch.manual_seed(0)
    plan = plan_partition(MODEL, STAGES)
    workers = [StageWorker(plan, 0, TRAINING, SEED, replica_id=r) for r in ("a", "b")]
    shares = [
        GradientShare(rid, n, {k: torch.randn(p.shape) for k, p in workers[0].named_params})
        for rid, n in (("b", 3), ("a", 2), ("c", 0))
    ]
    workers[0].average_gradients(shares)
    workers[1].average_gradients([combine_shares("a", shares).combined])
    for (_, p0), (_, p1) in zip(workers[0].named_params, workers[1].named_params, strict=True):
        assert p0.grad is not None and p1.grad is not None
        assert torch.equal(p0.grad, p1.grad)
    assert workers[0].microbatch_count == workers[1].microbatch_count == 5


def test_an_average_round_trips_and_garbage_is_refused() -> None:
    combined = share_of("a", 4)
    encoded = encode_average(("a", "b"), combined, LIMITS)
    contributors, decoded = decode_average(encoded, LIMITS)
    assert contributors == ("a", "b") and same_shares([decoded], [combined])
    for cut in (1, 5, len(encoded) // 2, len(encoded) - 1):
        with pytest.raises(TensorCodecError):
            decode_average(encoded[:cut], LIMITS)
    with pytest.raises(TensorCodecError):
        decode_average(encode_average(("a", "a"), combined, LIMITS), LIMITS)


def test_shares_round_trip_exactly() -> None:
    shares = [share_of("a", 1), share_of("b", 5)]
    assert same_shares(decode_shares(encode_shares(shares, LIMITS), LIMITS), shares)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_raises_anything_but_a_codec_error(data: bytes) -> None:
    with suppress(TensorCodecError):
        decode_shares(data, LIMITS)


def test_truncated_shares_are_refused() -> None:
    encoded = encode_shares([share_of("a", 1)], LIMITS)
    for cut in (1, 5, len(encoded) // 2, len(encoded) - 1):
        with pytest.raises(TensorCodecError):
            decode_shares(encoded[:cut], LIMITS)


async def hosts_in_id_order(stack: AsyncExitStack, n: int) -> list[IHost]:
    """``n`` running hosts sorted by id: the i-th is a round's i-th candidate gatherer."""
    hosts = [await stack.enter_async_context(running_host(new_identity())) for _ in range(n)]
    return sorted(hosts, key=lambda h: str(h.get_id()))


def run_cut_round(
    cut: frozenset[tuple[int, int]] = frozenset(),
    dies_after_shares: int | None = None,
    dead: frozenset[int] = frozenset(),
    absent: frozenset[int] = frozenset(),
) -> tuple[list[str], dict[str, RoundResult | ProtocolError]]:
    """Three replicas whose ids sort as their positions (0 is the round's first gatherer).
    ``cut``: (i, j) means replica j refuses every stream of replica i (a connection refused,
    both up); ``dies_after_shares``: that replica never opens its round and its host closes once
    the others' shares reached it (a gatherer dying mid-round); ``dead``: hosts closed before
    the round; ``absent``: up and reachable, but never in the round."""
    results: dict[str, RoundResult | ProtocolError] = {}
    ids: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = await hosts_in_id_order(stack, 3)
            ids.extend(str(h.get_id()) for h in hosts)
            averagers = []
            for j, host in enumerate(hosts):
                refused = {ids[i] for i, k in cut if k == j}

                async def admit(peer: str, refused: set[str] = refused) -> bool:
                    return peer not in refused

                rpc = RequestResponse(host, admit=admit)
                averagers.append(GradientAverager(rpc, ids[j], LIMITS, 2.0))
                averagers[-1].serve()
            for i in range(3):
                for j in range(3):
                    if i != j:
                        await hosts[i].connect(peer_info(full_address(hosts[j])))
            for i in dead:
                await hosts[i].close()

            async def one(i: int) -> None:
                try:
                    results[ids[i]] = await averagers[i].average(2, 7, share_of(ids[i], i + 1), ids)
                except ProtocolError as exc:  # RoundCutOff: the test reads what each got
                    results[ids[i]] = exc

            async def dies(i: int) -> None:
                others = len([j for j in range(3) if j != i and j not in dead | absent])
                while True:
                    round_ = averagers[i]._rounds.get((2, 7, 0))
                    if round_ is not None and len(round_.shares) >= others:
                        break
                    await trio.sleep(0.01)
                await hosts[i].close()

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(3):
                        if i == dies_after_shares:
                            nursery.start_soon(dies, i)
                        elif i not in dead | absent:
                            nursery.start_soon(one, i)

    trio.run(main)
    return ids, results


def test_a_follower_cut_off_from_its_gatherer_ends_with_the_others_result() -> None:
    """Replica 1 cannot reach the gatherer 0 (which refuses it), so it would gather alone and
    step on its own share while 0 and 2 step on their average: it takes their result instead."""
    ids, results = run_cut_round(cut=frozenset({(1, 0)}))
    assert all(isinstance(r, RoundResult) for r in results.values()), results
    first = results[ids[0]]
    assert isinstance(first, RoundResult)
    assert first.contributors == (ids[0], ids[2])
    assert all(same_result(first, r) for r in results.values() if isinstance(r, RoundResult))
    assert len(results) == 3


def test_a_gatherer_dying_mid_round_leaves_the_others_agreeing() -> None:
    ids, results = run_cut_round(dies_after_shares=0)
    assert set(results) == {ids[1], ids[2]}
    one, two = results[ids[1]], results[ids[2]]
    assert isinstance(one, RoundResult) and isinstance(two, RoundResult)
    assert same_result(one, two) and one.contributors == (ids[1], ids[2])


def test_a_lone_survivor_still_steps_on_its_own_share() -> None:
    """The gatherer and the third replica are gone: replica 1 gathers alone and steps."""
    ids, results = run_cut_round(dead=frozenset({0, 2}))
    result = results[ids[1]]
    assert isinstance(result, RoundResult)
    assert result.contributors == (ids[1],) and result.combined.microbatch_count == 2


def test_a_replica_cut_off_with_no_result_to_take_does_not_step_alone() -> None:
    """Replica 1 is refused by the gatherer 0, and the third replica is up but holds no result
    of the round: 1 must not step alone (0 may have stepped without it)."""
    ids, results = run_cut_round(cut=frozenset({(1, 0)}), absent=frozenset({2}))
    assert isinstance(results[ids[1]], RoundCutOff), results


def test_a_follower_whose_share_times_out_takes_the_gatherers_result() -> None:
    """Two replicas; the follower's link to the gatherer is too slow for its share (the upload
    times out) but not for a small question: with no third replica to ask, it asks the gatherer
    that failed it and takes its result instead of stepping alone."""
    results: dict[str, RoundResult] = {}

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = await hosts_in_id_order(stack, 2)
            ids = [str(h.get_id()) for h in hosts]

            def slow_shares(peer: str, n_bytes: int) -> float:
                return 10.0 if peer == ids[0] and n_bytes > 100 else 0.0

            rpcs = [RequestResponse(hosts[0]), RequestResponse(hosts[1], shaper=slow_shares)]
            pairs = zip(rpcs, ids, strict=True)
            averagers = [GradientAverager(rpc, i, LIMITS, 1.0) for rpc, i in pairs]
            for averager in averagers:
                averager.serve()
            await hosts[1].connect(peer_info(full_address(hosts[0])))

            async def one(i: int) -> None:
                results[ids[i]] = await averagers[i].average(2, 7, share_of(ids[i], i + 1), ids)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(2):
                        nursery.start_soon(one, i)

    trio.run(main)
    first, second = results.values()
    assert same_result(first, second) and first.combined.microbatch_count == 1


def test_a_result_that_does_not_fit_the_stage_is_not_taken() -> None:
    """The follower withholds its share and answers the gatherer's question with a made-up
    result of other tensors (naming the gatherer its gatherer): the gatherer leaves it and
    steps on its own share, instead of failing its step on it."""
    got: list[RoundResult] = []
    ids: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = await hosts_in_id_order(stack, 2)
            ids.extend(str(h.get_id()) for h in hosts)
            honest = GradientAverager(RequestResponse(hosts[0]), ids[0], LIMITS, 1.0)
            honest.serve()
            forged = GradientShare(ids[0], 1, {"w": torch.full((7, 7), 1e30)})

            async def answer(peer: str, request: bytes) -> bytes:
                return b"\x01" + encode_average((ids[0], ids[1]), forged, LIMITS)

            forger = RequestResponse(hosts[1])
            forger.serve(RESULT_PROTOCOL_ID, answer, RpcLimits(1 << 20, 1 << 20, 5.0))
            await hosts[1].connect(peer_info(full_address(hosts[0])))
            with trio.fail_after(30):
                got.append(await honest.average(2, 7, share_of(ids[0], 1), ids))

    trio.run(main)
    assert got[0].contributors == (ids[0],)
    assert same_shares([got[0].combined], [share_of(ids[0], 1)])


def test_a_replica_that_refuses_the_result_question_still_counts_as_up() -> None:
    """Replica 1 is refused by the gatherer 0; replica 2 averages with 0 but declines the
    result question (busy): 1 heard from a live replica, so it must not step alone beside the
    round of 0 and 2."""
    got: dict[int, RoundResult | ProtocolError] = {}

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = await hosts_in_id_order(stack, 3)
            ids = [str(h.get_id()) for h in hosts]
            averagers = []
            for j, host in enumerate(hosts):

                async def admit(peer: str, j: int = j) -> bool:
                    return not (j == 0 and peer == ids[1])

                rpc = RequestResponse(host, admit=admit)
                averagers.append(GradientAverager(rpc, ids[j], LIMITS, 1.0))
            for j, averager in enumerate(averagers):

                async def busy(peer: str, request: bytes) -> bytes:
                    raise Decline("busy")

                if j == 2:
                    averager._handle_result = busy  # type: ignore[method-assign]
                averager.serve()
            for i in range(3):
                for j in range(3):
                    if i != j:
                        await hosts[i].connect(peer_info(full_address(hosts[j])))

            async def one(i: int) -> None:
                try:
                    got[i] = await averagers[i].average(2, 7, share_of(ids[i], i + 1), ids)
                except ProtocolError as exc:
                    got[i] = exc

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(3):
                        nursery.start_soon(one, i)

    trio.run(main)
    assert isinstance(got[1], RoundCutOff), got
    first, third = got[0], got[2]
    assert isinstance(first, RoundResult) and isinstance(third, RoundResult)
    assert same_result(first, third)


ITERATION = 4


def replica_one_cannot_reach(
    host: IHost, ids: list[str], j: int, plan: PartitionPlan
) -> tuple[GradientAverager, StageWorker]:
    """Replica ``j``'s averager (serving) and stage worker at ``ITERATION``; the gatherer,
    replica 0, refuses every stream of replica 1."""

    async def admit(peer: str) -> bool:
        return not (j == 0 and peer == ids[1])

    averager = GradientAverager(RequestResponse(host, admit=admit), ids[j], LIMITS, 2.0)
    averager.serve()
    worker = StageWorker(plan, 0, TRAINING, SEED, replica_id=ids[j])
    worker.step_count = ITERATION
    return averager, worker


def relays_end_with_a_cut(
    attempt: int, absent: int | None = None
) -> tuple[list[str], list[StageWorker], dict[int, dict]]:
    """Three relays of one stage (real stage engines from the same seed, real averagers on real
    hosts), each with the gradient of its own microbatch, end ``ITERATION`` while the round's
    first gatherer refuses replica 1; ``absent`` is named a replica but never ends it. A relay
    that resyncs loads the gatherer's weights and step. Returns their ids, workers and replies."""
    plan = plan_partition(MODEL, 2)
    workers: list[StageWorker] = []
    replies: dict[int, dict] = {}
    ids: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = await hosts_in_id_order(stack, 3)
            ids.extend(str(h.get_id()) for h in hosts)
            nursery = await stack.enter_async_context(trio.open_nursery())
            roles = []
            for j, host in enumerate(hosts):
                averager, worker = replica_one_cannot_reach(host, ids, j, plan)
                activation = torch.randn(
                    2, 8, MODEL.d_model, generator=torch.Generator().manual_seed(j)
                )
                output = worker.forward(j, activation)
                worker.backward(j, torch.ones_like(output))
                workers.append(worker)
                plane = SimpleNamespace(ack_deadline_s=5.0, node_id=ids[j], stages=2)
                role = RelayRole(
                    worker=worker, stage=1, plane=plane,  # type: ignore[arg-type]
                    flow=SimpleNamespace(),  # type: ignore[arg-type]
                    averager=averager, limits=LIMITS, nursery=nursery,
                )  # fmt: skip
                roles.append(role)

                async def resync(step: int, worker: StageWorker = worker) -> None:
                    while workers[0].step_count < step:  # as a resync waits for a replica there
                        await trio.sleep(0.05)
                    for (_, mine), (_, theirs) in zip(
                        worker.named_params, workers[0].named_params, strict=True
                    ):
                        mine.data.copy_(theirs.data)
                    worker.step_count = workers[0].step_count

                role.resync = resync
            for i in range(3):
                for j in range(3):
                    if i != j:
                        await hosts[i].connect(peer_info(full_address(hosts[j])))
            request = control.EndIteration(ITERATION, tuple(ids), tuple(ids), attempt)

            async def end(j: int) -> None:
                replies[j] = control.decode_reply(await roles[j].end_iteration(request))

            with trio.fail_after(30):
                async with trio.open_nursery() as ending:
                    for j in range(3):
                        if j != absent:
                            ending.start_soon(end, j)
                while roles[1].resyncing:
                    await roles[1].resynced.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return ids, workers, replies


def same_weights(a: StageWorker, b: StageWorker) -> bool:
    return all(
        torch.equal(p, q) for (_, p), (_, q) in zip(a.named_params, b.named_params, strict=True)
    )


def test_relays_step_to_the_same_weights_when_one_is_cut_off_from_the_gatherer() -> None:
    """The last attempt steps whatever the round missed: the cut-off replica steps too, with
    the same average as the others (its own gradient left out), so no weights drift apart."""
    _ids, workers, replies = relays_end_with_a_cut(control.MAX_END_ATTEMPTS - 1)
    assert all(reply["ok"] for reply in replies.values()), replies
    assert all(worker.step_count == ITERATION + 1 for worker in workers)
    assert same_weights(workers[0], workers[1]) and same_weights(workers[0], workers[2])


def test_no_relay_steps_before_the_last_attempt_when_one_is_cut_off() -> None:
    """Before the last attempt the round misses the cut-off replica's gradients: no replica
    steps, and all name it missing, so the data node redoes them and asks again."""
    ids, workers, replies = relays_end_with_a_cut(0)
    assert not any(reply["ok"] for reply in replies.values()), replies
    assert all(reply.get("missing") == [ids[1]] for reply in replies.values()), replies
    assert all(worker.step_count == ITERATION for worker in workers)


def test_a_relay_cut_off_with_no_result_to_take_loads_a_replicas_state() -> None:
    """Replica 1 is refused by the gatherer 0, and replica 2 never ends the iteration, so no
    result of the round reaches 1: at the last attempt 0 steps alone, and 1, instead of stepping
    alone too, loads 0's state after its step."""
    _ids, workers, replies = relays_end_with_a_cut(control.MAX_END_ATTEMPTS - 1, absent=2)
    assert replies[0]["ok"] and not replies[1]["ok"], replies
    assert replies[1]["why"] == "cut off"
    assert workers[0].step_count == workers[1].step_count == ITERATION + 1
    assert same_weights(workers[0], workers[1])


def test_a_data_node_cut_off_from_its_gatherer_does_not_step_its_embedding_and_head() -> None:
    """Data nodes average their part like a stage: data node 1, refused by data node 0 with
    data node 2 up but out of the round, does not step alone; it marks the iteration so that it
    asks to be taken back in (loading the others' part) once the relays' end is done."""
    plan = plan_partition(MODEL, 2)
    roles: list[SimpleNamespace] = []

    async def run(fn: Callable[..., object], *args: object) -> object:
        return fn(*args)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = await hosts_in_id_order(stack, 3)
            ids = [str(h.get_id()) for h in hosts]
            for j, host in enumerate(hosts):
                averager, worker = replica_one_cannot_reach(host, ids, j, plan)
                output = worker.forward(j, torch.randn(2, 8, MODEL.d_model))
                worker.backward(j, torch.ones_like(output))
                roles.append(SimpleNamespace(averager=averager, worker=worker, _run=run))
                roles[-1].cut_off_at = None
            for i in range(3):
                for j in range(3):
                    if i != j:
                        await hosts[i].connect(peer_info(full_address(hosts[j])))
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for j in (0, 1):
                        nursery.start_soon(DataRole._step_own_part, roles[j], ITERATION, ids)

    trio.run(main)
    gatherer, cut = roles[0], roles[1]
    assert gatherer.cut_off_at is None and gatherer.worker.step_count == ITERATION + 1
    assert cut.cut_off_at == ITERATION and cut.worker.step_count == ITERATION
    assert all(p.grad is None or not p.grad.any() for _, p in cut.worker.named_params)
