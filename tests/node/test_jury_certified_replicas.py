"""A juror learns a hop's replicas (whose weights judge a worker whose own come only through a
forwarder) only from the leaves of the data node's certificate that verify against its root on
chain. A data node that is a home worker's only forwarder, passing on made-up weights, and serves
a certificate page naming two sybils that serve the same made-up weights, cannot have the honest
worker voted WRONG; with a verified certificate naming two true replicas, a cheater still loses
(real hosts on loopback serving a real certificate tree and a real stage's kept weights, real
re-execution)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch

from gwtf.contracts.certificate_tree import LeafProof, SignedReceipt, build_certificate_tree
from gwtf.contracts.encoding import FORWARD, CertRef, HopReceipt, ledger_domain, receipt_digest
from gwtf.contracts.merkle import verify_proof
from gwtf.node.audit import jury
from gwtf.node.audit.checks import UNVERIFIED
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.audit.replays import EvidenceSource, Replayed
from gwtf.node.audit.runner import Sampling, replay_certificate
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import new_identity, node_address_of_peer, peer_id_of
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.evidence import (
    EVIDENCE_PROTOCOL,
    EVIDENCE_VIA_PROTOCOL,
    _forwarded_limits,
    _limits,
    serve_evidence,
)
from gwtf.node.receipts.serving import (
    Fetched,
    ReceiptServer,
    certified_page,
    serve_receipts_forwarding,
)
from gwtf.node.receipts.wire import ReceiptPage
from gwtf.node.store.database import open_database
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.store.hops import HopStore
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import holds_state_of, snapshot_part_state
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.stage_worker import StageWorker
from tests.p2p.test_host_stop import run_bounded
from tests.training.test_reexecute import (
    ITERATION,
    LIMITS,
    MICROBATCH,
    SETTINGS,
    stage_with_kept_state,
)

TIMEOUT_S = 2.0
RUN = 1
STAGE = 2
DOMAIN = ledger_domain(1337, "0x" + "22" * 20)
SIGNATURE = b"\x01" * 65  # leaves commit signatures; no check here recovers them


def _hop(
    data_node: str,
    worker: str,
    microbatch: int,
    frames: tuple[bytes, bytes],
    stage: int = STAGE,
    iteration: int = ITERATION,
) -> SignedReceipt:
    """A forward of ``worker``'s from input to output ``frames``."""
    r = HopReceipt(
        runId=RUN, epoch=0, dataNode=data_node, iteration=iteration, microbatchId=microbatch,
        stage=stage, direction=FORWARD, attempt=0, worker=worker, counterparty="0x" + "33" * 20,
        inputDigest=hashlib.sha256(frames[0]).digest(),
        outputDigest=hashlib.sha256(frames[1]).digest(), units=100,
    )  # fmt: skip
    return SignedReceipt(r, SIGNATURE, SIGNATURE)


def _made_up_weights(plan: PartitionPlan, tmp_path: Path) -> EvidenceArchive:
    other = StageWorker(plan, 1, SETTINGS, seed=6)
    other.step_count = ITERATION
    forged = EvidenceArchive(tmp_path, keep_epochs=2)
    forged.keep_state(
        0,
        ITERATION,
        lambda: snapshot_part_state(other, weights_only=True),
        lambda kept: holds_state_of(kept, other, weights_only=True),
    )
    return forged


