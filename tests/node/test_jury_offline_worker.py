"""A juror's vote on a worker it cannot dial and that no forwarder reaches either: offline
(stopped, or its host shut for the voting window), not at home. Its evidence is missing by its
own doing, so it must lose as missing evidence loses, not be voted RIGHT and paid the bond
(real hosts on loopback, a real stage, real re-execution; the worker's address is one nothing
listens on)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from gwtf.contracts.encoding import FORWARD, HopReceipt, ledger_domain, receipt_digest
from gwtf.node.audit import jury
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity, node_address_of_peer, peer_id_of
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.receipts.evidence import serve_evidence
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.training import codec
from tests.p2p.test_host_stop import run_bounded
from tests.training.test_reexecute import (
    ITERATION,
    LIMITS,
    MICROBATCH,
    SETTINGS,
    stage_with_kept_state,
)

TIMEOUT_S = 1.0
RUN = 1


def test_a_cheating_worker_that_is_offline_for_the_vote_loses(tmp_path: Path) -> None:
    plan, _, _ = stage_with_kept_state(tmp_path / "worker")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    # The worker's output is made up (a wrong tensor); its counterparty keeps both frames.
    made_up = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(9))
    frames = [codec.encode(MICROBATCH, t, LIMITS) for t in (activation, made_up)]
    kept = EvidenceArchive(tmp_path / "counterparty", keep_epochs=2)
    for frame in frames:
        kept.keep_frame(0, frame)
    offline = peer_id_of(new_identity())
    domain = ledger_domain(1337, "0x" + "22" * 20)
    votes: list[tuple[int | None, str]] = []

    async def main() -> None:
        async with running_host(new_identity()) as counterparty:
            serve_evidence(RequestResponse(counterparty), kept, RUN, TIMEOUT_S)
            r = HopReceipt(
                runId=RUN, epoch=0, dataNode="0x" + "11" * 20, iteration=ITERATION,
                microbatchId=MICROBATCH, stage=2, direction=FORWARD, attempt=0,
                worker=node_address_of_peer(offline),
                counterparty=node_address_of_peer(counterparty.get_id()),
                inputDigest=hashlib.sha256(frames[0]).digest(),
                outputDigest=hashlib.sha256(frames[1]).digest(), units=100,
            )  # fmt: skip
            case = jury.Case(1, 1, r, receipt_digest(r, domain), b"", "0x" + "33" * 20, "0x")
            peers = [
                f"{counterparty.get_addrs()[0]}",
                f"/ip4/127.0.0.1/tcp/9/p2p/{offline}",  # nothing listens there
            ]
            votes.append(
                await jury._verdict(case, peers, Replayer(plan, SETTINGS), TIMEOUT_S, domain, None)
            )

    run_bounded(main)
    ((vote, why),) = votes
    assert vote == jury.WRONG, why
