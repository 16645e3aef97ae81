"""A joiner downloads a replica's stage state in chunks over real libp2p and checks its digest."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from node.p2p.host import full_address, peer_info, running_host
from node.p2p.identity import load_or_create_identity
from node.p2p.rpc import RequestResponse
from node.p2p.weights import (
    CHUNK_BYTES,
    StageSnapshot,
    WeightDownloadError,
    download_stage_state,
    serve_weights,
)

Scenario = Callable[[RequestResponse, RequestResponse, dict[int, StageSnapshot]], Awaitable[None]]


def run_pair(tmp_path: Path, scenario: Scenario, step_after_lookups: int | None = None) -> None:
    """Serve stage 2; the replica takes a step at lookup number ``step_after_lookups``."""
    held: dict[int, StageSnapshot] = {
        2: StageSnapshot(stage=2, step=7, blob=os.urandom(2 * CHUNK_BYTES + 12345))
    }
    lookups = 0

    def snapshot_of(stage: int) -> StageSnapshot | None:
        nonlocal lookups
        lookups += 1
        if lookups == step_after_lookups:
            held[2] = StageSnapshot(stage=2, step=8, blob=os.urandom(len(held[2].blob)))
        return held.get(stage)

    async def main() -> None:
        replica_key = load_or_create_identity(tmp_path / "replica.key")
        joiner_key = load_or_create_identity(tmp_path / "joiner.key")
        async with (
            running_host(replica_key) as replica_host,
            running_host(joiner_key) as joiner_host,
        ):
            replica = RequestResponse(replica_host)
            serve_weights(replica, snapshot_of, timeout_s=5.0)
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


def test_state_that_changes_mid_download_is_not_mixed(tmp_path: Path) -> None:
    async def scenario(
        replica: RequestResponse, joiner: RequestResponse, held: dict[int, StageSnapshot]
    ) -> None:
        with pytest.raises(WeightDownloadError, match="changed during the download"):
            await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0)
        # A fresh attempt gets the new state whole.
        assert (
            await download_stage_state(joiner, replica.host.get_id(), 2, 64 << 20, 5.0) == held[2]
        )

    # Lookup 1 answers the manifest, lookup 2 the first chunk; the step lands on lookup 3.
    run_pair(tmp_path, scenario, step_after_lookups=3)