def _vote(
    tmp_path: Path,
    replicas_keep: EvidenceArchive,
    forged: EvidenceArchive,
    plan: PartitionPlan,
    output: bytes,
    input_: bytes,
    on_chain: bool,
    replicas_iteration: int = ITERATION,
    data_at_home: bool = False,
) -> tuple[int | None, str]:
    """A juror's vote on a home worker's forward with output ``output``, read only through its
    data node, which forwards ``forged``'s weights and serves a certificate naming two
    replicas keeping ``replicas_keep`` at the hop's stage and iteration; ``on_chain``: the
    page served is the certificate on chain, else one whose replica leaves do not verify;
    the replicas' certified hops are at ``replicas_iteration``. ``data_at_home``: the juror
    cannot dial the data node either, and reads it, and the worker, through a relay it keeps a
    connection to, which passes on the made-up weights in its place."""
    votes: list[tuple[int | None, str]] = []

    async def main() -> None:
        async with (
            running_host(new_identity()) as data,
            running_host(new_identity()) as data_store,
            running_host(new_identity()) as one,
            running_host(new_identity()) as two,
            running_host(new_identity()) as relay,
        ):
            data_node = node_address_of_peer(data.get_id())
            home = peer_id_of(new_identity())  # reached only through the data node (or relay)
            worker = node_address_of_peer(home)
            mates = [node_address_of_peer(p.get_id()) for p in (one, two)]

            frames = (input_, output)
            disputed = _hop(data_node, worker, MICROBATCH, frames)
            named = [disputed]
            certified = [disputed]
            for i, mate in enumerate(mates):
                named.append(
                    _hop(data_node, mate, MICROBATCH + 1 + i, frames, iteration=replicas_iteration)
                )
                # What the data node certified on chain: the same nodes' hops at another
                # stage, which make them no replicas of the disputed hop.
                certified.append(_hop(data_node, mate, MICROBATCH + 1 + i, frames, stage=1))
            tree_on_chain = build_certificate_tree(named if on_chain else certified, DOMAIN)
            cert: CertRef = tree_on_chain.cert_ref(RUN, 0, data_node)
            served = build_certificate_tree(named, DOMAIN)
            database = open_database(f"sqlite:///{tmp_path / 'data.sqlite'}")
            store = HopStore(database)
            terms = ReceiptTerms(RUN, DOMAIN, 3, 100)
            ReceiptServer(store, terms, {0: served}.get).serve(RequestResponse(data), TIMEOUT_S)
            # The data node passes on made-up weights for the home worker (any target).
            serve_evidence(RequestResponse(data_store), forged, RUN, TIMEOUT_S)
            forwarder = relay if data_at_home else data
            forwarding = RequestResponse(forwarder)
            if data_at_home:
                serve_receipts_forwarding(forwarding, TIMEOUT_S)
                await forwarding.dialer.connect(data.get_id(), data.get_addrs())

            async def forge(_peer: str, request: bytes) -> bytes:
                inner = request[1 + request[0] :]
                to = data_store.get_id()
                return await forwarding.request(to, EVIDENCE_PROTOCOL, inner, _limits(TIMEOUT_S))

            forwarding.serve(
                EVIDENCE_VIA_PROTOCOL, forge, _forwarded_limits(TIMEOUT_S), PublicRate()
            )
            await forwarding.dialer.connect(data_store.get_id(), data_store.get_addrs())
            for replica in (one, two):
                serve_evidence(RequestResponse(replica), replicas_keep, RUN, TIMEOUT_S)
            peers: Sequence[str] = [
                full_address(relay) if data_at_home else full_address(data),
                *([f"/ip4/127.0.0.1/tcp/9/p2p/{data.get_id()}"] if data_at_home else []),
                full_address(one),
                full_address(two),
                f"/ip4/127.0.0.1/tcp/9/p2p/{home}",  # at home: nothing listens there
            ]
            r = disputed.receipt
            case = jury.Case(1, 1, r, receipt_digest(r, DOMAIN), SIGNATURE, "0x" + "44" * 20, "0x")
            replayer = Replayer(plan, SETTINGS)
            votes.append(await jury._verdict(case, peers, replayer, TIMEOUT_S, DOMAIN, cert))
            database.close()

    run_bounded(main)
    return votes[0]


def test_sybil_replicas_on_a_page_that_does_not_verify_never_convict_an_honest_worker(
    tmp_path: Path,
) -> None:
    plan, worker, _ = stage_with_kept_state(tmp_path / "true")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    input_ = codec.encode(MICROBATCH, activation, LIMITS)
    output = codec.encode(MICROBATCH, worker.forward(MICROBATCH, activation), LIMITS)
    forged = _made_up_weights(plan, tmp_path / "forged")
    for frame in (input_, output):
        forged.keep_frame(0, frame)
    # The sybils serve the very weights the data node passes on: they agree, and replay off.
    vote, why = _vote(tmp_path, forged, forged, plan, output, input_, on_chain=False)
    assert vote == jury.RIGHT, why
    assert "unverifiable" in why, why


