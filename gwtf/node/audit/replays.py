"""Re-execution in an audit: which hops, whose evidence, and what a wrong tensor is found as.

**The sample** of a certificate is of leaf indices drawn by keccak256 from a seed, the hash of
the first block at or after the epoch's submission deadline: no node knows it while it can
still change what it certifies or signs, and every auditor draws the same sample
(``sample_seed``, ``draw_indices``). It is drawn over what the data node committed on chain
before the seed existed, its leaf count and its workers' spans, never over what it serves, so a
reading it cuts short drops no relay from the sample. It takes one index in each relay's span,
then more up to ``k`` in all: every worker is re-executed each epoch, so a relay that corrupts a
share of its hops is caught with at least that chance however many relays share the
certificate, and a conviction (the run's minimum stake and the epoch's pay) outweighs what the
skipped work saves (``gwtf/contracts/README.md``, what deters a wrong tensor).

**The evidence** of a hop (``gwtf.node.receipts.evidence``) is fetched by digest from whoever keeps
it: the worker, else its neighbours, who keep the same frames as their output or input. The
weights are the worker's own kept weights of that iteration, so no replica can frame an honest
worker by serving made-up ones; a worker that keeps none is replayed with weights two other
replicas of its stage serve identically, or not at all (``_weights``). A replica is a worker
with a hop of the stage at that iteration among the certificate's leaves that verify against
its root on chain (``replay_sample``'s entries): a data node naming its own sybils in leaves it
made up names nobody. Frames are checked by
their digest, but a state file is signed by nobody: one read through a forwarder may be
made up by it. A replay off the tolerance with forwarded weights is tried again with the
worker's weights over each other route (directly first); off with weights read from the worker
is a finding. Off only with forwarded ones, it is judged as a hop whose worker keeps no weights
is, with weights two other replicas serve identically, read from each directly; with none such
it is ``unreplayed`` as unverifiable (``Replayed.unverifiable``). A forwarder can thus make its
worker lose only where withholding the weights would have done the same (the audit README).

A replay outside the tolerance is a ``wrong tensor`` finding against the worker, with the
tensor dispute the court's drawn jurors judge (``gwtf.node.audit.jury``). Weights of the worker's
that differ from another replica's are a ``weights differ`` finding, without proof (which of
the two is off is for a person to see). Evidence nobody serves, after ``FETCH_ROUNDS`` rounds over
every route to each node that keeps it, is ``unreplayed``, accusing nobody.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import trio
from web3 import Web3

from gwtf.contracts import fraud_proofs
from gwtf.contracts.certificate_tree import LeafProof, SignedReceipt
from gwtf.contracts.encoding import (
    BACKWARD,
    FORWARD,
    CertRef,
    Eip712Domain,
    HopReceipt,
    WorkerSpan,
    recover_digest_signer,
)
from gwtf.contracts.keccak import keccak256
from gwtf.errors import ProtocolError
from gwtf.node.audit.checks import Finding
from gwtf.node.audit.reexecute import HopEvidence, Replay, Replayer
from gwtf.node.p2p.host import peer_info
from gwtf.node.p2p.identity import node_address_of_peer
from gwtf.node.p2p.rpc import PeerUnavailable, RequestDeclined, RequestResponse
from gwtf.node.receipts.evidence import EvidenceMissing, fetch_frame, fetch_state
from gwtf.node.receipts.serving import RECEIVED, SIGNED, Fetched, fetch_receipts
from gwtf.node.training.checkpoint import verified_digest
from gwtf.node.training.errors import CheckpointError

log = logging.getLogger(__name__)

WRONG_TENSOR: Final = "wrong tensor"
UNREPLAYED: Final = "unreplayed"
WEIGHTS_DIFFER: Final = "weights differ"
#: Request deadlines one frame or state file may take to fetch whole.
FETCH_DEADLINES: Final = 4
#: Rounds over a node's routes before it counts as serving no evidence, and the wait before the
#: second (doubling before each later one): a relay too busy training to answer in time, or
#: whose connection broke, answers a moment later, and a hop is not left unreplayed for that.
FETCH_ROUNDS: Final = 3
FIRST_RETRY_WAIT_S: Final = 1.0
#: What the tries that serve nothing (a first round that served nothing, every later round)
#: may take in one audit, in request timeouts, for each node (its own: a silent node, however
#: many forwarders it has, spends only its own, and a busy honest relay asked later still gets
#: its retries) and for all nodes together (so an audit stays bounded in time however many
#: nodes are silent: four silent nodes' worth). A node whose budget is spent is asked nothing
#: more.
NODE_RETRY_TIMEOUTS: Final = 6
RETRY_BUDGET_TIMEOUTS: Final = 4 * NODE_RETRY_TIMEOUTS


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
    """The leaves of ``served`` that ``seed`` picks: each worker's first-ranked one, then the
    next ranked up to ``k`` in all (distinct receipts, in rank order)."""
    by_digest = {leaf.hop.receiptDigest: (entry, leaf) for entry, leaf in served}
    ranked = sorted(by_digest, key=lambda digest: keccak256(seed + digest))
    firsts: dict[str, bytes] = {}
    for digest in ranked:
        firsts.setdefault(by_digest[digest][0].receipt.worker.lower(), digest)
    chosen = set(firsts.values())
    for digest in ranked:
        if len(chosen) >= k:
            break
        chosen.add(digest)
    return [by_digest[digest] for digest in ranked if digest in chosen]


def draw_indices(
    seed: bytes, count: int, spans: Sequence[WorkerSpan] | None, k: int, data_nodes: set[str]
) -> list[int]:
    """The leaf indices of a certificate of ``count`` leaves that ``seed`` picks, from what
    its data node committed on chain before the seed existed (the count and its workers'
    ``spans``), never from what it serves: one index in each relay's span (a data node's own
    spans are no relay's work), then indices drawn over the relays' leaves up to ``k`` in all.
    Without spans (a provider that keeps no old logs), indices over all ``count`` leaves; the
    caller takes each worker's first-ranked leaf of what it read then."""
    ranges = _relay_ranges(count, spans, data_nodes)
    chosen: dict[int, None] = {}  # in draw order, each once
    for worker, first, last in ranges:
        if worker:
            r = int.from_bytes(keccak256(seed + b"span" + bytes.fromhex(worker[2:])), "big")
            chosen.setdefault(first + r % (last - first + 1))
    sizes = [last - first + 1 for _, first, last in ranges]
    eligible = sum(sizes)
    starts = list(itertools.accumulate(sizes, initial=0))

    def index_at(position: int) -> int:
        k_ = bisect.bisect_right(starts, position) - 1
        return ranges[k_][1] + position - starts[k_]

    def rank(j: int) -> int:
        return int.from_bytes(keccak256(seed + j.to_bytes(8, "big")), "big")

    wanted = min(k, eligible)
    if 2 * wanted >= eligible:  # most of them: rank them all
        for position in sorted(range(eligible), key=rank):
            if len(chosen) >= wanted:
                break
            chosen.setdefault(index_at(position))
        return list(chosen)
    j = 0
    while len(chosen) < wanted:  # a few: draw, skipping repeats
        chosen.setdefault(index_at(rank(j) % eligible))
        j += 1
    return list(chosen)


