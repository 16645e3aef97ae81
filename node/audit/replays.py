"""Re-execution in an audit: which hops, whose evidence, and what a wrong tensor is found as.

**The sample** of a certificate is its ``k`` leaves with the smallest keccak256(seed ‖ receipt
digest), the seed being the hash of the first block at or after the epoch's submission deadline:
no node knows it while it can still change what it certifies or signs, and every auditor draws
the same sample (``sample_seed``, ``draw_sample``).

**The evidence** of a hop (``node.receipts.evidence``) is fetched by digest from whoever keeps
it: the worker, else its neighbours, who keep the same frames as their output or input. The
weights come from another replica of the worker's stage that kept its state at that iteration
(a worker's own weights could be made to fit its output); only when no other replica has them
are the worker's own used, and the finding says so.

A replay outside the tolerance is a ``wrong tensor`` finding against the worker, with the
tensor dispute that asks the run's sponsor to judge it. Evidence nobody serves is an
``unreplayed`` finding, which accuses nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import trio
from web3 import Web3

from contracts import fraud_proofs
from contracts.certificate_tree import LeafProof, SignedReceipt
from contracts.encoding import BACKWARD, FORWARD, CertRef, HopReceipt
from contracts.keccak import keccak256
from gwtf.errors import ProtocolError
from node.audit.checks import Finding
from node.audit.reexecute import HopEvidence, Replay, Replayer
from node.p2p.rpc import PeerUnavailable, RequestDeclined, RequestResponse
from node.receipts.evidence import EvidenceMissing, fetch_frame, fetch_state

log = logging.getLogger(__name__)

WRONG_TENSOR: Final = "wrong tensor"
UNREPLAYED: Final = "unreplayed"
_FETCH_ERRORS = (EvidenceMissing, ProtocolError, PeerUnavailable, RequestDeclined)


def sample_seed(w3: Web3, submit_closes_at: int) -> bytes | None:
    """The hash of the first block with a timestamp at or after ``submit_closes_at``, or None
    while the chain has none yet. Binary search: a handful of block reads."""
    latest = w3.eth.get_block("latest")
    if int(latest["timestamp"]) < submit_closes_at:
        return None
    low, high = 0, int(latest["number"])
    while low < high:
        middle = (low + high) // 2
        if int(w3.eth.get_block(middle)["timestamp"]) >= submit_closes_at:
            high = middle
        else:
            low = middle + 1
    return bytes(w3.eth.get_block(low)["hash"])


def draw_sample(
    seed: bytes, served: Sequence[tuple[SignedReceipt, LeafProof]], k: int
) -> list[tuple[SignedReceipt, LeafProof]]:
    """The ``k`` leaves of ``served`` that ``seed`` picks (distinct receipts, stable order)."""
    by_digest = {leaf.hop.receiptDigest: (entry, leaf) for entry, leaf in served}
    ranked = sorted(by_digest, key=lambda digest: keccak256(seed + digest))
    return [by_digest[digest] for digest in ranked[:k]]


@dataclass(frozen=True)
class Replayed:
    """One sampled hop: its replay, or why there is none; whose weights it ran with."""

    entry: SignedReceipt
    leaf: LeafProof | None  # None: a hop judged alone (the arbiter's), not from a tree
    replay: Replay | None
    why_not: str = ""
    weights_from: str = ""  # the node address whose kept state was used


class EvidenceSource:
    """Fetches evidence over p2p from the peers an audit reached (node address -> peer id)."""

    def __init__(
        self, rpc: RequestResponse, peers: dict[str, str], run_id: int, timeout_s: float
    ) -> None:
        self.rpc, self.peers, self.run_id, self.timeout_s = rpc, peers, run_id, timeout_s
        self._states: dict[tuple[int, int, tuple[str, ...]], tuple[bytes, str] | None] = {}
        self._silent: set[str] = set()  # peers that do not serve evidence at all

    async def frame(self, epoch: int, digest: bytes, first: Sequence[str]) -> bytes | None:
        """The frame with ``digest``: from ``first`` in order, then from the other peers."""
        found = await self._first(
            _in_order(first, self.peers),
            lambda peer: fetch_frame(self.rpc, peer, self.run_id, epoch, digest, self.timeout_s),
        )
        return found[0] if found is not None else None

    async def state(
        self, epoch: int, iteration: int, nodes: Sequence[str]
    ) -> tuple[bytes, str] | None:
        """The first of ``nodes`` to serve its stage state at ``iteration``: (file, node)."""
        key = (epoch, iteration, tuple(nodes))
        if key not in self._states:
            self._states[key] = await self._first(
                nodes,
                lambda peer: fetch_state(
                    self.rpc, peer, self.run_id, epoch, iteration, self.timeout_s
                ),
            )
        return self._states[key]

    async def _first(
        self, nodes: Sequence[str], fetch: Callable[[str], Awaitable[bytes]]
    ) -> tuple[bytes, str] | None:
        """What the first of ``nodes`` that keeps it serves, with that node; a node that fails
        otherwise than by not keeping it is asked nothing more."""
        for node in nodes:
            if node not in self.peers or node in self._silent:
                continue
            try:
                return await fetch(self.peers[node]), node
            except EvidenceMissing:
                continue
            except _FETCH_ERRORS as exc:
                log.debug("no evidence from %s: %s", node, exc)
                self._silent.add(node)
        return None


async def replay_sample(
    source: EvidenceSource,
    replayer: Replayer,
    cert_entries: Sequence[SignedReceipt],
    sample: Sequence[tuple[SignedReceipt, LeafProof | None]],
    progress: Callable[[str], None] = lambda step: None,
) -> list[Replayed]:
    """Fetch each sampled hop's evidence and re-execute it (in a worker thread)."""
    replicas = _replicas_by_stage(cert_entries)
    forwards = {
        _forward_key(e.receipt): e.receipt for e in cert_entries if e.receipt.direction == FORWARD
    }
    done = []
    for entry, leaf in sample:
        r = entry.receipt
        progress(f"re-executing microbatch {r.microbatchId} stage {r.stage} of {r.worker}")
        done.append(await _replay_one(source, replayer, entry, leaf, replicas, forwards))
    return done


