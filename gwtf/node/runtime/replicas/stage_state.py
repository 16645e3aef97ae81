"""A stage's state between replicas: served to joiners, loaded by a joiner or a relay behind.

A relay serves its stage's weights and optimizer state (one snapshot per step, digest-checked in
chunks by ``gwtf.node.p2p.weights``), a data node its embedding and head (stage 0), each whole or
its weights only (what ``gwtf-node export`` fetches). A joiner loads the state at the step it needs,
or later, from whichever replica has it.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Protocol

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.p2p.weights import StageSnapshot, download_stage_state, serve_weights
from gwtf.node.runtime.discovery.address_book import PeerRecord
from gwtf.node.runtime.discovery.run_discovery import RunDiscovery
from gwtf.node.training.checkpoint import load_part_state, save_part_state
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.stage_worker import StageWorker

log = logging.getLogger(__name__)


Part = DataNodeWorker | StageWorker


class OtherDataNodes(Protocol):
    """The run's other data nodes, as this one knows them now (``DataPeers.others``). Does not
    block or raise."""

    def __call__(self) -> list[str]: ...


def serve_stage_state(
    rpc: RequestResponse,
    worker: Part,
    own_stage: int,
    timeout_s: float,
    limiter: trio.CapacityLimiter,
) -> None:
    """Serve this node's part (a relay's stage, a data node's stage 0) as it is at each step,
    whole or its weights only. ``limiter``: the compute thread's, so a snapshot is never taken
    while a step is half applied (the step runs in that thread)."""
    cache: dict[bool, StageSnapshot] = {}  # by kind, each of the step it was taken at

    def take(weights_only: bool) -> StageSnapshot:
        step = worker.step_count
        cached = cache.get(weights_only)
        if cached is None or cached.step != step:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "state.safetensors"
                save_part_state(worker, path, weights_only=weights_only)
                cached = StageSnapshot(own_stage, step, path.read_bytes(), weights_only)
            cache[weights_only] = cached
        return cached

    async def snapshot_of(stage: int, weights_only: bool) -> StageSnapshot | None:
        if stage != own_stage:
            return None
        return await trio.to_thread.run_sync(take, weights_only, limiter=limiter)

    serve_weights(rpc, snapshot_of, timeout_s)


async def join_stage(
    rpc: RequestResponse,
    discovery: RunDiscovery,
    worker: StageWorker,
    stage: int,
    min_step: int,
    deadlines: tuple[float, float, float],
    first_sources: list[PeerRecord] | None = None,
    limiter: trio.CapacityLimiter | None = None,
) -> None:
    """Load the state of this relay's ``stage``, at ``min_step`` or later, from a live replica
    (``first_sources`` first, then whom discovery names). ``deadlines``: for the whole search,
    for each request, and between two searches (seconds). ``limiter``: the relay's compute
    thread's, so that no hop computes (nor its evidence is kept) with half-loaded weights."""
    total_s, request_s, retry_s = deadlines
    first = list(first_sources or [])
    records = first
    with trio.fail_after(total_s):
        while True:
            for record in records:
                loaded = await _load_state_from(
                    rpc, worker, stage, record.peer_id, min_step, request_s, limiter
                )
                if loaded:
                    return
            await trio.sleep(retry_s)
            known = {r.peer_id for r in first}
            found = await discovery.weight_sources(stage)
            records = first + [r for r in found if r.peer_id not in known]


async def load_data_part(
    rpc: RequestResponse,
    worker: DataNodeWorker,
    data_peers: OtherDataNodes,
    min_step: int,
    deadlines: tuple[float, float],
) -> None:
    """Load the embedding and head, at ``min_step`` or later, from another data node (whom
    ``data_peers`` names now). ``deadlines``: for the whole search and for each request (s)."""
    total_s, request_s = deadlines
    with trio.fail_after(total_s):
        while True:
            for peer in data_peers():
                if await _load_state_from(rpc, worker, 0, peer, min_step, request_s):
                    return
            await trio.sleep(0.2)  # its own step may still be under way


async def _load_state_from(
    rpc: RequestResponse,
    worker: Part,
    stage: int,
    peer: str,
    min_step: int,
    timeout_s: float,
    limiter: trio.CapacityLimiter | None = None,
) -> bool:
    """Load ``stage``'s state from ``peer`` if it has it at ``min_step`` or later."""
    try:
        snapshot = await download_stage_state(rpc, ID.from_base58(peer), stage, 1 << 30, timeout_s)
    except ProtocolError as exc:
        log.debug("no stage %s state from %s: %s", stage, peer, exc)
        return False
    if snapshot.step < min_step:
        return False  # that replica has not stepped yet; ask again shortly
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.safetensors"
        path.write_bytes(snapshot.blob)
        await trio.to_thread.run_sync(load_part_state, worker, path, limiter=limiter)
    log.info("loaded stage %s at step %s from %s", stage, snapshot.step, peer)
    return True