def _relay_ranges(
    count: int, spans: Sequence[WorkerSpan] | None, data_nodes: set[str]
) -> list[tuple[str, int, int]]:
    """(worker, first, last index) of each relay's span that lies within ``count`` leaves;
    without spans, one range of all leaves and no worker."""
    if spans is None:
        return [("", 0, count - 1)] if count > 0 else []
    ranges, first = [], 0
    for span in spans:
        last = min(span.lastIndex, count - 1)
        if first <= last and span.worker.lower() not in data_nodes:
            ranges.append((span.worker.lower(), first, last))
        first = max(first, span.lastIndex + 1)
    return ranges


@dataclass(frozen=True)
class Replayed:
    """One sampled hop: its replay, or why there is none; whose weights it ran with."""

    entry: SignedReceipt
    leaf: LeafProof | None  # None: a hop judged alone (a juror's), not from a tree
    replay: Replay | None
    why_not: str = ""
    weights_from: str = ""  # whose kept weights it ran with (node addresses, "+"-joined)
    weights_differ: str = ""  # another replica whose weights differ from the worker's own
    # No replay, because it is off only with weights read through a forwarder, which are
    # signed by nobody, and no two other replicas served agreeing weights directly: what the
    # forwarder sent may be made up, so it is held against nobody.
    unverifiable: bool = False


#: What a node served: (the bytes, the node, the forwarder they came through or None).
Served = tuple[bytes, str, str | None]