async def _replay_one(
    source: EvidenceSource,
    replayer: Replayer,
    entry: SignedReceipt,
    leaf: LeafProof | None,
    replicas: dict[int, list[str]],
    forwards: dict[tuple[object, ...], HopReceipt],
) -> Replayed:
    r = entry.receipt
    worker, counterparty = r.worker.lower(), r.counterparty.lower()
    neighbours = [worker, counterparty]
    input_frame = await source.frame(r.epoch, r.inputDigest, neighbours)
    output_frame = await source.frame(r.epoch, r.outputDigest, [counterparty, worker])
    forward_input = None
    if r.direction == BACKWARD:
        forward = forwards.get(_forward_key(r))
        if forward is not None:
            forward_input = await source.frame(r.epoch, forward.inputDigest, [worker])
    others = [n for n in replicas.get(r.stage, []) if n != worker]
    state = await source.state(r.epoch, r.iteration, [*others, worker])
    missing = [
        what
        for what, got in (
            ("input", input_frame), ("output", output_frame), ("weights", state),
            ("forward input", forward_input if r.direction == BACKWARD else b""),
        )
        if got is None
    ]  # fmt: skip
    if missing or input_frame is None or output_frame is None or state is None:
        return Replayed(entry, leaf, None, f"nobody served its {', '.join(missing)}")
    evidence = HopEvidence(r, input_frame, output_frame, state[0], forward_input)
    try:
        replay = await trio.to_thread.run_sync(replayer.replay, evidence)
    except ProtocolError as exc:
        return Replayed(entry, leaf, None, f"its evidence does not replay: {exc}"[:300], state[1])
    return Replayed(entry, leaf, replay, weights_from=state[1])


def replay_findings(cert: CertRef, replayed: Sequence[Replayed]) -> list[Finding]:
    """A wrong tensor (with its dispute) for each replay outside the tolerance; unreplayed for
    each hop nobody served the evidence of."""
    findings = []
    for done in replayed:
        r = done.entry.receipt
        way = "forward" if r.direction == FORWARD else "backward"
        hop = f"{way} of microbatch {r.microbatchId} stage {r.stage} at iteration {r.iteration}"
        if done.replay is None:
            findings.append(Finding(UNREPLAYED, "", f"{hop}: {done.why_not}"))
            continue
        if not done.replay.wrong or done.leaf is None:
            continue
        own = (
            " (with its own weights: no other replica kept them)"
            if done.weights_from == r.worker.lower()
            else ""
        )
        detail = f"{hop}: {done.replay.describe()}{own}"
        proof = fraud_proofs.wrong_tensor(cert, done.leaf, done.entry)
        findings.append(Finding(WRONG_TENSOR, r.worker, detail, proof))
    return findings


def relays_of(peers: dict[str, str], data_nodes: set[str]) -> dict[str, str]:
    """``peers`` but the data nodes, which keep no evidence."""
    return {node: peer for node, peer in peers.items() if node not in data_nodes}


def _replicas_by_stage(entries: Sequence[SignedReceipt]) -> dict[int, list[str]]:
    """Each stage's workers in the certificate, most hops first."""
    counts: dict[int, dict[str, int]] = {}
    for e in entries:
        by_worker = counts.setdefault(e.receipt.stage, {})
        by_worker[e.receipt.worker.lower()] = by_worker.get(e.receipt.worker.lower(), 0) + 1
    return {stage: sorted(c, key=lambda w: -c[w]) for stage, c in counts.items()}


def _forward_key(r: HopReceipt) -> tuple[object, ...]:
    return (r.dataNode.lower(), r.iteration, r.microbatchId, r.stage, r.worker.lower())


def _in_order(first: Sequence[str], peers: dict[str, str]) -> list[str]:
    rest = [node for node in peers if node not in first]
    return [node for node in first if node in peers] + rest
