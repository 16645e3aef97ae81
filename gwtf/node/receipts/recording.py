"""A node's receipts at work (``gwtf.node.receipts.book`` says how): its data plane records,
its ``BatchBook`` closes and countersigns batches over ``BatchCloser``, and the receipts of each
countersigned batch go to ``on_complete`` (this node's work) or ``on_received`` (hops it
countersigned). Start ``run`` in the node's nursery.

Batches close on a timer (``BatchSettings.max_age_s``, ``max_hops``) and when the data plane
sees an iteration start (``iteration_started``: the previous one's batches close, and the
receivers stopped for it are sent hops again, ``Withholders``). A close its receiver
answered "not yet", or did not answer, is sent again at each later close until it is
countersigned or refused (``BatchCloser.close_due``); only then is it settled (``on_sealed``).

A received hop is recorded only under the authenticated peer it came from as its worker
(``BatchBook.record``'s sender).

A receipt recorded ``held`` joins no batch until ``release`` (a backward, until its forward's
batch is countersigned: a juror replays a backward with its forward's complete receipt). One
never released stays open: unpaid, and never signed, so nothing of it is slashable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from gwtf.contracts.encoding import HopReceipt, hop_key
from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.receipts.batch_closing import BatchCloser
from gwtf.node.receipts.batching import BatchBook, BatchSettings, CloseRequest, Withholders
from gwtf.node.receipts.book import (
    BatchSealed,
    HopFacts,
    Penalise,
    ReceiptCompleted,
    ReceiptCounts,
    ReceiptSigned,
    ReceiptTerms,
    address_of_peer,
    worker_stage,
)
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore, ClosedBatch
from gwtf.node.store.writer import BatchWriter

log = logging.getLogger(__name__)

#: Receipt to record, the authenticated address it came from (this node's own for its own
#: hops), whether it is held out of batches until released, and whether it is a kept
#: output's (``BatchBook.record``).
_Item = tuple[HopReceipt, str, bool, bool]


@dataclass
class ReceiptBook:
    """One node's recording of receipts and closing of their batches."""

    terms: ReceiptTerms
    private_key: bytes = field(repr=False)
    store: BatchStore
    #: Called with (peer, why) when a peer misbehaves: the node scores the peer down.
    penalise: Penalise = lambda peer, why: None
    #: Called with each complete receipt of this node's (the reporter takes it to the data node).
    on_complete: ReceiptCompleted = lambda origin, entry: None
    #: Called with each complete receipt this node countersigned (a relay reports it too).
    on_received: ReceiptCompleted = lambda origin, entry: None
    #: Called with each receipt this node recorded as worker: it has work to claim in that
    #: receipt's epoch.
    on_signed: ReceiptSigned = lambda receipt: None
    #: Called with the receipts of each batch this node closed, once settled: countersigned or
    #: refused (not while its close is to be sent again).
    on_sealed: BatchSealed = lambda receipts, whole: None
    settings: BatchSettings = field(default_factory=BatchSettings)
    counts: ReceiptCounts = field(default_factory=ReceiptCounts)
    #: Receivers stopped now (withholding, not answering, awaited): the router sends them none.
    withholders: Withholders = field(init=False)
    _warned: set[str] = field(default_factory=set)
    #: Node address -> the peer id it was met as (a receiver's, a data node's).
    _peers: dict[str, str] = field(default_factory=dict)
    _iteration: int = -1
    _closer: BatchCloser | None = None
    _nursery: trio.Nursery | None = None  # ``run``'s: closes and reads in the background
    #: One round of closes at a time: a close waits for the one in flight, whose countersigned
    #: forwards may release backwards for it.
    _closing: trio.Lock = field(default_factory=trio.Lock)

    def __post_init__(self) -> None:
        self.withholders = Withholders(self.penalise)
        self.batches = BatchBook(
            self.terms.domain, self.private_key, self.store, self.settings, self.withholders
        )
        self.address = self.batches.address
        self._recording: BatchWriter[_Item, bool] = BatchWriter(self._record)
        # Releases are on disk before a close may take them (a restart keeps the rest held).
        self._releasing: BatchWriter[bytes, None] = BatchWriter(self._release)

    async def run(self, rpc: RequestResponse) -> None:
        """Record in the background, answer workers' closes and close this node's batches as
        they fall due, until cancelled."""
        self._closer = BatchCloser(
            rpc, self.batches, self._peers.get, self.refuse, self._countersigned, self._settled
        )
        self._closer.serve()
        # After a restart: the open receipts released before it close as due, the batches
        # signed and never countersigned are sent again (once their receivers are met).
        resent = await trio.to_thread.run_sync(
            self.batches.resume_run, self.terms.run_id, time.monotonic()
        )
        if resent:
            log.info("%d batch(es) signed before a restart are sent again", resent)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._recording.run)
            nursery.start_soon(self._releasing.run)
            while True:
                await trio.sleep(self.settings.tick_s)
                await self.close_due()

    def is_receipted(self, direction: int, receiver_stage: int) -> bool:
        """Whether a hop into ``receiver_stage`` has a receipt: its worker is a relay."""
        return 1 <= worker_stage(direction, receiver_stage) <= self.terms.stages

    def receipt(self, hop: HopFacts) -> HopReceipt:
        """The receipt of ``hop`` under this run's terms."""
        return hop.receipt(self.terms)

    async def record(
        self,
        receipt: HopReceipt,
        peer: str,
        origin: str,
        conflicts: list[bool] | None = None,
        held: bool = False,
        kept: bool = False,
    ) -> bool:
        """Commit the receipt of a hop this node computed (sent to ``peer``) or received (from
        ``peer``), open; False when its hop key holds another receipt here (``conflicts``
        learns it: the sender re-sends the hop under a fresh attempt; a sender re-using a key
        is refused) or the database failed (the hop goes on unpaid). ``peer`` is authenticated
        (the stream's): a received hop naming another worker than it is refused. ``kept``: the
        receipt of an output this node keeps, recorded before the ack names it."""
        worker = receipt.worker == self.address
        try:
            sender = self.address if worker else address_of_peer(peer)
        except (ProtocolError, ValueError) as exc:  # not a node's peer id: nothing to pay it
            self.refuse(peer, f"hop from a peer id that names no node: {exc}")
            return False
        if not worker and receipt.worker != sender:  # the data plane builds it from ``peer``
            self.refuse(peer, f"hop {hop_key(receipt).hex()} names another worker than its sender")
            return False
        self._peers[receipt.counterparty if worker else receipt.worker] = peer
        if self._names(origin, receipt.dataNode):  # closes and reports go there
            self._peers[receipt.dataNode] = origin
        try:
            recorded = await self._recording.submit((receipt, sender, held, kept))
        except Exception as exc:  # the database's (disk full, locked): the hop goes on unpaid
            log.error("receipt of hop %s not recorded: %s", hop_key(receipt).hex(), exc)
            return False
        if not recorded:
            if worker:
                log.warning("hop %s holds another receipt here", hop_key(receipt).hex())
                if conflicts is not None:
                    conflicts.append(True)
            else:
                self.refuse(peer, f"hop key {hop_key(receipt).hex()} re-used for another hop")
            return False
        if worker:
            self.counts.signed += 1
            self.on_signed(receipt)
        else:
            self.counts.countersigned += 1
        return True

    @staticmethod
    def _names(peer: str, address: str) -> bool:
        """Whether ``peer`` is the one peer id of the node ``address`` (no other spelling)."""
        try:
            return address_of_peer(peer) == address
        except (ProtocolError, ValueError):
            return False

    def release(self, receipt: HopReceipt) -> None:
        """A receipt recorded held may join this node's next batch, once that is on disk (in
        the background; ``close_due`` waits for the releases before it)."""
        self._releasing.post(hop_key(receipt), self._released)

    def _release(self, keys: Sequence[bytes]) -> list[None]:
        self.batches.release([key for key in keys if key], time.monotonic())
        return [None] * len(keys)

    @staticmethod
    def _released(_: None, error: BaseException | None) -> None:
        if error is not None:  # the database's: the hop stays held, unpaid, never signed
            log.error("receipts not released to a batch: %s", error)

    def iteration_started(self, iteration: int) -> None:
        """The data plane met a hop of ``iteration``: a later one than before closes every
        open batch (in the background) and moves ``Withholders`` on an iteration."""
        if iteration <= self._iteration:
            return
        first = self._iteration < 0
        self._iteration = iteration
        if not first:
            self.withholders.new_iteration()
            if self._nursery is not None:
                self._nursery.start_soon(self.close_due, True)

    async def close_due(self, iteration_end: bool = False) -> int:
        """Close and send every batch due (all open ones at an iteration's end); the number
        countersigned. Backwards released by a forward's batch close in a second round."""
        done = 0
        async with self._closing:
            for _ in range(2 if iteration_end else 1):
                # After every release posted before it: the first round's countersigned
                # forwards release their backwards in the background, for the second round.
                try:
                    await self._releasing.submit(b"")
                except Exception as exc:  # the database's: the released ones close next time
                    log.error("receipts not released to a batch: %s", exc)
                done += await self._close_round(iteration_end)
        return done

    async def _close_round(self, iteration_end: bool) -> int:
        closer = self._closer
        if closer is None:
            return 0
        return await closer.close_due(time.monotonic(), iteration_end)

    async def _settled(self, request: CloseRequest, whole: bool) -> None:
        """A batch this node closed as worker is settled: its receipts to ``on_sealed`` (a
        countersigned forward releases the backwards through it), and if countersigned each
        one, sealed, to the reporter."""
        closed = await trio.to_thread.run_sync(self.store.batch, request.batch, WORKER)
        if closed is None:
            return
        self.on_sealed(closed.receipts, whole)
        if whole:
            self._hand_on(closed, worker=True)

    def _countersigned(self, request: CloseRequest) -> None:
        """A worker's batch countersigned here: its receipts go to the reporter, once read."""
        if self._nursery is not None:
            self._nursery.start_soon(self._received, request)

    async def _received(self, request: CloseRequest) -> None:
        closed = await trio.to_thread.run_sync(self.store.batch, request.batch, RECEIVER)
        if closed is not None:
            self._hand_on(closed, worker=False)

    def _hand_on(self, closed: ClosedBatch, worker: bool) -> None:
        """Each receipt of a countersigned batch, sealed, to ``on_complete`` (this node's
        work) or ``on_received`` (hops it countersigned)."""
        try:
            sealed = closed.sealed(self.terms.domain)
        except ProtocolError as exc:
            log.error("batch %s not reported: %s", closed.batch.root.hex(), exc)
            return
        for entry in sealed:
            origin = self._peers.get(entry.receipt.dataNode)
            if origin is None:
                continue
            if worker:
                self.counts.completed += 1
                self.counts.recomputed += entry.receipt.attempt > 0
                self.on_complete(origin, entry)
            else:
                self.on_received(origin, entry)

    def _record(self, items: Sequence[_Item]) -> list[bool]:
        """One writer batch: ``BatchBook.record`` takes one sender a call, so this node's own
        receipts go in one call and each peer's in one more."""
        now = time.monotonic()
        held = frozenset(hop_key(r) for r, _, hold, _ in items if hold)
        kept = frozenset(hop_key(r) for r, _, _, keep in items if keep)
        by_sender: dict[str, list[int]] = {}
        for i, (_, sender, _, _) in enumerate(items):
            by_sender.setdefault(sender, []).append(i)
        results = [False] * len(items)
        for sender, indexes in by_sender.items():
            receipts = [items[i][0] for i in indexes]
            done = self.batches.record(receipts, now, sender, held, kept)
            for i, recorded in zip(indexes, done, strict=True):
                results[i] = recorded
        return results

    def refuse(self, peer: str, why: str) -> None:
        self.counts.refused += 1
        self.penalise(peer, why)
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning("peer %s: %s (further refusals of it are not logged)", peer, why)