class EvidenceSource:
    """Fetches evidence over p2p from the peers an audit reached (node address -> peer id),
    and from those it could not reach (``unreached``: a relay behind a NAT) through
    ``forwarders``, the peers it reached that forward evidence (``/gwtf/evidence-via/1.0.0``
    over the connections they hold)."""

    def __init__(
        self,
        rpc: RequestResponse,
        peers: dict[str, str],
        run_id: int,
        timeout_s: float,
        unreached: dict[str, str] | None = None,
        forwarders: Sequence[str] = (),
        retry_until: float | None = None,
    ) -> None:
        self.rpc, self.peers, self.run_id, self.timeout_s = rpc, peers, run_id, timeout_s
        # When (trio clock) retries stop, whatever budget is left: a juror must still commit
        # within its window what it knows by then (None: the budgets alone bound them).
        self.retry_until = retry_until
        self.unreached = unreached or {}
        self.forwarders = tuple(forwarders)
        self._states: dict[tuple[int, int, tuple[str, ...]], Served | None] = {}
        self._silent: set[str] = set()  # peers that do not serve evidence at all
        # Nodes whose retry schedule this side cut short (``retry_until`` passed, or the
        # audit's budget, spent on others, ran out): they have not shown they keep nothing,
        # so they do not count as missing their evidence (``had_full_schedule``). A node that
        # declines as busy is asked again; still busy when its schedule ends, it is missing
        # its evidence, or "busy" would be every cheater's answer.
        self._cut: set[str] = set()
        # What retries may still take: all nodes' together, and each node's own.
        self.retry_budget_s = RETRY_BUDGET_TIMEOUTS * timeout_s
        self.node_retry_budget_s: dict[str, float] = {}

    def had_full_schedule(self, node: str) -> bool:
        """Whether every try of ``node`` ran its whole schedule (all rounds and waits, or
        until its own budget was spent by its own silence, or its own busy declines): only
        then is what it did not serve missing, rather than not served in time."""
        return node.lower() not in self._cut

    def _time_left(self) -> float:
        """Seconds until ``retry_until`` (inf without it)."""
        if self.retry_until is None:
            return math.inf
        return self.retry_until - trio.current_time()

    async def frame(self, epoch: int, digest: bytes, first: Sequence[str]) -> bytes | None:
        """The frame with ``digest``: from ``first`` in order, then from the other peers."""
        found = await self._first(
            _in_order(first, {**self.unreached, **self.peers}),
            lambda peer, via: fetch_frame(
                self.rpc, peer, self.run_id, epoch, digest, self.timeout_s, via
            ),
        )
        return found[0] if found is not None else None

    async def state(self, epoch: int, iteration: int, nodes: Sequence[str]) -> Served | None:
        """The first of ``nodes`` to serve its stage state at ``iteration``: (file, node,
        the forwarder it came through or None)."""
        key = (epoch, iteration, tuple(nodes))
        if key not in self._states:
            self._states[key] = await self._first(nodes, self._state_fetch(epoch, iteration))
        return self._states[key]

    async def state_over_each_route(
        self, epoch: int, iteration: int, node: str
    ) -> list[tuple[bytes, str | None]]:
        """What each route to ``node`` (directly first, then each forwarder) serves as its
        stage state at ``iteration``, one try each: (file, forwarder or None)."""
        if node in self.peers:
            peer = self.peers[node]
            routes = [None, *(via for via in self.forwarders if via != peer)]
        elif node in self.unreached:
            peer, routes = self.unreached[node], list(self.forwarders)
        else:
            return []
        fetch = self._state_fetch(epoch, iteration)
        served = []
        for via in routes:
            try:
                found = await self._over(node, peer, [via], set(), fetch)
            except EvidenceMissing:
                continue  # directly: it keeps none; the forwarders are asked all the same
            if found is not None:
                served.append(found)
        return served

    def _state_fetch(
        self, epoch: int, iteration: int
    ) -> Callable[[str, str | None], Awaitable[bytes]]:
        return lambda peer, via: fetch_state(
            self.rpc, peer, self.run_id, epoch, iteration, self.timeout_s, via
        )

    async def receipts(self, node: str, epoch: int, which: int) -> list[SignedReceipt]:
        """``node``'s receipts of one kind (``SIGNED``, ``RECEIVED``) of ``epoch``, as far as
        it serves them: directly, or through each forwarder from a node not reached. A
        forwarder can pass on fewer than the node serves (an empty page of a total of 0 reads
        as complete), so what every forwarder passes on is kept; the signatures are the
        caller's to check."""
        if node in self.peers:
            fetched, _ = await fetch_receipts_over(
                self.rpc, self.peers[node], [None], self.run_id, epoch, which, self.timeout_s
            )
            return fetched.entries
        served: dict[SignedReceipt, None] = {}  # in order, each once
        for via in self.forwarders if node in self.unreached else ():
            fetched = await fetch_receipts(
                self.rpc, self.unreached[node], self.run_id, epoch, which, self.timeout_s, via=via
            )
            served.update(dict.fromkeys(fetched.entries))
        return list(served)

    async def _first(
        self, nodes: Sequence[str], fetch: Callable[[str, str | None], Awaitable[bytes]]
    ) -> Served | None:
        """What the first of ``nodes`` that keeps it serves, with that node and the forwarder
        it came through (None: directly); a node that serves nothing in any round
        (``_rounds``) is asked nothing more."""
        for node in nodes:
            if node in self._silent or (node not in self.peers and node not in self.unreached):
                continue
            try:
                found = await self._rounds(node, fetch)
            except EvidenceMissing:
                continue
            if found is not None:
                return found[0], node, found[1]
            self._silent.add(node)
        return None

    async def _rounds(
        self, node: str, fetch: Callable[[str, str | None], Awaitable[bytes]]
    ) -> tuple[bytes, str | None] | None:
        """``node``'s evidence over its routes: first as it was reached (directly, or through
        each forwarder when it was not), then in up to ``FETCH_ROUNDS - 1`` later rounds, after
        a wait, directly and through every forwarder, while both the node's own retry budget
        and the audit's last (a first round that served nothing is charged to them too): (what
        it served, the forwarder it came through or None); ``EvidenceMissing`` when the node
        says it keeps none (``_over``); None when no route served, or the budgets are spent."""
        if node in self.peers:
            peer = self.peers[node]
            first: list[str | None] = [None]
            later = [None, *(via for via in self.forwarders if via != peer)]
        else:
            peer = self.unreached[node]
            first = later = list(self.forwarders)
        broken: set[str | None] = set()  # routes that sent wrong bytes: not asked again
        for round_ in range(FETCH_ROUNDS):
            if round_ == 0:
                if self._time_left() <= 0:  # past the deadline: not even a first try
                    self._cut.add(node)
                    return None
                started = trio.current_time()
                try:
                    found = await self._over(node, peer, first, broken, fetch)
                except _ForwardersSayNotKept:
                    # A first try that served nothing is charged too: uncharged, a forwarder
                    # stalling every request and another saying "not kept" would cost a
                    # request timeout per request, however many, and never make the node
                    # silent. Once its budget is spent, the node is asked nothing more.
                    if self._charge(node, trio.current_time() - started) <= 0:
                        return None
                    raise
                if found is None:
                    self._charge(node, trio.current_time() - started)
            else:
                budget, own = self._left(node), self._own(node)
                # Ended by the deadline or the audit's budget rather than by its own budget,
                # the node's schedule was cut short by this side.
                cut_by_us = budget < own
                if budget <= 0:
                    if cut_by_us:
                        self._cut.add(node)
                    return None
                found = None
                started = trio.current_time()
                try:
                    with trio.move_on_after(budget) as scope:
                        await trio.sleep(FIRST_RETRY_WAIT_S * 2 ** (round_ - 1))
                        found = await self._over(node, peer, later, broken, fetch)
                finally:
                    # Charged however the round ends: a round ended by a forwarder's "not
                    # kept" (``EvidenceMissing``) took its time too.
                    self._charge(node, trio.current_time() - started)
                if scope.cancelled_caught and cut_by_us:
                    self._cut.add(node)
            if found is not None:
                return found
        return None

    def _own(self, node: str) -> float:
        """What is left of ``node``'s own retry budget."""
        return self.node_retry_budget_s.get(node, NODE_RETRY_TIMEOUTS * self.timeout_s)

    def _left(self, node: str) -> float:
        """What ``node`` may still take: the least of its own budget, the audit's and the
        time to ``retry_until``."""
        return min(self._own(node), self.retry_budget_s, self._time_left())

    def _charge(self, node: str, spent: float) -> float:
        """Charge ``spent`` seconds to ``node``'s budget and the audit's: what is left."""
        own = self.node_retry_budget_s.get(node, NODE_RETRY_TIMEOUTS * self.timeout_s)
        self.node_retry_budget_s[node] = own - spent
        self.retry_budget_s -= spent
        return self._left(node)

    async def _over(
        self,
        node: str,
        peer: str,
        routes: Sequence[str | None],
        broken: set[str | None],
        fetch: Callable[[str, str | None], Awaitable[bytes]],
    ) -> tuple[bytes, str | None] | None:
        """One try of each of ``routes`` to ``peer`` (None: directly, else a forwarder): what
        the first to serve served, and that route. ``EvidenceMissing`` when the node says it
        keeps none: directly at once, through forwarders only once no other route served (a
        forwarder's word alone must not stop the other routes, nor, as silence would, make
        the node's other evidence go unasked and the audit's retries be spent on it)."""
        forwarded_missing = False
        for via in routes:
            if via in broken:
                continue
            left = self._time_left()
            if left <= 0:  # past ``retry_until``: the routes not tried are this side's cut
                self._cut.add(node)
                break
            limit = FETCH_DEADLINES * self.timeout_s
            try:
                # A whole fetch has a deadline, not only each chunk: a peer that trickles a
                # large file cannot hold the audit (or a ruling) past its window.
                with trio.fail_after(min(limit, left)):
                    return await fetch(peer, via), via
            except trio.TooSlowError:
                log.debug("evidence from %s came too slowly (via %s)", node, via)
                if left < limit:
                    self._cut.add(node)
            except RequestDeclined as exc:
                log.debug("declined by %s (via %s): %s", node, via, exc)
            except PeerUnavailable as exc:  # timed out, refused, or unreachable
                log.debug("no answer from %s (via %s): %s", node, via, exc)
            except EvidenceMissing:
                if via is None:
                    raise  # the node's own word that it keeps none
                # A forwarder can claim anything of its target: its "not kept" is only this
                # route failing, so the other routes are still asked.
                log.debug("%s keeps none, says forwarder %s", node, via)
                forwarded_missing = True
            except ProtocolError as exc:
                log.debug("wrong evidence from %s (via %s): %s", node, via, exc)
                broken.add(via)
        if forwarded_missing:
            raise _ForwardersSayNotKept(f"{node} keeps none, say its forwarders")
        return None


