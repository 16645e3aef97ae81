"""Weights read through a forwarder are signed by nobody: a forwarder that passes on made-up
weights for a worker at home cannot make its honest hop a wrong tensor. The replay is tried
again with the worker's weights over the other routes, and what is off only with forwarded
weights is unverifiable: unreplayed for an auditor, not a WRONG vote for a juror (real hosts
on loopback, a real stage's kept weights, real re-execution)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import FORWARD, HopReceipt
from gwtf.node.audit import jury
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.audit.replays import EvidenceSource, Replayed, replay_sample
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity, node_address_of_peer, peer_id_of
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.receipts.evidence import (
    _REQUEST,
    EVIDENCE_PROTOCOL,
    EVIDENCE_VIA_PROTOCOL,
    _forwarded_limits,
    _limits,
    serve_evidence,
    serve_evidence_forwarding,
)
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import holds_state_of, snapshot_part_state
from gwtf.node.training.stage_worker import StageWorker
from tests.p2p.test_host_stop import run_bounded
from tests.training.test_reexecute import (
    ITERATION,
    LIMITS,
    MICROBATCH,
    SETTINGS,
    stage_with_kept_state,
)

TIMEOUT_S = 5.0
RUN = 1


def test_made_up_weights_through_a_forwarder_never_make_a_worker_lose(tmp_path: Path) -> None:
    plan, worker, archive = stage_with_kept_state(tmp_path / "worker")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    frames = [
        codec.encode(MICROBATCH, t, LIMITS)
        for t in (activation, worker.forward(MICROBATCH, activation))
    ]
    # The forger's archive: the same frames, and weights of another initialisation.
    other = StageWorker(plan, 1, SETTINGS, seed=6)
    other.step_count = ITERATION
    forged = EvidenceArchive(tmp_path / "forged", keep_epochs=2)
    forged.keep_state(
        0,
        ITERATION,
        lambda: snapshot_part_state(other, weights_only=True),
        lambda kept: holds_state_of(kept, other, weights_only=True),
    )
    for frame in frames:
        archive.keep_frame(0, frame)
        forged.keep_frame(0, frame)
    replayer = Replayer(plan, SETTINGS)
    done: dict[str, Replayed] = {}

    async def main() -> None:
        async with (
            running_host(new_identity()) as home,
            running_host(new_identity()) as forger_store,
            running_host(new_identity()) as liar,
            running_host(new_identity()) as honest,
            running_host(new_identity()) as auditor,
        ):
            serve_evidence(RequestResponse(home), archive, RUN, TIMEOUT_S)
            serve_evidence(RequestResponse(forger_store), forged, RUN, TIMEOUT_S)
            lying = RequestResponse(liar)

            async def forge(_peer: str, request: bytes) -> bytes:
                # Answers for any target from its own made-up store.
                inner = request[1 + request[0] :]
                assert len(inner) == _REQUEST.size
                to = forger_store.get_id()
                return await lying.request(to, EVIDENCE_PROTOCOL, inner, _limits(TIMEOUT_S))

            lying.serve(EVIDENCE_VIA_PROTOCOL, forge, _forwarded_limits(TIMEOUT_S), PublicRate())
            await lying.dialer.connect(forger_store.get_id(), forger_store.get_addrs())
            forwarding = RequestResponse(honest)
            serve_evidence_forwarding(forwarding, TIMEOUT_S)
            await forwarding.dialer.connect(home.get_id(), home.get_addrs())
            rpc = RequestResponse(auditor)
            for peer in (liar, honest):
                await rpc.dialer.connect(peer.get_id(), peer.get_addrs())
            node = node_address_of_peer(home.get_id())
            r = HopReceipt(
                runId=RUN, epoch=0, dataNode="0x" + "11" * 20, iteration=ITERATION,
                microbatchId=MICROBATCH, stage=2, direction=FORWARD, attempt=0, worker=node,
                counterparty="0x" + "33" * 20, inputDigest=hashlib.sha256(frames[0]).digest(),
                outputDigest=hashlib.sha256(frames[1]).digest(), units=100,
            )  # fmt: skip
            entry = SignedReceipt(r, b"", b"")
            unreached = {node.lower(): str(home.get_id())}
            for name, forwarders in (
                ("liar first", [liar, honest]),
                ("liar alone", [liar]),
                ("honest alone", [honest]),
            ):
                ids = [str(f.get_id()) for f in forwarders]
                source = EvidenceSource(rpc, {}, RUN, TIMEOUT_S, unreached, ids)
                (done[name],) = await replay_sample(source, replayer, [entry], [(entry, None)])

    run_bounded(main)
    honest_first = done["honest alone"]
    assert honest_first.replay is not None and not honest_first.replay.wrong
    # The liar's weights are asked first and replay off; the honest forwarder's replay right.
    second = done["liar first"]
    assert second.replay is not None and not second.replay.wrong, second.why_not
    assert jury._vote_of(second)[0] == jury.RIGHT
    # Through the liar alone the hop is unverifiable: unreplayed, and no WRONG vote.
    alone = done["liar alone"]
    assert alone.replay is None and alone.unverifiable, alone
    assert "unverifiable" in alone.why_not
    assert jury._vote_of(alone)[0] == jury.RIGHT


def test_a_home_worker_off_with_forwarded_weights_is_judged_with_two_replicas_weights(
    tmp_path: Path,
) -> None:
    """A worker at home whose every route passes on weights that replay off is judged with the
    weights two other replicas serve identically, read from them directly: a cheater (a
    made-up output) loses, an honest worker wins. Unjudged, any forwarder passing on made-up
    weights let a home cheater escape (unverifiable: RIGHT, and no dispute)."""
    plan, worker, archive = stage_with_kept_state(tmp_path / "replicas")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    made_up = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(9))
    frames = {
        name: codec.encode(MICROBATCH, t, LIMITS)
        for name, t in (
            ("input", activation),
            ("honest", worker.forward(MICROBATCH, activation)),
            ("cheater", made_up),
        )
    }
    other = StageWorker(plan, 1, SETTINGS, seed=6)
    other.step_count = ITERATION
    forged = EvidenceArchive(tmp_path / "forged", keep_epochs=2)
    forged.keep_state(
        0,
        ITERATION,
        lambda: snapshot_part_state(other, weights_only=True),
        lambda kept: holds_state_of(kept, other, weights_only=True),
    )
    for frame in frames.values():
        forged.keep_frame(0, frame)
    replayer = Replayer(plan, SETTINGS)
    done: dict[str, Replayed] = {}

    async def main() -> None:
        async with (
            running_host(new_identity()) as forger_store,
            running_host(new_identity()) as liar,
            running_host(new_identity()) as one,
            running_host(new_identity()) as two,
            running_host(new_identity()) as auditor,
        ):
            serve_evidence(RequestResponse(forger_store), forged, RUN, TIMEOUT_S)
            lying = RequestResponse(liar)

            async def forge(_peer: str, request: bytes) -> bytes:
                inner = request[1 + request[0] :]
                to = forger_store.get_id()
                return await lying.request(to, EVIDENCE_PROTOCOL, inner, _limits(TIMEOUT_S))

            lying.serve(EVIDENCE_VIA_PROTOCOL, forge, _forwarded_limits(TIMEOUT_S), PublicRate())
            await lying.dialer.connect(forger_store.get_id(), forger_store.get_addrs())
            rpc = RequestResponse(auditor)
            replicas = {}
            for replica in (one, two):  # the stage's other replicas, keeping its true weights
                serve_evidence(RequestResponse(replica), archive, RUN, TIMEOUT_S)
                await rpc.dialer.connect(replica.get_id(), replica.get_addrs())
                replicas[node_address_of_peer(replica.get_id()).lower()] = str(replica.get_id())
            await rpc.dialer.connect(liar.get_id(), liar.get_addrs())
            home = peer_id_of(new_identity())  # read only through the liar
            node = node_address_of_peer(home)
            for name in ("cheater", "honest"):
                r = HopReceipt(
                    runId=RUN, epoch=0, dataNode="0x" + "11" * 20, iteration=ITERATION,
                    microbatchId=MICROBATCH, stage=2, direction=FORWARD, attempt=0,
                    worker=node, counterparty="0x" + "33" * 20,
                    inputDigest=hashlib.sha256(frames["input"]).digest(),
                    outputDigest=hashlib.sha256(frames[name]).digest(), units=100,
                )  # fmt: skip
                entry = SignedReceipt(r, b"", b"")
                mates = [
                    SignedReceipt(dataclasses.replace(r, worker=mate), b"", b"")
                    for mate in replicas
                ]
                source = EvidenceSource(
                    rpc, replicas, RUN, TIMEOUT_S, {node.lower(): str(home)}, [str(liar.get_id())]
                )
                (done[name],) = await replay_sample(
                    source, replayer, [entry, *mates], [(entry, None)]
                )

    run_bounded(main)
    cheater, honest = done["cheater"], done["honest"]
    assert cheater.replay is not None and cheater.replay.wrong, cheater.why_not
    assert "+" in cheater.weights_from, "judged with two replicas' weights"
    assert jury._vote_of(cheater)[0] == jury.WRONG
    assert honest.replay is not None and not honest.replay.wrong, honest.why_not
    assert jury._vote_of(honest)[0] == jury.RIGHT
