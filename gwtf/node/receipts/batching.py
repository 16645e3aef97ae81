"""Receipts signed in batches: one signature and one recovery per end for many hops.

A hop travels and is acked with no signature; each end commits its receipt, open, under its hop
key (``BatchBook.record``): the receiver only of hops whose worker is the authenticated peer
that sent them, so, a hop key naming its worker, no third party can plant a receipt under an
honest worker's key. The key is the node's one commitment for that hop whatever path signs it
(``HopStore.commit_once``). The worker closes its open receipts for a receiver every
``max_hops`` hops, after ``max_age_s`` seconds, or at the iteration's end (``BatchBook.due``):
it signs the ``HopBatch`` over the Merkle root of their digests in hop key order, committed with
them first (``gwtf.node.store.batches``), and sends a ``CloseRequest`` naming the hops. The
receiver rebuilds the root from its own committed receipts of those hops, checks the worker's
signature, commits the batch and answers its countersignature; it answers "not yet" naming
the hops it holds no receipt of (the close overtook them: sent again at each close) and
refuses a hop held in another scope or batch, or a root it does not rebuild. A batch still
"not yet" ``max_age_s`` after the first such answer is given up: its other hops close again in
a batch of their own, the lacking ones stay unpaid (a kept output's receipt, whose ack may have
been lost, charges nobody; any other hop its receiver acknowledged, so lacking it is
withholding). An honest pair's receipts of one hop are equal (both come from the bytes that
travelled), so a refusal means one of the two lies: the worker does not re-close a subset.
Closes of one scope run one at a time; the same close sent twice at once gets one answer.
Each receipt then travels with both batch signatures and its inclusion proof
(``ClosedBatch.sealed``), which the certificate, the audit and the disputes contract read as
they read a batch of one.

A receiver that refuses, or lacks hops it acked, withholds: the worker scores it down once per
stop and sends it no hop for the rest of the iteration, and for 2, 4, ... iterations if it
withholds again before it settled cleanly (``Withholders``); one that lets a close time out may
have crashed: stopped for the rest of the iteration, not charged, its closes sent again. No hop
goes to a receiver with more than one batch awaiting its countersignature, so each time it is
sent hops a withholder costs at most the two batches awaiting it (``max_hops`` each, or
``max_age_s`` of hops), the hops sent before its answer and the backwards held behind those
forwards, ever more rarely. Its unbatched hops are unpaid,
never slashable: nothing of them was signed.

The live node's data plane records through ``gwtf.node.receipts.recording.ReceiptBook``,
which runs this book and its closes (``gwtf.node.receipts.batch_closing``).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from gwtf.contracts.encoding import (
    Eip712Domain,
    HopBatch,
    HopReceipt,
    hop_key,
    node_address_of,
    node_public_key,
    recover_digest_signer,
    sign_digest,
)
from gwtf.errors import ProtocolError
from gwtf.node.receipts.book import Penalise
from gwtf.node.receipts.wire import MAX_BATCH_PROOF
from gwtf.node.store.batches import RECEIVER, WORKER, BatchRefused, BatchStore, ClosedBatch
from gwtf.node.store.hops import ConflictingReceipt

log = logging.getLogger(__name__)

#: Most hops one batch (and one close request: 32 bytes each) may name.
MAX_BATCH_HOPS: Final = 2**MAX_BATCH_PROOF  # so a receipt's proof in its batch fits the wire
#: Runs and epochs the database keeps (64-bit signed columns).
MAX_STORED: Final = 2**63
#: Longest a batch may stay open, in seconds.
MAX_BATCH_AGE_S: Final = 300.0


@dataclass(frozen=True)
class BatchSettings:
    """When a worker closes a batch: every ``max_hops`` hops for one receiver, or once its
    oldest open hop is ``max_age_s`` old, or at the iteration's end, whichever comes first.
    ``max_hops`` bounds what a receiver who withholds its countersignature costs; ``max_age_s``
    how long pay waits; ``close_timeout_s`` how long the worker waits for the answer."""

    max_hops: int = 256
    max_age_s: float = 10.0
    close_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_hops <= MAX_BATCH_HOPS:
            raise ValueError(f"max_hops must be 1 to {MAX_BATCH_HOPS}, not {self.max_hops}")
        if not 0 < self.max_age_s <= MAX_BATCH_AGE_S:
            raise ValueError(f"max_age_s must be in (0, {MAX_BATCH_AGE_S}], not {self.max_age_s}")
        if not 0 < self.close_timeout_s <= MAX_BATCH_AGE_S:
            raise ValueError(f"close_timeout_s must be in (0, {MAX_BATCH_AGE_S}]")

    @property
    def tick_s(self) -> float:
        """How often a node checks for batches due (``ReceiptBook.run``)."""
        return min(1.0, self.max_age_s / 2)

    @property
    def settled_within_s(self) -> float:
        """How long after its iteration's end an honest pair's receipt is countersigned at
        most, or given up: closed within ``max_age_s`` and a tick, answered within
        ``close_timeout_s``; "not yet" sent again for ``max_age_s`` and a tick, then closed
        again a tick later and answered; a backward waits for its forward's batch and closes
        a tick after it. A data node's report grace covers it (``ReceiptsConfig``): a close
        sent again past it is late, that hop unpaid (never slashable)."""
        t, tick = self.close_timeout_s, self.tick_s
        return 2 * self.max_age_s + 4 * tick + 3 * t


# ---------------------------------------------------------------- the close request

_HEAD: Final = struct.Struct(">32sQ20s20s32s65sH")


@dataclass(frozen=True)
class CloseRequest:
    """What a worker sends to close a batch: the batch, its signature and the hops it holds."""

    batch: HopBatch
    worker_signature: bytes
    hop_keys: tuple[bytes, ...]

    def encode(self) -> bytes:
        b = self.batch
        head = _HEAD.pack(
            b.runId.to_bytes(32, "big"), b.epoch, bytes.fromhex(b.worker[2:]),
            bytes.fromhex(b.counterparty[2:]), b.root, self.worker_signature, len(self.hop_keys),
        )  # fmt: skip
        return head + b"".join(self.hop_keys)

    @classmethod
    def decode(cls, data: bytes) -> CloseRequest:
        """Raises ``ProtocolError`` for a request that is not one (sizes, counts, fields)."""
        if len(data) < _HEAD.size:
            raise ProtocolError(f"a close request is at least {_HEAD.size} bytes")
        run, epoch, worker, counterparty, root, signature, count = _HEAD.unpack_from(data)
        if not 1 <= count <= MAX_BATCH_HOPS or len(data) != _HEAD.size + 32 * count:
            raise ProtocolError(f"a close request names 1 to {MAX_BATCH_HOPS} hops of 32 bytes")
        keys = tuple(data[_HEAD.size + 32 * i : _HEAD.size + 32 * (i + 1)] for i in range(count))
        run_id = int.from_bytes(run, "big")
        if run_id >= MAX_STORED or epoch >= MAX_STORED:  # refused here, not by the database
            raise ProtocolError(f"a close request's run and epoch are below 2**63 (run {run_id})")
        try:
            batch = HopBatch(
                run_id, epoch, "0x" + worker.hex(),
                "0x" + counterparty.hex(), root,
            )  # fmt: skip
        except ValueError as exc:
            raise ProtocolError(f"a close request's batch is not one: {exc}") from exc
        return cls(batch, signature, keys)


# ---------------------------------------------------------------- withholding receivers


#: Most iterations in a row a withholding receiver is sent no hops: 2**(MAX_STRIKES - 1).
MAX_STRIKES: Final = 5


@dataclass
class Withholders:
    """Receivers sent no hops now. One that withheld a countersignature (refused it, or
    lacks hops it acked) is charged and stopped for the rest of the iteration and, withholding
    again before it settled cleanly, for 2, 4, ... iterations (``MAX_STRIKES``); each
    iteration in which it countersigned and withheld nothing takes one strike off. One that did
    not answer a close (it may have crashed) is stopped for the rest of the iteration, not
    charged. One with more than one batch awaiting its countersignature (``awaiting``) is sent
    no hops until it answers them. A stop is charged once, however many closes it cut short."""

    penalise: Penalise = lambda peer, why: None
    #: Peer -> how many batches of this node's await its countersignature (set by the book).
    awaiting: Callable[[str], int] = lambda peer: 0
    _iteration: int = 0
    #: Peer -> the iteration from which it is sent hops (and closes) again.
    _until: dict[str, int] = field(default_factory=dict)
    _strikes: dict[str, int] = field(default_factory=dict)
    #: Peers that countersigned, and that withheld, in this iteration.
    _settled: set[str] = field(default_factory=set)
    _struck: set[str] = field(default_factory=set)

    def withheld(self, peer: str, why: str) -> None:
        self._struck.add(peer)
        if not self.may_close(peer):  # charged already for this stop
            return
        strikes = min(self._strikes.get(peer, 0) + 1, MAX_STRIKES)
        self._strikes[peer] = strikes
        self._until[peer] = self._iteration + 2 ** (strikes - 1)
        log.warning("peer %s withheld a batch countersignature (%s): no hops to it for %d "
                    "iteration(s)", peer, why, 2 ** (strikes - 1))  # fmt: skip
        self.penalise(peer, why)

    def unreachable(self, peer: str, why: str) -> None:
        if not self.may_close(peer):
            return
        self._until[peer] = self._iteration + 1
        log.warning("peer %s did not answer a batch close (%s): no hops to it this iteration",
                    peer, why)  # fmt: skip

    def countersigned(self, peer: str) -> None:
        self._settled.add(peer)

    def may_close(self, peer: str) -> bool:
        """Whether closes may be sent to ``peer`` (it is not stopped)."""
        return self._until.get(peer, 0) <= self._iteration

    def may_send(self, peer: str) -> bool:
        """Whether hops may be sent to ``peer``."""
        return self.may_close(peer) and self.awaiting(peer) <= 1

    def new_iteration(self) -> None:
        self._iteration += 1
        for peer in self._settled - self._struck:
            strikes = self._strikes.pop(peer, 0) - 1
            if strikes > 0:
                self._strikes[peer] = strikes
        self._settled.clear()
        self._struck.clear()
        self._until = {p: until for p, until in self._until.items() if until > self._iteration}


# ---------------------------------------------------------------- the book


@dataclass
class BatchBook:
    """One node's batched receipts: records hops, closes batches as worker, countersigns them
    as receiver. Synchronous (its store's transactions); a node runs it off its trio loop."""

    domain: Eip712Domain
    private_key: bytes = field(repr=False)
    store: BatchStore
    settings: BatchSettings = field(default_factory=BatchSettings)
    withholders: Withholders = field(default_factory=Withholders)
    #: (run, epoch, receiver address) -> (open hops, when the oldest was recorded)
    _open: dict[tuple[int, int, str], tuple[int, float]] = field(default_factory=dict)
    #: Hop key -> scope of receipts recorded but held out of every batch until ``release``
    #: (a backward, until its forward's batch is countersigned): never signed otherwise.
    _held: dict[bytes, tuple[int, int, str]] = field(default_factory=dict, repr=False)
    #: Closes of one scope run one at a time (from worker threads): each counts what it took.
    _closing: dict[tuple[int, int, str], threading.Lock] = field(default_factory=dict, repr=False)
    #: ``record`` runs in a writer thread, ``close`` in others: all count open hops under it.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Batch -> (its close request, when its receiver first answered "not yet" or did not
    #: answer, the receiver's peer id: "" until it is sent again after a restart).
    _pending: dict[HopBatch, tuple[CloseRequest, float, str]] = field(
        default_factory=dict, repr=False
    )
    #: The newest epoch of a receipt recorded here: what is older than the one before it is
    #: forgotten (``_forget``).
    _epoch: int = field(default=0, repr=False)
    #: Held receipts and close requests forgotten that way (their hops unpaid).
    forgotten: int = 0

    def __post_init__(self) -> None:
        self.address = node_address_of(node_public_key(self.private_key))
        self.withholders.awaiting = self._awaiting

    def _awaiting(self, peer: str) -> int:
        """How many of this node's batches wait for ``peer``'s countersignature (answered "not
        yet" or not at all)."""
        with self._lock:
            return sum(1 for _, _, to in self._pending.values() if to == peer)

    def record(
        self,
        receipts: list[HopReceipt],
        now: float,
        sender: str,
        held: frozenset[bytes] = frozenset(),
        kept: frozenset[bytes] = frozenset(),
    ) -> list[bool]:
        """Commit receipts of hops this node computed (worker) or received (receiver), open.
        ``sender`` is the authenticated address the received hops came from (this node's own
        for hops it computed): a received hop is recorded only if its worker is that sender. A
        hop key names its worker, so no third party can plant a receipt under another worker's
        future hop key and have that worker's close refused. Those of this node's whose hop
        key is in ``held`` join no batch until ``release`` (on disk: a restart keeps them
        out); those in ``kept`` are kept outputs' receipts, recorded before the ack that tells
        their receiver of them (``answered``)."""
        worked = [r for r in receipts if r.worker == self.address]
        received = [
            r for r in receipts if r.counterparty == self.address and r.worker != self.address
        ]
        if len(worked) + len(received) != len(receipts):
            raise ProtocolError("a node records only receipts of hops it computed or received")
        forged = [r for r in received if r.worker != sender]
        if forged:
            log.error(
                "peer %s sent %d hop(s) naming another worker (%s): not recorded",
                sender, len(forged), forged[0].worker,
            )  # fmt: skip
            received = [r for r in received if r.worker == sender]
        worked_held = frozenset(hop_key(r) for r in worked) & held
        done = self.store.record(worked, WORKER, worked_held, kept)
        recorded = dict(zip(map(id, worked), done, strict=True))
        recorded.update(zip(map(id, received), self.store.record(received, RECEIVER), strict=True))
        recorded.update((id(r), False) for r in forged)
        with self._lock:
            newest = max((r.epoch for r in worked), default=self._epoch)
            if newest > self._epoch:
                self._epoch = newest
                self._forget()
            for r in worked:
                if not recorded[id(r)]:
                    continue
                scope = (r.runId, r.epoch, r.counterparty)
                if hop_key(r) in held:
                    self._held[hop_key(r)] = scope
                else:
                    self._count(scope, now)
        return [recorded[id(r)] for r in receipts]

    def _forget(self) -> None:
        """Drop what waits in memory from epochs before the last (under ``_lock``): held
        receipts never released (a backward whose forward was withheld, a send never acked)
        and close requests never answered (a receiver that died). Their data nodes settled
        those epochs a report grace after their end (an epoch outlasts the grace), so none
        of it could be paid any more; it stays on disk, open or unanswered, never signed
        further."""
        old = self._epoch - 1
        held = [key for key, (_, epoch, _) in self._held.items() if epoch < old]
        pending = [batch for batch in self._pending if batch.epoch < old]
        for key in held:
            del self._held[key]
        for batch in pending:
            del self._pending[batch]
        for scope in [scope for scope in self._closing if scope[1] < old]:
            del self._closing[scope]
        if held or pending:
            self.forgotten += len(held) + len(pending)
            log.warning(
                "epoch %d: %d held receipt(s) never released and %d close(s) never answered "
                "of epochs before %d forgotten (unpaid)", self._epoch, len(held), len(pending),
                old,
            )  # fmt: skip

    def release(self, keys: Sequence[bytes], now: float) -> None:
        """Held receipts may join this node's next batches for their receivers (committed
        first: a close reads which are held from the store)."""
        self.store.release(keys)
        with self._lock:
            for key in keys:
                scope = self._held.pop(key, None)
                if scope is not None:
                    self._count(scope, now)

    def _count(self, scope: tuple[int, int, str], now: float) -> None:
        count, since = self._open.get(scope, (0, now))
        self._open[scope] = (count + 1, since)

    def resume(self, run_id: int, epoch: int, now: float) -> list[CloseRequest]:
        """After a restart: count the epoch's receipts still open and released (they close as
        due, from ``now``; a held one, whose receiver may lack it or whose forward is not known
        whole, stays open: unpaid, never signed) and return the close requests of batches
        signed but never countersigned, to send again as they are (``pending_requests``)."""
        with self._lock:
            for receiver, count in self.store.open_counts(run_id, epoch, self.address).items():
                self._open[(run_id, epoch, receiver)] = (count, now)
        requests = [
            CloseRequest(b.batch, b.worker_signature, b.hop_keys)
            for b in self.store.unanswered(run_id, epoch)
        ]
        with self._lock:
            for request in requests:
                self._pending.setdefault(request.batch, (request, now, ""))
        return requests

    def resume_run(self, run_id: int, now: float) -> int:
        """``resume`` every epoch of the run with receipts to close or batches to send again;
        the number of those batches."""
        return sum(
            len(self.resume(run_id, e, now)) for e in self.store.open_epochs(run_id, self.address)
        )

    def due(self, now: float, iteration_end: bool = False) -> list[tuple[int, int, str]]:
        """The (run, epoch, receiver) scopes whose batch closes now."""
        s = self.settings
        with self._lock:
            return [
                scope
                for scope, (count, since) in self._open.items()
                if iteration_end or count >= s.max_hops or now - since >= s.max_age_s
            ]

    def close(self, run_id: int, epoch: int, receiver: str, now: float) -> CloseRequest | None:
        """Close this node's next batch for ``receiver``; the request to send, or None."""
        scope = (run_id, epoch, receiver)
        with self._lock:
            closing = self._closing.setdefault(scope, threading.Lock())
        with closing:
            try:
                closed = self.store.close(
                    run_id, epoch, self.address, receiver, self.settings.max_hops, self._sign
                )
            except ConflictingReceipt as exc:  # a hop taken by another path: left as counted
                log.error("batch for %s not closed: %s", receiver, exc)
                return None
            with self._lock:
                count, _ = self._open.pop(scope, (0, now))
                left = count - (len(closed.hop_keys) if closed is not None else count)
                if left > 0:  # the rest wait for the next batch, counted from now
                    self._open[scope] = (left, now)
        if closed is None:
            return None
        return CloseRequest(closed.batch, closed.worker_signature, closed.hop_keys)

    def answered(
        self,
        request: CloseRequest,
        peer: str,
        answer: bytes | None,
        why: str,
        pending: bool = False,
        now: float = 0.0,
        unreachable: bool = False,
        lacking: tuple[bytes, ...] = (),
    ) -> bool:
        """The receiver ``peer`` answered ``request`` with ``answer`` (None: refused with
        ``why``, or timed out): keep a countersignature that checks, else stop and score it.
        ``pending``: it holds no receipt of the hops ``lacking`` yet (the close overtook
        them); the request is sent again (``pending_requests``) until ``max_age_s`` after the
        first such answer, and then given up: its other hops close again in a batch of their
        own, the lacking ones in none (``BatchStore.reopen``). So a hop its receiver never
        holds costs no other hop its pay. A kept output's receipt may be lacking through no
        one's fault (the ack that told the receiver of it was lost); any other hop was
        acknowledged by a receiver that records before it acks, so lacking it is withholding.
        ``unreachable``: no answer came (a timeout, a cut): the receiver is stopped for the
        iteration, and the request is sent again once it may be sent to (it may have crashed
        and come back)."""
        batch = request.batch
        if pending and not (lacking and set(lacking) <= set(request.hop_keys)):
            pending, why = False, "its 'not yet' names no hop of the batch"
        with self._lock:
            first = self._pending.pop(batch, (request, now, peer))[1]
        if answer is not None:
            try:
                if recover_digest_signer(batch.digest(self.domain), answer) == batch.counterparty:
                    self.store.add_countersignature(batch, answer)
                    self.withholders.countersigned(peer)
                    return True
                why = "its countersignature is not its own over the batch"
            except ProtocolError as exc:
                why = f"its countersignature does not check: {exc}"
        elif pending and now - first >= self.settings.max_age_s:
            self._give_up(request, peer, lacking, f"still {why} after {now - first:.0f} s", now)
            return False
        elif pending or unreachable:
            with self._lock:
                self._pending[batch] = (request, first, peer)
            if unreachable:  # a timeout is no proof of withholding: stopped, not charged
                self.withholders.unreachable(peer, why)
            return False
        self.withholders.withheld(peer, why)
        return False

    def _give_up(
        self, request: CloseRequest, peer: str, lacking: tuple[bytes, ...], why: str, now: float
    ) -> None:
        """``answered``: a batch its receiver still lacks hops of; its other hops close again."""
        batch = request.batch
        found = self.store.reopen(batch, lacking)
        if found is None:
            return
        reopened, all_kept = found
        log.warning(
            "batch %s: %s lacks %d of its hops after %.0f s: closing its other %d again, "
            "those unpaid", batch.root.hex(), peer, len(lacking), self.settings.max_age_s,
            reopened,
        )  # fmt: skip
        if reopened:
            with self._lock:
                scope = (batch.runId, batch.epoch, batch.counterparty)
                due = now - self.settings.max_age_s  # at once
                count, since = self._open.get(scope, (0, due))
                self._open[scope] = (count + reopened, min(since, due))
        if not all_kept:
            self.withholders.withheld(peer, why)

    def pending_requests(self) -> list[CloseRequest]:
        """Close requests a receiver answered "not yet", or did not answer: sent again at each
        ``close_due`` (to a receiver not stopped), until countersigned or refused."""
        with self._lock:
            return [request for request, _, _ in self._pending.values()]

    def is_pending(self, batch: HopBatch) -> bool:
        """Whether ``batch``'s close is to be sent again (``pending_requests``)."""
        with self._lock:
            return batch in self._pending

    def countersign(self, request: CloseRequest, sender_address: str) -> bytes:
        """Countersign a worker's close request; raises ``BatchRefused`` (why) otherwise."""
        batch = request.batch
        if batch.counterparty != self.address or batch.worker != sender_address:
            raise BatchRefused(
                f"a batch of {batch.worker} for {batch.counterparty} sent by {sender_address} "
                f"to {self.address}"
            )
        try:
            signer = recover_digest_signer(batch.digest(self.domain), request.worker_signature)
        except ProtocolError as exc:
            raise BatchRefused(f"batch signature does not check: {exc}") from exc
        if signer != batch.worker:
            raise BatchRefused("batch signature is not its worker's")
        return self.store.countersign(batch, request.hop_keys, request.worker_signature, self._sign)

    def sealed(self, run_id: int, epoch: int) -> list[ClosedBatch]:
        """This node's countersigned batches of an epoch, both roles: what it reports."""
        return self.store.batches(run_id, epoch, WORKER) + self.store.batches(
            run_id, epoch, RECEIVER
        )

    def _sign(self, digest: bytes) -> bytes:
        return sign_digest(digest, self.private_key)