class _ForwardersSayNotKept(EvidenceMissing):
    """Only forwarders said the node keeps none: a route failing, not the node's own answer."""


class Progress(Protocol):
    """Told of each step of an audit as it starts, in words (for a progress line). Must not
    block or raise."""

    def __call__(self, step: str, /) -> None: ...


async def replay_sample(
    source: EvidenceSource,
    replayer: Replayer,
    cert_entries: Sequence[SignedReceipt],
    sample: Sequence[tuple[SignedReceipt, LeafProof | None]],
    progress: Progress = lambda step: None,
) -> list[Replayed]:
    """Fetch each sampled hop's evidence and re-execute it (in a worker thread).
    ``cert_entries`` are the receipts of the certificate's leaves that verify against its root
    on chain (``runner.verified_leaves``), with a backward's signed forwards: they alone name a
    hop's forwards and its replicas, whose weights may judge it."""
    replicas = _replicas_by_hop(cert_entries)
    forwards: dict[tuple[object, ...], list[bytes]] = {}
    for e in cert_entries:
        if e.receipt.direction == FORWARD:
            digests = forwards.setdefault(_forward_key(e.receipt), [])
            if e.receipt.inputDigest not in digests:
                digests.append(e.receipt.inputDigest)
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
    replicas: dict[tuple[int, int], list[str]],
    forwards: dict[tuple[object, ...], list[bytes]],
) -> Replayed:
    r = entry.receipt
    worker, counterparty = r.worker.lower(), r.counterparty.lower()
    input_frame = await source.frame(r.epoch, r.inputDigest, [worker, counterparty])
    output_frame = await source.frame(r.epoch, r.outputDigest, [counterparty, worker])
    forward_inputs: list[bytes | None] = [None]
    if r.direction == BACKWARD:
        candidates = forwards.get(_forward_key(r), [])
        fetched = [await source.frame(r.epoch, digest, [worker]) for digest in candidates]
        forward_inputs = [frame for frame in fetched if frame is not None]
    others = [n for n in replicas.get((r.stage, r.iteration), []) if n != worker]
    weights = await _weights(source, r, worker, others)
    missing = [
        what
        for what, got in (
            ("input", input_frame), ("output", output_frame), ("weights", weights),
            ("forward input", forward_inputs or None),
        )
        if got is None
    ]  # fmt: skip
    if r.direction == BACKWARD and not forwards.get(_forward_key(r)):
        return Replayed(entry, leaf, None, "no receipt of its forward is among those served")
    if input_frame is None or output_frame is None or weights is None or not forward_inputs:
        return Replayed(entry, leaf, None, f"nobody served its {', '.join(missing)}")
    state, weights_from, differ, forwarded = weights
    frames = (input_frame, output_frame, forward_inputs)
    replay = await _replay_with(replayer, r, frames, state)
    if forwarded and not (isinstance(replay, Replay) and not replay.wrong):
        first = (state, replay)
        return await _replay_over_each_route(
            source, replayer, entry, leaf, frames, first, differ, others
        )
    if not isinstance(replay, Replay):
        return Replayed(entry, leaf, None, replay)
    return Replayed(entry, leaf, replay, weights_from=weights_from, weights_differ=differ)


