"""Replicas of a stage agree on the same gradient shares over real libp2p, even when one dies."""

from __future__ import annotations

from contextlib import AsyncExitStack, suppress
from pathlib import Path

import pytest
import torch
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from node.p2p.host import full_address, peer_info, running_host
from node.p2p.identity import load_or_create_identity
from node.p2p.rpc import RequestResponse
from node.runtime.averaging import GradientAverager
from node.runtime.share_codec import decode_shares, encode_shares
from node.training.codec import CodecLimits
from node.training.errors import TensorCodecError
from node.training.trainer import GradientShare

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


def run_round(tmp_path: Path, n_replicas: int, alive: set[int]) -> dict[str, list[GradientShare]]:
    """Start ``n_replicas`` hosts, let the ``alive`` ones average; the others never take part."""
    results: dict[str, list[GradientShare]] = {}

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = []
            for i in range(n_replicas):
                key = load_or_create_identity(tmp_path / f"r{i}.key")
                hosts.append(await stack.enter_async_context(running_host(key)))
            ids = [str(h.get_id()) for h in hosts]
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
    return results


def test_all_replicas_get_every_share(tmp_path: Path) -> None:
    results = run_round(tmp_path, 3, alive={0, 1, 2})
    lists = list(results.values())
    assert len(lists) == 3
    assert [s.microbatch_count for s in lists[0]] != []
    assert sorted(s.microbatch_count for s in lists[0]) == [1, 2, 3]
    assert all(same_shares(lists[0], other) for other in lists[1:])


@pytest.mark.parametrize("dead", [0, 1, 2])
def test_a_dead_replica_is_left_out_and_the_rest_agree(tmp_path: Path, dead: int) -> None:
    alive = {0, 1, 2} - {dead}
    results = run_round(tmp_path, 3, alive=alive)
    lists = list(results.values())
    assert len(lists) == 2
    assert same_shares(lists[0], lists[1])
    assert sorted(s.microbatch_count for s in lists[0]) == sorted(i + 1 for i in alive)


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
