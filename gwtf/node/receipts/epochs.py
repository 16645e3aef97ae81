"""The epoch cycle on chain: data nodes certify and submit each epoch, workers claim it.

Epochs follow chain time (``EpochClock`` reads the latest block every ``period_s``). A data node,
once an epoch is over and none of its iterations is still in it, waits ``grace_s`` for the last
reports, picks the certifiable receipts (``certify``), keeps only those whose worker and
counterparty the chain says took part, builds the certificate tree, records it and submits its
root. A worker, once an epoch has settled, asks each data node it worked for for its range of
the certificate, checks the proofs against the root on chain and claims.

Crash safety: before a transaction is sent its row is written (``pending``); on restart the
chain is asked first — a certificate or claim already mined is recorded, not sent again. A
failed RPC is retried with backoff and a one-line warning; a revert that cannot change (the
submission window closed, the claimant slashed) is recorded as failed and not retried.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

import trio
from sqlalchemy.exc import SQLAlchemyError

from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.certificate_tree import (
    CertificateTree,
    PreparedHop,
    SignedReceipt,
    WorkerRange,
    build_certificate_tree,
    tree_of_prepared,
)
from gwtf.contracts.merkle import verify_proof
from gwtf.errors import ChainError, GwtfError, ProtocolError
from gwtf.node.chain.epochs import EpochLedger, EpochTimes
from gwtf.node.chain.holds import DisputeWatch, release_expired
from gwtf.node.failpoints import failpoint
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.certify import Anchor, certifiable, check_fields
from gwtf.node.receipts.cheats import Cheat
from gwtf.node.receipts.proofs import fetch_own_proofs
from gwtf.node.receipts.reports import ReceiptInbox, request_range
from gwtf.node.store.batches import RECEIVER, BatchStore
from gwtf.node.store.hops import HopStore
from gwtf.node.store.ledger import KeptProof, LedgerRecords

log = logging.getLogger(__name__)

#: Reverts after which a transaction is never retried: they cannot turn out otherwise.
FINAL_REVERTS = {
    "SubmissionClosed", "CertificateAlreadySubmitted", "ClaimantConvicted", "ClaimPeriodOver",
    "AlreadyClaimed", "EmptyCertificate", "NotDataNode", "NotNodeWallet", "BadSpans",
    "NotWorkersRange",  # the range is not the span committed with the root
    "CertificateNotOpen",  # voided by a fraud proof
}  # fmt: skip
MAX_BACKOFF_S = 60.0
#: How long a worker waits for the proofs of one claimed range before doing without them.
PROOFS_DEADLINE_S = 120.0


@dataclass
class EpochClock:
    """Chain time: read every ``period_s`` and run on by the local clock in between (a chain's
    time follows wall time, except a devnet's that is moved on, which the next read catches).
    ``epoch_now`` is the run's epoch at that time."""

    ledger: EpochLedger
    period_s: float = 2.0
    read: int = 0  # the chain's time at the last read
    read_at: float = field(default_factory=time.monotonic)
    start: int = 0
    length: int = 1

    async def start_reading(self) -> None:
        self.start, self.length = await trio.to_thread.run_sync(self.ledger.run_start_and_length)
        await self._read()

    async def run(self) -> None:
        while True:
            await trio.sleep(self.period_s)
            try:
                await self._read()
            except (ChainError, OSError) as exc:
                log.warning("chain time not read (%s); running on from %s", exc, self.read)

    async def _read(self) -> None:
        self.read = await trio.to_thread.run_sync(self.ledger.now)
        self.read_at = time.monotonic()

    @property
    def now(self) -> int:
        return self.read + int(time.monotonic() - self.read_at)

    def epoch_now(self) -> int:
        return max(0, (self.now - self.start) // self.length) if self.length else 0


@dataclass
class Retry:
    """Backoff of one failing step: 1 s, 2 s, 4 s ... up to ``MAX_BACKOFF_S``."""

    failures: int = 0
    not_before: float = 0.0

    def ready(self) -> bool:
        return time.monotonic() >= self.not_before

    def failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        delay = min(MAX_BACKOFF_S, 2.0 ** (self.failures - 1))
        self.not_before = time.monotonic() + delay
        log.warning("%s failed (%s); retrying in %.0f s", what, exc, delay)


class BusyIn(Protocol):
    """Whether an iteration of the given epoch is under way at this data node (its certificate
    waits for it). Does not block or raise."""

    def __call__(self, epoch: int, /) -> bool: ...


class DataNodePeer(Protocol):
    """The peer id of the data node at an address, None when this node does not know it. Does
    not block or raise."""

    def __call__(self, address: str, /) -> str | None: ...


@dataclass
class CycleStatus:
    """What the cycle did, reported with the node's status."""

    certificates: dict[int, dict[str, object]] = field(default_factory=dict)
    claims: dict[str, dict[str, object]] = field(default_factory=dict)
    pending: int = 0  # epochs (data node) or claims (worker) still to do


@dataclass
class DataNodeEpochs:
    """A data node's side of the cycle. ``busy_in(epoch)`` says whether an iteration of it is
    still under way here."""

    terms: ReceiptTerms
    address: str
    ledger: EpochLedger
    clock: EpochClock
    store: HopStore
    records: LedgerRecords
    inbox: ReceiptInbox
    busy_in: BusyIn
    grace_s: float = 3.0
    #: A data node that cheats on purpose certifies and submits what its cheat makes.
    cheat: Cheat | None = None
    status: CycleStatus = field(default_factory=CycleStatus)
    done: set[int] = field(default_factory=set)
    _ended_seen: dict[int, float] = field(default_factory=dict)
    _retry: dict[int, Retry] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            await self.step()
            await trio.sleep(1.0)

    async def step(self) -> None:
        current = self.clock.epoch_now()
        todo = [e for e in range(current) if e not in self.done]
        self.status.pending = len(todo)
        for epoch in todo:
            if self.busy_in(epoch):  # the grace for the last reports starts once it is not
                self._ended_seen[epoch] = time.monotonic()
                continue
            ended = self._ended_seen.setdefault(epoch, time.monotonic())
            retry = self._retry.setdefault(epoch, Retry())
            if time.monotonic() - ended < self.grace_s or not retry.ready():
                continue
            await self.inbox.flush_anchors()
            try:
                await trio.to_thread.run_sync(self.settle, epoch)
            except ContractRevert as exc:
                if exc.name not in FINAL_REVERTS:
                    retry.failed(f"certificate of epoch {epoch}", exc)
                    continue
                log.warning("certificate of epoch %s refused for good: %s", epoch, exc)
                self._record_failure(epoch, str(exc))
                self.done.add(epoch)
            except (ChainError, OSError) as exc:
                retry.failed(f"certificate of epoch {epoch}", exc)
        self.status.pending = len([e for e in range(current) if e not in self.done])

    def settle(self, epoch: int) -> None:
        """Certify and submit ``epoch`` (blocking; idempotent across crashes)."""
        run_id = self.terms.run_id
        on_chain = self.ledger.certificate(epoch, self.address)
        record = self.records.certificate(run_id, epoch, self.address)
        if on_chain is not None:  # submitted, perhaps before a crash: the tree is in the store
            tree = build_certificate_tree(
                self.store.certified_hops(run_id, epoch), self.terms.domain
            )
            if tree.root != on_chain.root:
                raise GwtfError(f"the certificate of epoch {epoch} on chain is not this node's")
            if self.cheat is not None:
                cert = tree.cert_ref(run_id, epoch, self.address)
                tree = tree.with_spans(self.cheat.certificate(cert, tree.spans_or_raise())[1])
            if record is None or record.status != "confirmed":
                self.records.save_certificate(
                    run_id, epoch, self.address, tree.root, tree.count, tree.units, "confirmed"
                )
            self._finish(epoch, tree)
            return
        chosen = self.chosen(epoch)
        if not chosen:
            log.info("epoch %s: no receipt to certify", epoch)
            self.done.add(epoch)
            self.status.certificates[epoch] = {"count": 0, "units": 0, "status": "empty"}
            return
        times = self.ledger.epoch_times(epoch)
        if self.ledger.now() >= times.submit_closes_at:
            raise _window_closed(epoch, times)
        if self.cheat is not None:
            chosen = self.cheat.certify(chosen)
        tree = tree_of_prepared(chosen)
        entries = [(p.hop_key, p.receipt_digest, p.entry) for p in chosen]
        self.store.replace_certified(run_id, epoch, entries)
        self.records.save_certificate(
            run_id, epoch, self.address, tree.root, tree.count, tree.units, "pending"
        )
        cert, spans = tree.cert_ref(run_id, epoch, self.address), tree.spans_or_raise()
        if self.cheat is not None:
            cert, spans = self.cheat.certificate(cert, spans)
            tree = tree.with_spans(spans)  # served as committed
        tx_hash = self.ledger.submit(cert, spans)
        failpoint("epochs.after_submit")
        self.records.save_certificate(
            run_id, epoch, self.address, tree.root, tree.count, tree.units, "confirmed", tx_hash
        )
        log.info(
            "epoch %s: certified %s hops (%s units), root %s submitted in %s",
            epoch, tree.count, tree.units, tree.root.hex()[:12], tx_hash.hex()[:12],
        )  # fmt: skip
        self._finish(epoch, tree)

    def chosen(self, epoch: int) -> list[PreparedHop]:
        """The receipts this data node certifies for ``epoch``: chained to its own sends, and
        by workers and counterparties the chain says took part."""
        run_id = self.terms.run_id
        anchors = [
            Anchor(a.iteration, a.microbatch_id, a.direction, a.digest)
            for a in self.store.anchors(run_id, epoch)
        ]
        # Reported by relays, and countersigned by this node itself (held to the same rules;
        # they also mark the path it saw each microbatch through, ranked first at the cap).
        own = [
            PreparedHop.of(e, self.terms.domain)
            for e in BatchStore(self.store.db, self.terms.domain).sealed(run_id, epoch, RECEIVER)
            if _fits(e, self.terms, self.address)
        ]
        hops = self.store.reported_hops(run_id, epoch) + own
        chained = certifiable(hops, anchors, self.terms.stages)
        # The disputes contract's rule: the worker a bonded member, the counterparty a bonded
        # member or data node, during the epoch. Asked once per node.
        workers = {p.entry.receipt.worker for p in chained}
        counterparties = {p.entry.receipt.counterparty for p in chained}
        member = {node: self.ledger.took_part(node, epoch) for node in workers | counterparties}
        receiver = {
            node: member[node] or self.ledger.took_part(node, epoch, or_data_node=True)
            for node in counterparties
        }
        return [
            p
            for p in chained
            if member[p.entry.receipt.worker] and receiver[p.entry.receipt.counterparty]
        ]

    def _finish(self, epoch: int, tree: CertificateTree) -> None:
        self.inbox.trees[epoch] = tree
        self.done.add(epoch)
        self.status.certificates[epoch] = {
            "count": tree.count, "units": tree.units, "root": tree.root.hex(),
            "status": "confirmed",
        }  # fmt: skip

    def _record_failure(self, epoch: int, error: str) -> None:
        self.status.certificates[epoch] = {"status": "failed", "error": error[:200]}


def _fits(entry: SignedReceipt, terms: ReceiptTerms, data_node: str) -> bool:
    try:
        check_fields(entry, terms, data_node)
    except ProtocolError as exc:
        log.warning("own receipt of hop %s left out: %s", entry.receipt.microbatchId, exc)
        return False
    return True


def _window_closed(epoch: int, times: EpochTimes) -> ContractRevert:
    return ContractRevert("SubmissionClosed", (epoch, times.ends_at, times.submit_closes_at), b"")


@dataclass
class WorkerEpochs:
    """A worker's side: claim each settled epoch's range of each data node's certificate.
    ``data_node_peer(address)`` finds a data node's peer id."""

    terms: ReceiptTerms
    address: str
    ledger: EpochLedger
    clock: EpochClock
    store: HopStore
    records: LedgerRecords
    rpc: RequestResponse
    data_node_peer: DataNodePeer
    timeout_s: float
    status: CycleStatus = field(default_factory=CycleStatus)
    #: Claim each settled epoch unasked (``chain.auto_claim``).
    auto_claim: bool = True
    done: set[tuple[int, str]] = field(default_factory=set)
    #: (epoch, data node) pairs this node has complete receipts of: kept up by ``worked_in`` as
    #: receipts complete, and merged with its database's once (a receipt completing while that
    #: read is under way is in one or the other).
    worked: set[tuple[int, str]] = field(default_factory=set)
    _worked_loaded: bool = False
    _retry: dict[tuple[int, str], Retry] = field(default_factory=dict)
    #: One claim at a time: the cycle's and an operator's ``claim_now`` never send one twice.
    _claiming: trio.Lock = field(default_factory=trio.Lock)
    #: (epoch, data node) → (root, range): claims built whose leaves' proofs are to keep.
    proofs_due: dict[tuple[int, str], tuple[bytes, WorkerRange]] = field(default_factory=dict)
    _proofs_tried: set[tuple[int, str]] = field(default_factory=set)
    #: Chain seconds between two looks at the tensor disputes that hold this node's stake.
    release_every_s: int = 60
    _disputes: DisputeWatch | None = None
    _released_at: int | None = None

    def worked_in(self, epoch: int, data_node: str) -> None:
        self.worked.add((epoch, data_node))

    async def run(self) -> None:
        while True:
            if self.auto_claim:  # else only when asked (``claim_now``)
                await self.step()
            await self.keep_proofs()
            last = self._released_at
            if last is None or self.clock.now >= last + self.release_every_s:
                self._released_at = self.clock.now
                await self.release_graces()
            await trio.sleep(1.0)

    async def _load_worked(self) -> set[tuple[int, str]]:
        if not self._worked_loaded:
            batches = BatchStore(self.store.db, self.terms.domain)
            pairs = await trio.to_thread.run_sync(batches.worked_epochs, self.terms.run_id)
            self.worked |= set(pairs)
            self._worked_loaded = True
        return self.worked

    async def step(self) -> None:
        worked = sorted(await self._load_worked())
        todo = [pair for pair in worked if pair not in self.done]
        self.status.pending = len(todo)
        for epoch, data_node in todo:
            if self._retry.setdefault((epoch, data_node), Retry()).ready():
                await self._try_claim(epoch, data_node)
        self.status.pending = len([p for p in worked if p not in self.done])

    async def claim_now(self, epoch: int | None = None) -> list[int]:
        """Claim every unfinished (epoch, data node) of ``epoch`` (None: of every epoch) now,
        whatever the backoff says; returns the epochs tried. The operator's ``claim``."""
        worked = await self._load_worked()
        todo = [p for p in sorted(worked) if p not in self.done and epoch in (None, p[0])]
        for pair in todo:
            self._retry[pair] = Retry()
            await self._try_claim(*pair)
        return sorted({e for e, _ in todo})

    async def release_graces(self) -> list[int]:
        """Thaw this node's stake where a dispute against it was ruled without a jury and its
        grace is over (nobody else is paid to); returns the disputes released."""
        wallet = self.ledger.wallet
        if wallet is None:
            return []
        contracts = self.ledger.c
        if self._disputes is None:
            self._disputes = DisputeWatch(contracts, self.address)
        disputes = self._disputes

        def release() -> list[int]:
            return release_expired(contracts, wallet, disputes.holds())

        try:
            released = await trio.to_thread.run_sync(release)
        except (ChainError, OSError) as exc:
            log.warning("the stake's expired dispute holds were not released (%s)", exc)
            return []
        for dispute_id in released:
            log.info("dispute %s's grace is over: this node's stake it held is thawed", dispute_id)
        return released

    async def _try_claim(self, epoch: int, data_node: str) -> None:
        retry = self._retry.setdefault((epoch, data_node), Retry())
        async with self._claiming:  # the refusal too: nothing is sent for the pair meanwhile
            if (epoch, data_node) in self.done:
                return
            try:
                try:
                    await self.claim(epoch, data_node)
                except ContractRevert as exc:
                    if exc.name not in FINAL_REVERTS:
                        raise
                    await self._refused(epoch, data_node, exc)
            except (ChainError, OSError, PeerUnavailable, ProtocolError) as exc:
                retry.failed(f"claim of epoch {epoch} from {data_node}", exc)

    async def _refused(self, epoch: int, data_node: str, exc: ContractRevert) -> None:
        # An earlier send that timed out may have been mined since (``AlreadyClaimed``): the
        # chain's event, not the refusal, is then what happened.
        paid = await trio.to_thread.run_sync(self.ledger.paid, epoch, data_node, self.address)
        if paid is not None:
            await self._final(
                epoch, data_node, paid.units, "confirmed", paid.amount_wei, paid.tx_hash
            )
            return
        log.warning("claim of epoch %s from %s refused for good: %s", epoch, data_node, exc)
        # The units it claimed stay on record: what a challenge, or a slash, cost it.
        asked = await trio.to_thread.run_sync(
            self.records.claim, self.terms.run_id, epoch, data_node, self.address
        )
        units = asked.units if asked is not None else 0
        await self._final(epoch, data_node, units, "failed", error=f"{exc.name}: {exc}")

    async def claim(self, epoch: int, data_node: str) -> None:
        run_id, ledger = self.terms.run_id, self.ledger
        times = await trio.to_thread.run_sync(ledger.epoch_times, epoch)  # asked once an epoch
        if self.clock.now < times.settles_at:
            return
        paid = await trio.to_thread.run_sync(ledger.paid, epoch, data_node, self.address)
        if paid is not None:  # claimed, perhaps before a crash
            await self._final(
                epoch, data_node, paid.units, "confirmed", paid.amount_wei, paid.tx_hash
            )
            return
        cert = await trio.to_thread.run_sync(ledger.certificate, epoch, data_node)
        if cert is None:
            if self.clock.now >= times.submit_closes_at:
                await self._final(epoch, data_node, 0, "uncertified")
            return
        span = await self.fetch_range(epoch, data_node)
        if span is None:
            await self._final(epoch, data_node, 0, "not certified")
            return
        _check_range(span, cert.root, cert.rangesRoot, self.address)
        # Its leaves are in a root on chain, whatever becomes of the claim: their proofs are kept
        # once the claim is done with (``keep_proofs``).
        if (epoch, data_node) not in self._proofs_tried:
            self.proofs_due[(epoch, data_node)] = (cert.root, span)
        await trio.to_thread.run_sync(
            self.records.save_claim, run_id, epoch, data_node, self.address, span.units, "pending"
        )
        paid = await trio.to_thread.run_sync(ledger.claim, cert, span)
        failpoint("epochs.after_claim")
        log.info(
            "epoch %s: claimed %s units of %s's certificate: %s wei",
            epoch, paid.units, data_node, paid.amount_wei,
        )  # fmt: skip
        await self._final(epoch, data_node, paid.units, "confirmed", paid.amount_wei, paid.tx_hash)

    async def keep_proofs(self) -> None:
        """Keep the proofs of this node's hops in the certificates it claimed from: for its
        operator, after each claim and outside the claims' lock, each within a deadline. A
        data node that will not serve them costs the proofs, never a claim."""
        while self.proofs_due:
            (epoch, data_node), (root, span) = self.proofs_due.popitem()
            self._proofs_tried.add((epoch, data_node))  # once: a claim retried asks no more
            try:
                with trio.fail_after(PROOFS_DEADLINE_S):
                    kept = await self.fetch_proofs(epoch, data_node, root, span)
                await trio.to_thread.run_sync(
                    self.records.save_proofs, self.terms.run_id, epoch, data_node, kept
                )
            except (
                PeerUnavailable,
                ProtocolError,
                OSError,
                SQLAlchemyError,
                trio.TooSlowError,
            ) as exc:
                log.warning(
                    "epoch %s: the proofs of this node's hops in %s's certificate were not "
                    "kept: %s", epoch, data_node, exc or type(exc).__name__,
                )  # fmt: skip

    async def fetch_proofs(
        self, epoch: int, data_node: str, root: bytes, span: WorkerRange
    ) -> list[KeptProof]:
        """The checked proofs of the leaves of ``span``, asked of the data node."""
        peer = self.data_node_peer(data_node)
        if peer is None:
            raise PeerUnavailable(f"data node {data_node} is not among this node's peers")
        return await fetch_own_proofs(
            self.rpc, peer, self.terms.run_id, epoch, span, root, self.timeout_s
        )

    async def fetch_range(self, epoch: int, data_node: str) -> WorkerRange | None:
        """This node's range of ``data_node``'s certificate of ``epoch``, asked of it."""
        peer = self.data_node_peer(data_node)
        if peer is None:
            raise PeerUnavailable(f"data node {data_node} is not among this node's peers")
        return await request_range(self.rpc, peer, self.terms.run_id, epoch, self.timeout_s)

    async def _final(
        self,
        epoch: int,
        data_node: str,
        units: int,
        status: str,
        amount_wei: int = 0,
        tx_hash: bytes | None = None,
        error: str | None = None,
    ) -> None:
        await trio.to_thread.run_sync(
            self.records.save_claim, self.terms.run_id, epoch, data_node, self.address, units,
            status, amount_wei, tx_hash, error,
        )  # fmt: skip
        self.done.add((epoch, data_node))
        self.status.claims[f"{epoch}:{data_node}"] = {
            "epoch": epoch, "data_node": data_node, "units": units, "status": status,
            "amount_wei": str(amount_wei),
        }  # fmt: skip


def _check_range(span: WorkerRange, root: bytes, ranges_root: bytes, worker: str) -> None:
    """A ``ProtocolError`` unless both leaves are this worker's and in the tree of ``root``, and
    the range they bound is the worker's span in the range tree of ``ranges_root``."""
    for end in (span.first, span.last):
        if end.hop.worker != worker or not verify_proof(end.proof, root, end.hop.leaf()):
            raise ProtocolError("the data node's range does not check against its root")
    if not verify_proof(span.range_proof, ranges_root, span.range_leaf()):
        raise ProtocolError("the data node's range is not the span it committed on chain")