def test_two_replicas_in_the_verified_certificate_still_convict_a_cheater(
    tmp_path: Path,
) -> None:
    plan, _, archive = stage_with_kept_state(tmp_path / "true")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    made_up = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(9))
    input_ = codec.encode(MICROBATCH, activation, LIMITS)
    output = codec.encode(MICROBATCH, made_up, LIMITS)
    forged = _made_up_weights(plan, tmp_path / "forged")
    for frame in (input_, output):
        forged.keep_frame(0, frame)
        archive.keep_frame(0, frame)
    vote, why = _vote(tmp_path, archive, forged, plan, output, input_, on_chain=True)
    assert vote == jury.WRONG, why
    assert "relative error" in why, why


def test_a_home_data_nodes_certificate_read_through_a_relay_names_replicas(
    tmp_path: Path,
) -> None:
    """A juror that cannot dial the data node reads its certificate through the nodes it
    reached, keeping the leaves that verify: their two replicas convict a cheater whose
    forwarder passes on made-up weights (with no replica it would be unverifiable)."""
    plan, _, archive = stage_with_kept_state(tmp_path / "true")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    made_up = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(9))
    input_ = codec.encode(MICROBATCH, activation, LIMITS)
    output = codec.encode(MICROBATCH, made_up, LIMITS)
    forged = _made_up_weights(plan, tmp_path / "forged")
    for frame in (input_, output):
        forged.keep_frame(0, frame)
        archive.keep_frame(0, frame)
    vote, why = _vote(
        tmp_path, archive, forged, plan, output, input_, on_chain=True, data_at_home=True
    )
    assert vote == jury.WRONG, why
    assert "relative error" in why, why


def test_replicas_certified_at_another_iteration_do_not_judge_the_hop(tmp_path: Path) -> None:
    """Nodes whose verified hops are all at another iteration are no replicas of the hop: the
    weights they serve at its iteration do not judge it."""
    plan, worker, _ = stage_with_kept_state(tmp_path / "true")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    input_ = codec.encode(MICROBATCH, activation, LIMITS)
    output = codec.encode(MICROBATCH, worker.forward(MICROBATCH, activation), LIMITS)
    forged = _made_up_weights(plan, tmp_path / "forged")
    for frame in (input_, output):
        forged.keep_frame(0, frame)
    vote, why = _vote(
        tmp_path, forged, forged, plan, output, input_, on_chain=True,
        replicas_iteration=ITERATION + 1,
    )  # fmt: skip
    assert vote == jury.RIGHT, why
    assert "unverifiable" in why, why


