"""The validation loss of the swarm's model, on a data node (``training.validation_every``).

Once an iteration's step is taken, the data node downloads each stage's weights at its own step
from the relays of that stage (weights only, digest-checked, as ``gwtf-node export`` does), puts
them together with its own embedding and head, and evaluates the data set's fixed validation
windows on that whole model. The next iteration waits, since its step would change the weights.

Replicas of a stage step alike, so their weights at one step are one digest. The figure is
verified when two relays of every stage served the same weights; where a stage has only one
relay to ask, it rests on that relay's word and is reported as unverified (any one relay could
forge it). Relays of a stage that disagree, or a stage that no relay serves at the data node's
step, leave that evaluation out (a warning, never a failed run).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.export.assembly import whole_tensors
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.p2p.weights import download_stage_state
from gwtf.node.training.checkpoint import PartState, read_part_state, save_part_state
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.errors import CheckpointError, ExportError
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.validation import Batch, whole_model_validation_loss

log = logging.getLogger(__name__)
#: A part's weights-only state file: 8 bytes a parameter at most, and its header.
HEADER_ALLOWANCE_BYTES = 1 << 20


@dataclass(frozen=True)
class SwarmValidation:
    loss: float
    #: Two relays of every stage served the same weights (else one relay's word stands).
    verified: bool


async def swarm_validation_loss(
    rpc: RequestResponse,
    worker: DataNodeWorker,
    plan: PartitionPlan,
    relays: dict[str, int],
    batches: Sequence[Batch],
    timeout_s: float,
) -> SwarmValidation | None:
    """The validation loss of the model the swarm holds at this data node's step; ``relays``
    maps each known relay to its stage. None when a stage is not to be had at that step."""
    step = worker.step_count
    parts = [await trio.to_thread.run_sync(_own_part, worker)]
    verified = True
    for stage in range(1, plan.n_stages + 1):
        holders = sorted(peer for peer, s in relays.items() if s == stage)
        try:
            found = await _stage_at(rpc, plan, stage, step, holders, timeout_s)
        except ExportError as exc:
            log.warning("validation after step %s skipped: %s", step, exc)
            return None
        if found is None:
            log.warning(
                "validation after step %s skipped: no relay of stage %s serves its weights at "
                "that step",
                step,
                stage,
            )
            return None
        state, confirmed = found
        verified = verified and confirmed
        parts.append(state)
    try:
        tensors = await trio.to_thread.run_sync(whole_tensors, plan.config, parts)
    except ExportError as exc:
        log.warning("validation after step %s skipped: %s", step, exc)
        return None
    loss = await trio.to_thread.run_sync(whole_model_validation_loss, plan.config, tensors, batches)
    return None if loss is None else SwarmValidation(loss, verified)


async def _stage_at(
    rpc: RequestResponse,
    plan: PartitionPlan,
    stage: int,
    step: int,
    holders: list[str],
    timeout_s: float,
) -> tuple[PartState, bool] | None:
    """The stage's weights at ``step`` and whether a second relay served the same; an
    ``ExportError`` when two relays serve different weights."""
    limit = 8 * plan.stages[stage - 1].param_count + HEADER_ALLOWANCE_BYTES
    first: tuple[PartState, str] | None = None
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
        if state.step != step or state.config != plan.config:
            continue
        if first is None:
            first = (state, peer)
            continue
        if state.digest != first[0].digest:
            raise ExportError(
                f"relays {first[1]} and {peer} of stage {stage} serve different weights at "
                f"step {step}"
            )
        return first[0], True
    return None if first is None else (first[0], False)


def _own_part(worker: DataNodeWorker) -> PartState:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.safetensors"
        save_part_state(worker, path, weights_only=True)
        return read_part_state(path.read_bytes())
