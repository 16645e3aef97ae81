"""A relay computes a hop only with the weights its evidence holds for the hop's iteration.

An auditor replays a relay's hop with the state the relay kept of that iteration, and a hop that
does not replay is a wrong tensor: its worker is slashed. So the state kept of an (epoch,
iteration) must be the weights every hop of it ran with, whatever is on the relay's disk and
whatever happened to its weights since the first hop. Checked here on a real stage, with the
relay's own compute path (``RelayRole._in_step``) and a real ``EvidenceArchive``:

* a state of that iteration already in the archive that is not these weights (kept by a previous
  process of the node, or, before the run's folder named its start time, by an earlier run of a
  devnet started afresh, which deploys the same ledger at the same address) is neither served
  for the hops computed now nor overwritten: the hop is declined (another replica takes it);
* weights replaced at the same step after the iteration's state was kept (a replica's state
  loaded) decline the iteration's later hops;
* a previous process's state that is these very weights (a restart in step) is fine.

Every hop the relay does compute replays bit for bit from what it kept.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gwtf.contracts.encoding import FORWARD, HopReceipt
from gwtf.node.audit.reexecute import HopEvidence, Replayer
from gwtf.node.p2p.rpc import Decline
from gwtf.node.runtime.dataplane.hop import HopHeader
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.store.evidence import EvidenceArchive, run_folder
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import load_part_state, save_part_state, snapshot_part_state
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

SETTINGS = TrainingSettings(device="cpu")
LIMITS = CodecLimits()
PLAN = plan_partition(named_config("gpt", "tiny"), 2)
EPOCH, ITERATION = 0, 5


def stage_one(seed: int) -> StageWorker:
    worker = StageWorker(PLAN, 0, SETTINGS, seed=seed)
    worker.step_count = ITERATION
    return worker


def relay(worker: StageWorker, archive: EvidenceArchive) -> RelayRole:
    """A stage-1 relay with ``archive`` for evidence; only its compute path is used."""
    plane = SimpleNamespace(ack_deadline_s=5.0, node_id="relay", stages=2)
    return RelayRole(
        worker=worker,
        stage=1,
        plane=plane,  # type: ignore[arg-type]
        flow=SimpleNamespace(),  # type: ignore[arg-type]
        averager=None,  # type: ignore[arg-type]
        limits=LIMITS,
        nursery=None,  # type: ignore[arg-type]
        evidence=archive,
    )


def forward(role: RelayRole, microbatch: int) -> tuple[HopReceipt, bytes, bytes] | None:
    """Hand ``role`` a forward hop of ``ITERATION``: its receipt and frames, or None if it
    declined the hop."""
    activation = torch.randn(
        2, 16, PLAN.config.d_model, generator=torch.Generator().manual_seed(microbatch)
    )
    frame = codec.encode(microbatch, activation, LIMITS)
    header = HopHeader(
        run_id=1, iteration=ITERATION, microbatch_id=microbatch, attempt=0, direction=FORWARD,
        stage=1, slot=0, flags=0, origin="data", path=("data",), epoch=EPOCH,
    )  # fmt: skip
    tensor = codec.decode(bytearray(frame), LIMITS).tensor
    try:
        out_frame = role._in_step(header, role._forward, header, frame, tensor)
    except Decline:
        return None
    role.worker.drop(microbatch)
    receipt = HopReceipt(
        runId=1, epoch=EPOCH, dataNode="0x" + "11" * 20, iteration=ITERATION,
        microbatchId=microbatch, stage=1, direction=FORWARD, attempt=0,
        worker="0x" + "22" * 20, counterparty="0x" + "33" * 20,
        inputDigest=hashlib.sha256(frame).digest(),
        outputDigest=hashlib.sha256(out_frame).digest(), units=100,
    )  # fmt: skip
    return receipt, frame, out_frame


def replays_exactly(archive: EvidenceArchive, hop: tuple[HopReceipt, bytes, bytes]) -> bool:
    """What an auditor finds: the hop re-executed with the relay's kept state of its iteration."""
    receipt, frame, out_frame = hop
    state = archive.state(EPOCH, ITERATION)
    assert state is not None
    return Replayer(PLAN, SETTINGS).replay(HopEvidence(receipt, frame, out_frame, state)).exact


