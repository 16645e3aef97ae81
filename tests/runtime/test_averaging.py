"""Replicas of a stage agree on the same gradient shares over real libp2p, even when one dies."""

from __future__ import annotations

from contextlib import AsyncExitStack, suppress
from pathlib import Path

import pytest
import torch
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.replicas.averaging import GradientAverager, RoundResult, combine_shares
from gwtf.node.runtime.replicas.share_codec import (
    decode_average,
    decode_shares,
    encode_average,
    encode_shares,
)
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.errors import TensorCodecError
from gwtf.node.training.partition import plan_partition
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
