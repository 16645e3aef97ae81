"""A juror re-executes a disputed backward hop with the forward input its worker serves: the
receipt of the forward comes from the worker itself when the data node serves no
certificate, and counts only signed by the accused and countersigned. The data node's silence
never convicts; the accused's own missing evidence does. Real libp2p hosts serve a relay's
receipts (SQLite) and evidence (frames and the stage's state of a real stage computation)."""

from __future__ import annotations

import hashlib
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import BACKWARD, FORWARD, HopReceipt, receipt_digest
from gwtf.node.audit import jury
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.receipts.cheats import WRONG_TENSOR_SCALE
from gwtf.node.store.batches import WORKER, BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.training import codec
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.settings import TrainingSettings
from tests.contracts.conftest import Staffed
from tests.contracts.test_audit_command import serving_data_node
from tests.node.sealed_receipts import keep_sealed
from tests.training.test_reexecute import stage_with_kept_state

SETTINGS = TrainingSettings(device="cpu")
LIMITS = CodecLimits()
ITERATION, MICROBATCH = 3, 7


def worked_backward(s: Staffed, tmp_path: Path, *, wrong: bool) -> dict[str, Any]:
    """Relay a's forward and backward of one microbatch at the last stage (its counterparty
    the data node), its output off by the wrong-tensor cheat's scale if ``wrong``; a keeps
    the frames and the stage's state."""
    w = s.w
    plan, worker, archive = stage_with_kept_state(tmp_path / "evidence-a")
    generator = torch.Generator().manual_seed(1)
    activation = torch.randn(2, 16, plan.config.d_model, generator=generator)
    grad = torch.randn(2, 16, plan.config.d_model, generator=generator)
    output = worker.forward(MICROBATCH, activation)
    input_grad = worker.backward(MICROBATCH, grad)
    if wrong:
        input_grad = input_grad * (1 + WRONG_TENSOR_SCALE)
    frames = [codec.encode(MICROBATCH, t, LIMITS) for t in (activation, output, grad, input_grad)]
    for frame in frames:
        archive.keep_frame(0, frame)
    digest = [hashlib.sha256(frame).digest() for frame in frames]

    def hop(direction: int, input_digest: bytes, output_digest: bytes) -> SignedReceipt:
        receipt = w.receipt(
            s.run, 0, s.data, s.a, s.data, MICROBATCH, stage=2, direction=direction,
            iteration=ITERATION, inputDigest=input_digest, outputDigest=output_digest,
        )  # fmt: skip
        return w.signed(receipt, s.a, s.data)

    forward, backward = hop(FORWARD, digest[0], digest[1]), hop(BACKWARD, digest[2], digest[3])
    return {"archive": archive, "plan": plan, "forward": forward, "backward": backward}


def keep_signed(db: Path, s: Staffed, hops: list[SignedReceipt]) -> None:
    """The hops as their worker's node keeps them: in batches its receivers countersigned."""
    database = open_database(f"sqlite:///{db}")
    try:
        keep_sealed(BatchStore(database, s.w.ledger_domain), hops, WORKER)
    finally:
        database.close()


def case_of(s: Staffed, entry: SignedReceipt) -> jury.Case:
    r: HopReceipt = entry.receipt
    digest = receipt_digest(r, s.w.ledger_domain)
    return jury.Case(1, 1, r, digest, entry.worker_signature, s.w.sponsor, s.w.wallet(1))


def verdict(s: Staffed, tmp_path: Path, made: dict[str, Any], kept: list[str]) -> tuple:
    """A juror's verdict on a's backward, the data node serving no certificate and no
    receipts, a serving its evidence and those of its receipts named in ``kept``."""
    keep_signed(tmp_path / "a.sqlite", s, [made[name] for name in kept])
    with ExitStack() as stack:
        peers = [
            stack.enter_context(serving_data_node(s, s.data, None, tmp_path / "data.sqlite")),
            stack.enter_context(
                serving_data_node(s, s.a, None, tmp_path / "a.sqlite", evidence=made["archive"])
            ),
        ]
        replayer = Replayer(made["plan"], SETTINGS)
        case = case_of(s, made["backward"])
        return trio.run(jury._verdict, case, peers, replayer, 10.0, s.w.ledger_domain, None)


def test_an_honest_backward_is_right_though_the_data_node_serves_no_certificate(
    staffed: Staffed, tmp_path: Path
) -> None:
    made = worked_backward(staffed, tmp_path, wrong=False)
    vote, why = verdict(staffed, tmp_path, made, ["forward", "backward"])
    assert vote == jury.RIGHT, why


def test_a_wrong_backward_is_wrong_with_the_forward_its_worker_serves(
    staffed: Staffed, tmp_path: Path
) -> None:
    made = worked_backward(staffed, tmp_path, wrong=True)
    vote, why = verdict(staffed, tmp_path, made, ["forward", "backward"])
    assert vote == jury.WRONG and "relative error" in why, why


def test_a_forward_receipt_the_worker_does_not_serve_is_its_missing_evidence(
    staffed: Staffed, tmp_path: Path
) -> None:
    made = worked_backward(staffed, tmp_path, wrong=False)
    vote, why = verdict(staffed, tmp_path, made, ["backward"])
    assert vote == jury.WRONG and "no receipt of its forward" in why


@pytest.mark.parametrize("forger", ["counterparty", "worker"])
def test_a_forward_receipt_without_both_signatures_is_not_the_forward(
    staffed: Staffed, tmp_path: Path, forger: str
) -> None:
    """A forward receipt signed by someone else than its worker or its counterparty counts for
    nothing: the backward is not re-executed from it."""
    s = staffed
    made = worked_backward(s, tmp_path, wrong=False)
    forward: SignedReceipt = made["forward"]
    signers = {"worker": (s.c, s.data), "counterparty": (s.a, s.c)}[forger]
    made["forward"] = s.w.signed(forward.receipt, *signers)
    vote, why = verdict(s, tmp_path, made, ["forward", "backward"])
    assert vote == jury.WRONG and "no receipt of its forward" in why