async def _replay_with(
    replayer: Replayer,
    r: HopReceipt,
    frames: tuple[bytes, bytes, list[bytes | None]],
    state: bytes,
) -> Replay | str:
    """``r`` re-executed with ``state``, or why its evidence does not replay."""
    input_frame, output_frame, forward_inputs = frames
    replay: Replay | str = "no forward input to replay it from"
    # A backward the worker computed after more than one forward of the microbatch is right if
    # it follows from any of them: an honest worker is never judged on the wrong one.
    for forward_input in forward_inputs:
        evidence = HopEvidence(r, input_frame, output_frame, state, forward_input)
        try:
            replay = await trio.to_thread.run_sync(replayer.replay, evidence)
        except ProtocolError as exc:
            return f"its evidence does not replay: {exc}"[:300]
        if not replay.wrong:
            break
    return replay


async def _replay_over_each_route(
    source: EvidenceSource,
    replayer: Replayer,
    entry: SignedReceipt,
    leaf: LeafProof | None,
    frames: tuple[bytes, bytes, list[bytes | None]],
    first: tuple[bytes, Replay | str],
    differ: str,
    others: Sequence[str],
) -> Replayed:
    """``entry``'s hop, off the tolerance (or not replaying) with weights read through a
    forwarder (``first``: those weights and what they gave), replayed with the worker's
    weights over each route: right with any is right; off with those read directly is the
    worker's own. Off only with forwarded ones, it is judged with weights two of ``others``
    serve identically read directly, as a worker that keeps none is (the audit README says
    why that frames no honest worker a withholding forwarder could not frame already);
    without those it is unverifiable."""
    r = entry.receipt
    worker = r.worker.lower()
    tried = {hashlib.sha256(first[0]).digest(): first[1]}
    for state, via in await source.state_over_each_route(r.epoch, r.iteration, worker):
        key = hashlib.sha256(state).digest()
        if key not in tried:
            tried[key] = await _replay_with(replayer, r, frames, state)
        replay = tried[key]
        if isinstance(replay, Replay) and (not replay.wrong or via is None):
            # Right with any weights is right; off with the worker's own, read from it, is
            # the worker's own doing.
            return Replayed(entry, leaf, replay, weights_from=worker, weights_differ=differ)
        if via is None:
            return Replayed(entry, leaf, None, str(replay))
    # Unjudged, a home cheater would escape by having any forwarder pass on made-up weights.
    agreed = await _agreed_weights(source, r, others, directly=True)
    if agreed is not None:
        state, weights_from, _ = agreed
        key = hashlib.sha256(state).digest()
        replay = tried[key] if key in tried else await _replay_with(replayer, r, frames, state)
        if isinstance(replay, Replay):
            return Replayed(entry, leaf, replay, weights_from=weights_from, weights_differ=differ)
    why = (
        "unverifiable: its replay is off only with weights read through a forwarder, which "
        "nobody signs, and no two other replicas served the same weights directly"
    )
    return Replayed(entry, leaf, None, why, unverifiable=True)


