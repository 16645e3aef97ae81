"""A joiner downloads a replica's stage state in chunks over real libp2p and checks its digest;
an exporter outside the run gets a stage's weights only (never the optimizer's state), within
the public rate, from snapshots it cannot make a node take at every step."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.p2p.weights import (
    CHUNK_BYTES,
    KEPT_STATES,
    StageSnapshot,
    WeightDownloadError,
    ask_manifest,
    download_stage_state,
    serve_weights,
)

Scenario = Callable[[RequestResponse, RequestResponse, dict[int, StageSnapshot]], Awaitable[None]]


#: The weights-only snapshot of stage 2 served beside the whole state (``held``).
WEIGHTS_ONLY = StageSnapshot(stage=2, step=7, blob=os.urandom(CHUNK_BYTES + 99), weights_only=True)


async def refuse(_peer: str) -> bool:
    return False


def run_pair(
    tmp_path: Path,
    scenario: Scenario,
    public: PublicRate | None = None,
    admit: bool = True,
    wrap: Callable[[Any], Any] = lambda source: source,
) -> None:
    """Serve stage 2 from ``held`` (the scenario may change it: the replica took a step), and
    its weights only from ``WEIGHTS_ONLY``; ``admit=False``: the joiner is outside the run."""
    held: dict[int, StageSnapshot] = {
        2: StageSnapshot(stage=2, step=7, blob=os.urandom(2 * CHUNK_BYTES + 12345))
    }

    async def snapshot_of(stage: int, weights_only: bool) -> StageSnapshot | None:
        if weights_only:
            return WEIGHTS_ONLY if stage == 2 else None
        return held.get(stage)

    async def main() -> None:
        replica_key = new_identity()
        joiner_key = new_identity()
        async with (
            running_host(replica_key) as replica_host,
            running_host(joiner_key) as joiner_host,
        ):
            replica = (
                RequestResponse(replica_host)
                if admit
                else RequestResponse(replica_host, admit=refuse)
            )
            serve_weights(replica, wrap(snapshot_of), timeout_s=5.0, public=public)
            joiner = RequestResponse(joiner_host)
            await joiner_host.connect(peer_info(full_address(replica_host)))
            with trio.fail_after(30):
                await scenario(replica, joiner, held)

    trio.run(main)


def test_joiner_gets_the_exact_state(tmp_path: Path) -> None:
    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        got = await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0)
        assert got == held[2]

    run_pair(tmp_path, scenario)


def test_unknown_stage_and_oversized_state_are_refused(tmp_path: Path) -> None:
    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        with pytest.raises(WeightDownloadError, match="does not hold stage 3"):
            await download_stage_state(joiner, replica.host.get_id(), 3, 64 << 20, 5.0)
        with pytest.raises(WeightDownloadError, match="over the"):
            await download_stage_state(joiner, replica.host.get_id(), 2, 1000, 5.0)

    run_pair(tmp_path, scenario)


def after_first_chunk(joiner: RequestResponse, action: Callable[[], Awaitable[None]]) -> None:
    """Run ``action`` once the joiner's first download has its manifest and first chunk."""
    request = joiner.request
    replies = 0

    async def request_then_act(*args: Any) -> bytes:
        nonlocal replies
        reply = await request(*args)
        replies += 1
        if replies == 2:
            await action()
        return reply

    joiner.request = request_then_act  # type: ignore[method-assign]


def step(held: dict[int, StageSnapshot]) -> None:
    old = held[2]
    held[2] = StageSnapshot(stage=2, step=old.step + 1, blob=os.urandom(len(old.blob)))


def test_a_step_mid_download_still_yields_the_state_the_manifest_named(tmp_path: Path) -> None:
    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        before = held[2]
        newer: list[StageSnapshot] = []

        async def step_and_download_again() -> None:
            step(held)  # another joiner now gets the new state, whole
            newer.append(await download_stage_state(joiner, replica.host.get_id(), 2, 1 << 26, 5))

        after_first_chunk(joiner, step_and_download_again)
        got = await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0)
        assert got == before and got.step == 7, "the state its manifest named, not a mix"
        assert newer == [held[2]] and held[2].step == 8

    run_pair(tmp_path, scenario)


def test_a_state_no_longer_kept_is_not_mixed(tmp_path: Path) -> None:
    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        async def two_steps_each_downloaded() -> None:
            for _ in range(KEPT_STATES):  # the first download's state is pushed out
                step(held)
                await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0)

        after_first_chunk(joiner, two_steps_each_downloaded)
        with pytest.raises(WeightDownloadError, match="changed during the download"):
            await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0)
        # A fresh attempt gets the newest state whole.
        assert (
            await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0) == held[2]
        )

    run_pair(tmp_path, scenario)


def test_the_weights_only_state_is_its_own_download(tmp_path: Path) -> None:
    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        peer = replica.host.get_id()
        weights = await download_stage_state(joiner, peer, 2, 64 << 20, 5.0, weights_only=True)
        assert weights == WEIGHTS_ONLY and weights.weights_only
        assert await download_stage_state(joiner, peer, 2, 64 << 20, 5.0) == held[2]

    run_pair(tmp_path, scenario)


def test_a_peer_outside_the_run_is_served_within_the_public_rate(tmp_path: Path) -> None:
    """Manifest and two chunks against a burst of two requests: the third is declined as busy
    and asked again once the rate has refilled."""

    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        started = trio.current_time()
        got = await download_stage_state(
            joiner, replica.host.get_id(), 2, 64 << 20, 5.0, weights_only=True
        )
        assert got == WEIGHTS_ONLY
        assert trio.current_time() - started >= 0.4, "the third request waited for the rate"
        assert replica.refused == {}

    run_pair(tmp_path, scenario, public=PublicRate(per_s=2.0, burst=2.0), admit=False)


def test_a_peer_outside_the_run_gets_weights_only_and_cannot_make_snapshots_or_evict(
    tmp_path: Path,
) -> None:
    """An outsider is refused the whole state (AdamW included); its weights manifests are
    answered from one snapshot per ``PUBLIC_SNAPSHOT_S``, however often it asks or the node
    steps."""
    taken: list[bool] = []

    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        peer = replica.host.get_id()
        with pytest.raises(WeightDownloadError, match="weights only"):
            await download_stage_state(joiner, peer, 2, 64 << 20, 5.0)
        first = await ask_manifest(joiner, peer, 2, 5.0, weights_only=True)
        for _ in range(3):
            again = await ask_manifest(joiner, peer, 2, 5.0, weights_only=True)
            assert again == first
        assert taken.count(True) == 1

    def counting(source: Any) -> Any:
        async def snapshot_of(stage: int, weights_only: bool) -> StageSnapshot | None:
            taken.append(weights_only)
            return await source(stage, weights_only)

        return snapshot_of

    run_pair(tmp_path, scenario, public=PublicRate(per_s=100.0, burst=100.0), admit=False,
             wrap=counting)  # fmt: skip