def test_an_auditor_takes_replicas_and_its_sample_only_from_leaves_that_verify(
    tmp_path: Path,
) -> None:
    """The auditor's replay of a certificate read directly, whose replica leaves do not verify
    against the root on chain (reported unproven by its checks), takes no replica from them:
    the honest home worker's hop is unverifiable, not a wrong tensor; and it samples only the
    leaf that verifies, though asked for every leaf served."""
    plan, worker, _ = stage_with_kept_state(tmp_path / "true")
    activation = torch.randn(2, 16, plan.config.d_model, generator=torch.Generator().manual_seed(1))
    input_ = codec.encode(MICROBATCH, activation, LIMITS)
    output = codec.encode(MICROBATCH, worker.forward(MICROBATCH, activation), LIMITS)
    forged = _made_up_weights(plan, tmp_path / "forged")
    for frame in (input_, output):
        forged.keep_frame(0, frame)
    done: list[Replayed] = []

    async def main() -> None:
        async with (
            running_host(new_identity()) as data,
            running_host(new_identity()) as data_store,
            running_host(new_identity()) as one,
            running_host(new_identity()) as two,
            running_host(new_identity()) as auditor,
        ):
            data_node = node_address_of_peer(data.get_id())
            home = peer_id_of(new_identity())
            worker = node_address_of_peer(home)
            serve_evidence(RequestResponse(data_store), forged, RUN, TIMEOUT_S)
            forwarding = RequestResponse(data)

            async def forge(_peer: str, request: bytes) -> bytes:
                inner = request[1 + request[0] :]
                to = data_store.get_id()
                return await forwarding.request(to, EVIDENCE_PROTOCOL, inner, _limits(TIMEOUT_S))

            forwarding.serve(
                EVIDENCE_VIA_PROTOCOL, forge, _forwarded_limits(TIMEOUT_S), PublicRate()
            )
            await forwarding.dialer.connect(data_store.get_id(), data_store.get_addrs())
            rpc = RequestResponse(auditor)
            sybils = {}
            for sybil in (one, two):
                serve_evidence(RequestResponse(sybil), forged, RUN, TIMEOUT_S)
                await rpc.dialer.connect(sybil.get_id(), sybil.get_addrs())
                sybils[node_address_of_peer(sybil.get_id()).lower()] = str(sybil.get_id())
            await rpc.dialer.connect(data.get_id(), data.get_addrs())
            frames = (input_, output)
            disputed = _hop(data_node, worker, MICROBATCH, frames)
            named, certified = [disputed], [disputed]
            for i, mate in enumerate(sybils):
                named.append(_hop(data_node, mate, MICROBATCH + 1 + i, frames))
                certified.append(_hop(data_node, mate, MICROBATCH + 1 + i, frames, stage=1))
            on_chain = build_certificate_tree(certified, DOMAIN)
            cert = on_chain.cert_ref(RUN, 0, data_node)
            served = build_certificate_tree(named, DOMAIN)
            # The home worker's leaf as on chain (it verifies), the sybils' as made up.
            true, made_up = (certified_page(t, 0, t.count) for t in (on_chain, served))
            picks = [
                (e, leaf) if e.receipt.worker == worker else (other, other_leaf)
                for e, leaf, other, other_leaf in zip(
                    true.entries, true.leaves, made_up.entries, made_up.leaves, strict=True
                )
            ]
            page = ReceiptPage(true.total, 0, *map(tuple, zip(*picks, strict=True)))
            fetched = Fetched((page,), None)
            source = EvidenceSource(
                rpc, sybils, RUN, TIMEOUT_S, {worker.lower(): str(home)}, [str(data.get_id())]
            )
            sampling = Sampling(served.count, Replayer(plan, SETTINGS))
            seed = b"\x07" * 32
            replayed, found = await replay_certificate(
                source, sampling, seed, cert, fetched, {data_node.lower()}, DOMAIN
            )
            # The sybils' sampled leaves, which do not verify, are unread, accusing nobody.
            (unread,) = found
            assert unread.kind == UNVERIFIED and unread.accused == "", unread
            assert "2 not asked" in unread.detail, unread.detail
            done.extend(replayed)

    run_bounded(main)
    (home_hop,) = done  # the sybils' leaves, which do not verify, are never sampled
    assert home_hop.entry.receipt.microbatchId == MICROBATCH
    assert home_hop.replay is None and home_hop.unverifiable, home_hop


def test_a_sampled_leaf_of_a_tree_served_whole_with_broken_proofs_carries_a_true_proof(
    tmp_path: Path,
) -> None:
    """A tree served whole is checked by rebuilding it, not by its leaves' proofs: a data node
    that serves them broken must not make the proof of a sampled hop one the chain refuses
    (``Disputes`` checks the leaf's proof against the root). The sampled leaf carries the
    rebuilt tree's proof."""
    plan, _, _ = stage_with_kept_state(tmp_path / "true")
    done: list[Replayed] = []
    roots: list[bytes] = []

    async def main() -> None:
        async with running_host(new_identity()) as auditor:
            data_node = node_address_of_peer(peer_id_of(new_identity()))
            worker = node_address_of_peer(peer_id_of(new_identity()))
            tree = build_certificate_tree(
                [_hop(data_node, worker, MICROBATCH + i, (b"in", b"out")) for i in range(3)],
                DOMAIN,
            )
            cert = tree.cert_ref(RUN, 0, data_node)
            roots.append(cert.root)
            page = certified_page(tree, 0, tree.count)
            broken = tuple(LeafProof(leaf.hop, (b"\x00" * 32,)) for leaf in page.leaves)
            fetched = Fetched((ReceiptPage(page.total, 0, page.entries, broken),), None)
            source = EvidenceSource(RequestResponse(auditor), {}, RUN, TIMEOUT_S, {}, [])
            sampling = Sampling(1, Replayer(plan, SETTINGS))
            replayed, found = await replay_certificate(
                source, sampling, b"\x07" * 32, cert, fetched, {data_node.lower()}, DOMAIN
            )
            assert found == []  # the tree was served whole
            done.extend(replayed)

    run_bounded(main)
    (sampled,) = done
    assert sampled.leaf is not None
    assert verify_proof(sampled.leaf.proof, roots[0], sampled.leaf.hop.leaf())