async def _weights(
    source: EvidenceSource, r: HopReceipt, worker: str, others: Sequence[str]
) -> tuple[bytes, str, str, bool] | None:
    """The weights to replay ``r`` with, whose they are, which replica's differ (""), and
    whether any of them came through a forwarder.

    The worker's own kept weights first: a hop that is wrong even with them is wrong whatever
    anyone else serves, so no replica can frame an honest worker with made-up weights. Without
    them, weights two other replicas serve identically. With them, one other replica's are
    compared: weights that differ from the stage's are reported (a relay computing with stale
    weights replays right with its own), for a person to look at, never proven.
    """
    own = await source.state(r.epoch, r.iteration, [worker])
    if own is not None:
        other = await source.state(r.epoch, r.iteration, others)
        theirs = _sha(other[0]) if other is not None else b""
        differ = other[1] if other is not None and theirs and theirs != _sha(own[0]) else ""
        return own[0], worker, differ, own[2] is not None
    agreed = await _agreed_weights(source, r, others, directly=False)
    return None if agreed is None else (agreed[0], agreed[1], "", agreed[2])


async def _agreed_weights(
    source: EvidenceSource, r: HopReceipt, others: Sequence[str], directly: bool
) -> tuple[bytes, str, bool] | None:
    """Weights two of ``others`` serve identically at ``r``'s iteration (``directly``: only
    those read from the replica itself): (the state file, whose, "+"-joined, whether any came
    through a forwarder). A state file names its part and step, and one of another stage or
    step does not replay (``Replayer.replay``), so only the stage's weights can decide."""
    agreed: dict[bytes, list[Served]] = {}
    for node in others:
        served = await source.state(r.epoch, r.iteration, [node])
        if served is None or (directly and served[2] is not None):
            continue
        digest = _sha(served[0])
        if digest:
            agreed.setdefault(digest, []).append(served)
            if len(agreed[digest]) >= 2:
                forwarded = any(via is not None for _, _, via in agreed[digest])
                return served[0], "+".join(n for _, n, _ in agreed[digest]), forwarded
    return None