def keep_state_of(archive: EvidenceArchive, worker: StageWorker) -> bytes:
    """``worker``'s state at ``ITERATION`` in ``archive``, as a process before this one kept it."""
    archive.keep_state(
        EPOCH,
        ITERATION,
        lambda: snapshot_part_state(worker, weights_only=True),
        lambda kept: True,
    )
    kept = archive.state(EPOCH, ITERATION)
    assert kept is not None
    return kept


def test_every_hop_a_relay_computes_replays_from_the_state_it_kept(tmp_path: Path) -> None:
    archive = EvidenceArchive(tmp_path, keep_epochs=2)
    role = relay(stage_one(seed=5), archive)
    hops = [forward(role, microbatch) for microbatch in (0, 1)]
    assert None not in hops
    assert all(replays_exactly(archive, hop) for hop in hops if hop is not None)


@pytest.mark.parametrize("earlier", ["other weights", "these weights"])
def test_a_state_kept_before_this_process_is_never_taken_for_other_weights(
    tmp_path: Path, earlier: str
) -> None:
    """The archive already holds a state of the iteration: a previous process's (a restart),
    or an earlier run's under the same folder. Other weights than the relay's own: it declines
    the iteration's hops and leaves that state to the hops it backs; the same weights: it
    computes."""
    archive = EvidenceArchive(tmp_path, keep_epochs=2)
    worker = stage_one(seed=5)
    kept = keep_state_of(archive, stage_one(seed=6) if earlier == "other weights" else worker)
    role = relay(worker, archive)
    hops = [forward(role, microbatch) for microbatch in (0, 1)]
    for hop in hops:
        assert hop is None or replays_exactly(archive, hop), "a hop its evidence does not back"
    assert archive.state(EPOCH, ITERATION) == kept
    if earlier == "other weights":
        assert hops == [None, None]
    else:
        assert None not in hops


def test_weights_replaced_at_the_same_step_after_the_state_was_kept_decline_the_hops(
    tmp_path: Path,
) -> None:
    """A replica's state loaded at the step the relay is at, after the first hop of the
    iteration kept its own: the iteration's later hops cannot be backed by what was kept."""
    archive = EvidenceArchive(tmp_path, keep_epochs=2)
    worker = stage_one(seed=5)
    role = relay(worker, archive)
    first = forward(role, 0)
    assert first is not None and replays_exactly(archive, first)
    with tempfile.TemporaryDirectory() as tmp:
        replica = Path(tmp) / "replica.safetensors"
        save_part_state(stage_one(seed=6), replica)
        load_part_state(worker, replica)
    assert worker.step_count == ITERATION
    later = forward(role, 1)
    assert later is None or replays_exactly(archive, later), "a hop its evidence does not back"
    assert later is None
    assert replays_exactly(archive, first), "the first hop's evidence stays"


def test_a_runs_evidence_folder_is_its_own_on_a_devnet_started_afresh() -> None:
    """A devnet started afresh has the same chain id, the ledger at the same address and the
    same run id: only the run's start time on chain tells its evidence from an earlier run's."""
    ledger = "0xE7f1725E7734CE288F8367e1Bb143E90bb3F0512"
    earlier = run_folder(31337, ledger, 1, 1_796_280_000)
    assert earlier == run_folder(31337, ledger.lower(), 1, 1_796_280_000)
    assert earlier != run_folder(31337, ledger, 1, 1_796_280_190)
    assert earlier != run_folder(31337, ledger, 2, 1_796_280_000)
