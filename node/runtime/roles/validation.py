"""The validation loss of the swarm's model, on a data node (``training.validation_every``).

Once an iteration's step is taken, the data node downloads each stage's weights at its own step
from a relay of that stage (weights only, digest-checked, as ``gwtf-node export`` does), puts
them together with its own embedding and head, and evaluates the data set's fixed validation
windows on that whole model. The next iteration waits, since its step would change the weights.
A stage that no relay serves at the data node's step leaves that evaluation out (a warning,
never a failed run).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from node.export.assembly import whole_tensors
from node.p2p.rpc import RequestResponse
from node.p2p.weights import download_stage_state
from node.training.checkpoint import PartState, read_part_state, save_part_state
from node.training.data_node import DataNodeWorker
from node.training.errors import CheckpointError, ExportError
from node.training.partition import PartitionPlan
from node.training.validation import Batch, whole_model_validation_loss

log = logging.getLogger(__name__)
#: A part's weights-only state file: 8 bytes a parameter at most, and its header.
HEADER_ALLOWANCE_BYTES = 1 << 20


async def swarm_validation_loss(
    rpc: RequestResponse,
    worker: DataNodeWorker,
    plan: PartitionPlan,
    relays: dict[str, int],
    batches: Sequence[Batch],
    timeout_s: float,
) -> float | None:
    """The validation loss of the model the swarm holds at this data node's step; ``relays``
    maps each known relay to its stage. None when a stage is not to be had at that step."""
    step = worker.step_count
    parts = [await trio.to_thread.run_sync(_own_part, worker)]
    for stage in range(1, plan.n_stages + 1):
        holders = sorted(peer for peer, s in relays.items() if s == stage)
        state = await _stage_at(rpc, plan, stage, step, holders, timeout_s)
        if state is None:
            log.warning(
                "validation after step %s skipped: no relay of stage %s serves its weights at "
                "that step",
                step,
                stage,
            )
            return None
        parts.append(state)
    try:
        tensors = await trio.to_thread.run_sync(whole_tensors, plan.config, parts)
    except ExportError as exc:
        log.warning("validation after step %s skipped: %s", step, exc)
        return None
    return await trio.to_thread.run_sync(whole_model_validation_loss, plan.config, tensors, batches)


async def _stage_at(
    rpc: RequestResponse,
    plan: PartitionPlan,
    stage: int,
    step: int,
    holders: list[str],
    timeout_s: float,
) -> PartState | None:
    limit = 8 * plan.stages[stage - 1].param_count + HEADER_ALLOWANCE_BYTES
    for peer in holders:
        try:
            snapshot = await download_stage_state(
                rpc, ID.from_base58(peer), stage, limit, timeout_s, weights_only=True
            )
            if snapshot.step != step:
                continue
            state = await trio.to_thread.run_sync(read_part_state, snapshot.blob)
        except (ProtocolError, CheckpointError, ValueError) as exc:
            log.debug("no stage %s weights from %s for validation: %s", stage, peer, exc)
            continue
        if state.step == step and state.config == plan.config:
            return state
    return None


def _own_part(worker: DataNodeWorker) -> PartState:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.safetensors"
        save_part_state(worker, path, weights_only=True)
        return read_part_state(path.read_bytes())