@functools.lru_cache(maxsize=16)  # the same state file serves every hop of its iteration
def _sha(blob: bytes) -> bytes:
    """Which weights a state file holds (its checked content digest; b"" if it is none)."""
    try:
        return verified_digest(blob).encode()
    except CheckpointError:
        return b""


def replay_findings(cert: CertRef, replayed: Sequence[Replayed]) -> list[Finding]:
    """A wrong tensor (with its dispute) for each replay outside the tolerance; unreplayed for
    each hop nobody served the evidence of; weights that differ from another replica's."""
    findings = []
    for done in replayed:
        r = done.entry.receipt
        way = "forward" if r.direction == FORWARD else "backward"
        hop = f"{way} of microbatch {r.microbatchId} stage {r.stage} at iteration {r.iteration}"
        if done.replay is None:
            findings.append(Finding(UNREPLAYED, "", f"{hop}: {done.why_not}"))
            continue
        if done.weights_differ:
            detail = f"{hop}: its weights differ from replica {done.weights_differ}'s"
            findings.append(Finding(WEIGHTS_DIFFER, r.worker, detail))
        if not done.replay.wrong or done.leaf is None:
            continue
        detail = f"{hop}: {done.replay.describe()} (weights of {done.weights_from})"
        proof = fraud_proofs.wrong_tensor(cert, done.leaf, done.entry)
        findings.append(Finding(WRONG_TENSOR, r.worker, detail, proof))
    return findings


async def fetch_receipts_over(
    rpc: RequestResponse,
    peer: str,
    routes: Sequence[str | None],
    run_id: int,
    epoch: int,
    which: int,
    timeout_s: float,
) -> tuple[Fetched, str | None]:
    """One kind of ``peer``'s receipts of ``epoch`` over the first of ``routes`` that serves
    any (None: directly; else the peer id of a node that forwards them), and that route; when
    none does, why the last one did not. A forwarder not connected to ``peer`` declines at once."""
    fetched, via = Fetched((), "no node to read them through"), None
    for via in routes:
        fetched = await fetch_receipts(rpc, peer, run_id, epoch, which, timeout_s, via=via)
        if fetched.pages or fetched.stopped is None:
            break
    return fetched, via


def unreached_of(peers: Sequence[str], reachable: dict[str, str]) -> dict[str, str]:
    """The nodes among ``peers`` (multiaddrs) not in ``reachable``: node address -> peer id."""
    unreached: dict[str, str] = {}
    for address in peers:
        info = peer_info(address)
        node = node_address_of_peer(info.peer_id).lower()
        if node not in reachable:
            unreached[node] = str(info.peer_id)
    return unreached


def forwarders_of(reachable: dict[str, str], data_nodes: set[str]) -> list[str]:
    """The peer ids of the nodes reached, data nodes first: those an audit asks to forward its
    requests to the nodes it could not reach (a relay at home keeps its data nodes connected)."""
    return [reachable[node] for node in sorted(reachable, key=lambda n: n not in data_nodes)]


def evidence_source(
    rpc: RequestResponse,
    peers: Sequence[str],
    reachable: dict[str, str],
    data_nodes: set[str],
    run_id: int,
    timeout_s: float,
    retry_until: float | None = None,
) -> EvidenceSource:
    """The evidence of the relays among ``peers`` (multiaddrs): directly from those reached,
    through the reached nodes (data nodes first) from those not (behind a NAT); no retry after
    ``retry_until`` (trio clock)."""
    return EvidenceSource(
        rpc,
        relays_of(reachable, data_nodes),
        run_id,
        timeout_s,
        relays_of(unreached_of(peers, reachable), data_nodes),
        forwarders_of(reachable, data_nodes),
        retry_until,
    )


def relays_of(peers: dict[str, str], data_nodes: set[str]) -> dict[str, str]:
    """``peers`` but the data nodes, which keep no evidence."""
    return {node: peer for node, peer in peers.items() if node not in data_nodes}


def _replicas_by_hop(entries: Sequence[SignedReceipt]) -> dict[tuple[int, int], list[str]]:
    """The workers of each (stage, iteration) among ``entries`` (verified leaves), most hops
    first: a replica counts only where the certificate holds a hop of its at that iteration."""
    counts: dict[tuple[int, int], dict[str, int]] = {}
    for e in entries:
        by_worker = counts.setdefault((e.receipt.stage, e.receipt.iteration), {})
        by_worker[e.receipt.worker.lower()] = by_worker.get(e.receipt.worker.lower(), 0) + 1
    return {key: sorted(c, key=lambda w: -c[w]) for key, c in counts.items()}


async def forwards_of(
    source: EvidenceSource, backward: HopReceipt, domain: Eip712Domain
) -> list[SignedReceipt]:
    """The receipts of ``backward``'s forward that its worker (``SIGNED``) and its counterparty
    (``RECEIVED``) serve, each signed by the backward's worker and countersigned
    (``is_forward_of``): what a juror re-executes a backward with when the data node serves
    no certificate."""
    worker, counterparty = backward.worker.lower(), backward.counterparty.lower()
    served = await source.receipts(worker, backward.epoch, SIGNED)
    served += await source.receipts(counterparty, backward.epoch, RECEIVED)
    return [e for e in served if is_forward_of(e, backward, domain)]


async def with_served_forwards(
    source: EvidenceSource,
    entries: Sequence[SignedReceipt],
    sampled: Sequence[SignedReceipt],
    domain: Eip712Domain,
) -> list[SignedReceipt]:
    """``entries`` and, for each sampled backward whose forward none of them is (the data
    node cut its reading inside the worker's span, say), the forwards its worker and its
    counterparty serve, signed and countersigned (``forwards_of``), as a juror fetches them:
    a data node cannot hide a colluder's backward from re-execution by not serving its
    forward."""
    have = {_forward_key(e.receipt) for e in entries if e.receipt.direction == FORWARD}
    found = list(entries)
    for entry in sampled:
        r = entry.receipt
        if r.direction == BACKWARD and _forward_key(r) not in have:
            found += await forwards_of(source, r, domain)
            have.add(_forward_key(r))
    return found


def is_forward_of(entry: SignedReceipt, backward: HopReceipt, domain: Eip712Domain) -> bool:
    """Whether ``entry`` is a forward of ``backward``'s microbatch, stage and iteration by the
    same worker in the same run and epoch, signed by that worker and countersigned by its own
    counterparty: nobody else (not the data node, not a neighbour) can make up the forward
    input a backward is re-executed with."""
    f = entry.receipt
    if f.direction != FORWARD or (f.runId, f.epoch) != (backward.runId, backward.epoch):
        return False
    if _forward_key(f) != _forward_key(backward) or f.counterparty.lower() == f.worker.lower():
        return False
    digest = entry.signing_digest(domain)
    return (
        _signer(digest, entry.worker_signature) == f.worker.lower()
        and _signer(digest, entry.counterparty_signature) == f.counterparty.lower()
    )


def without_unsigned_forwards(
    entries: Sequence[SignedReceipt], backward: HopReceipt, domain: Eip712Domain
) -> list[SignedReceipt]:
    """``entries`` but those that pass for ``backward``'s forward without being one
    (``is_forward_of``): a data node cannot make a backward replay from another input."""
    key = _forward_key(backward)
    return [
        e
        for e in entries
        if e.receipt.direction != FORWARD
        or _forward_key(e.receipt) != key
        or is_forward_of(e, backward, domain)
    ]


def _signer(digest: bytes, signature: bytes) -> str:
    try:
        return recover_digest_signer(digest, signature).lower()
    except ProtocolError:
        return ""


def _forward_key(r: HopReceipt) -> tuple[object, ...]:
    return (r.dataNode.lower(), r.iteration, r.microbatchId, r.stage, r.worker.lower())


def _in_order(first: Sequence[str], peers: dict[str, str]) -> list[str]:
    rest = [node for node in peers if node not in first]
    return [node for node in first if node in peers] + rest
