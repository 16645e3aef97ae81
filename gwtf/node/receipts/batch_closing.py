"""The close of a batch between two nodes: ``/gwtf/receipts/batch-close/3.0.0``.

The worker sends a ``CloseRequest`` (``gwtf.node.receipts.batching``); the receiver answers
``0x01`` and its 65-byte countersignature, ``0x02``, a u16 count and the keys of the hops it
holds no receipt of yet (read 1,000 at a time in hop key order, no further than 1,000 most of
which it lacks: made-up keys cost one such read), then why (the close overtook them: sent
again at each ``close_due``; still so after ``max_age_s``, the batch is closed again without
them, ``BatchBook.answered``; a close not answered at all is sent again too, once its receiver
is no longer stopped), or ``0x00`` and why it refuses (a hop it holds in another scope or
batch, a root it does not rebuild): a refusal is an answer, so the worker learns why. A request
that is not one is the sender's fault (the RPC layer charges it); a batch refused is charged to
its worker too, since an honest worker only closes hops its receiver acked. A worker gets at
most ``MAX_NOT_YET`` "not yet" answers per ``max_age_s`` (closes of made-up hops are charged to
nobody); its further closes in that window are declined unread, uncharged, and sent again
later. The store's work (a transaction and a signature per batch) runs off the trio loop.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.batching import MAX_BATCH_HOPS, BatchBook, CloseRequest
from gwtf.node.receipts.book import Penalise, address_of_peer
from gwtf.node.store.batches import BatchPending, BatchRefused

log = logging.getLogger(__name__)

CLOSE_PROTOCOL: Final = "/gwtf/receipts/batch-close/3.0.0"
_ACCEPTED, _REFUSED, _PENDING = b"\x01", b"\x00", b"\x02"
#: Close requests in flight at once from one node.
MAX_CONCURRENT_CLOSES: Final = 8
#: "Not yet" answers one worker gets per ``max_age_s``; past them its closes are declined
#: (uncharged: sent again later) until the window ends. An honest worker sends each close it
#: was answered so again once a tick, a few at a time.
MAX_NOT_YET: Final = 64
_MAX_WHY: Final = 400  # bytes of a refusal's reason
_MAX_WORKERS: Final = 1024  # workers' "not yet" windows kept before the ended ones are dropped
_COUNT: Final = struct.Struct(">H")


class Answer(NamedTuple):
    """A receiver's reply to a close: its countersignature, or why not and, for "not yet",
    the hops it lacks."""

    countersignature: bytes | None
    why: str = ""
    pending: bool = False
    lacking: tuple[bytes, ...] = ()


def answer_of(reply: bytes) -> Answer:
    """A receiver's reply to a close. Its reason is a peer's bytes: shown quoted (``repr``, no
    control characters), never raw."""
    if reply[:1] == _ACCEPTED and len(reply) == 66:
        return Answer(reply[1:])
    if reply[:1] == _PENDING and len(reply) >= 3:
        (count,) = _COUNT.unpack_from(reply, 1)
        end = 3 + 32 * count
        if 1 <= count <= MAX_BATCH_HOPS and len(reply) >= end:
            lacking = tuple(reply[i : i + 32] for i in range(3, end, 32))
            why = repr(reply[end : end + _MAX_WHY].decode("utf-8", "replace"))
            return Answer(None, f"not yet: {why}", True, lacking)
    if reply[:1] == _REFUSED:
        return Answer(None, f"refused: {reply[1 : 1 + _MAX_WHY].decode('utf-8', 'replace')!r}")
    return Answer(None, "its answer is not one")


def pending_reply(lacking: tuple[bytes, ...], why: str) -> bytes:
    """The "not yet" answer naming the hops ``lacking`` (at most ``MAX_BATCH_HOPS``)."""
    return _PENDING + _COUNT.pack(len(lacking)) + b"".join(lacking) + why.encode()[:_MAX_WHY]


@dataclass
class BatchCloser:
    """Closes this node's due batches with their receivers and answers its workers' closes.
    ``serve`` it; call ``close_due`` as batches fall due (a timer, an iteration's end)."""

    rpc: RequestResponse
    book: BatchBook
    #: The peer id of a receiver's address (None: not reachable now; its batch waits).
    peer_of: Callable[[str], str | None]
    #: Charged for a batch refused by this node as receiver.
    penalise: Penalise = lambda peer, why: None
    #: Told of each batch this node countersigned (after its commit, before the answer).
    on_countersigned: Callable[[CloseRequest], None] = lambda request: None
    #: Told of each batch this node closed once its close is settled: countersigned (True), or
    #: refused or badly countersigned (False). Not while it is to be sent again ("not yet",
    #: no answer): a later answer may still countersign it.
    on_settled: Callable[[CloseRequest, bool], Awaitable[None]] | None = None
    countersigned: int = 0
    refused: int = 0
    #: Closes declined because their worker had its "not yet" answers of the window.
    throttled: int = 0
    _warned: set[str] = field(default_factory=set)
    #: Worker peer -> (when its window began, "not yet" answers it got in it).
    _not_yet: dict[str, tuple[float, int]] = field(default_factory=dict)

    def serve(self) -> None:
        self.rpc.serve(CLOSE_PROTOCOL, self._close, self._limits())

    async def close_due(self, now: float, iteration_end: bool = False) -> int:
        """Close and send every batch due, and send again those a receiver answered "not
        yet", at most ``MAX_CONCURRENT_CLOSES`` at once; a receiver stopped now
        (``Withholders.may_close``) or unreachable is skipped (its hops wait). ``now`` is the book's
        clock. The number countersigned."""
        done = 0
        limiter = trio.CapacityLimiter(MAX_CONCURRENT_CLOSES)

        # Each checks its receiver again once it has a slot: one that timed out meanwhile
        # (stopped) costs no further timeouts of its other batches this round.
        async def resend(request: CloseRequest, peer: str) -> None:
            nonlocal done
            async with limiter:
                if not self.book.withholders.may_close(peer):
                    return
                countersigned = await self.send(request, peer, now)
            done += countersigned  # after the await: another task may have counted meanwhile

        async def close(run_id: int, epoch: int, receiver: str, peer: str) -> None:
            nonlocal done
            async with limiter:
                if not self.book.withholders.may_close(peer):
                    return
                request = await trio.to_thread.run_sync(
                    self.book.close, run_id, epoch, receiver, now
                )
                countersigned = request is not None and await self.send(request, peer, now)
            done += countersigned

        async with trio.open_nursery() as nursery:
            for request in self.book.pending_requests():
                peer = self._reachable(request.batch.counterparty)
                if peer is not None:
                    nursery.start_soon(resend, request, peer)
            for run_id, epoch, receiver in self.book.due(now, iteration_end):
                peer = self._reachable(receiver)
                if peer is not None:
                    nursery.start_soon(close, run_id, epoch, receiver, peer)
        return done

    async def send(self, request: CloseRequest, peer: str, now: float | None = None) -> bool:
        """Send one close request (a new one, or one ``BatchBook.resume`` returned) to the
        receiver ``peer``; whether it came back countersigned. A timeout or a refusal stops
        and scores the receiver (``BatchBook.answered``); "not yet" keeps it to send again.
        ``now``: the book's clock (default ``time.monotonic()``)."""
        answer, unreachable = Answer(None), False
        try:
            reply = await self.rpc.request(
                ID.from_base58(peer), CLOSE_PROTOCOL, request.encode(), self._limits()
            )
            answer = answer_of(reply)
        except PeerUnavailable as exc:
            answer, unreachable = Answer(None, f"no answer: {exc}"), True
        at = time.monotonic() if now is None else now
        whole = await trio.to_thread.run_sync(
            self.book.answered, request, peer, answer.countersignature, answer.why,
            answer.pending, at, unreachable, answer.lacking,
        )  # fmt: skip
        if self.on_settled is not None and (whole or not self.book.is_pending(request.batch)):
            await self.on_settled(request, whole)
        return whole

    def _reachable(self, receiver: str) -> str | None:
        peer = self.peer_of(receiver)
        return peer if peer is not None and self.book.withholders.may_close(peer) else None

    async def _close(self, peer: str, data: bytes) -> bytes:
        request = CloseRequest.decode(data)  # a ProtocolError: charged by the RPC layer
        now = time.monotonic()
        window = self.book.settings.max_age_s
        began, count = self._not_yet.get(peer, (now, 0))
        if now - began >= window:
            began, count = now, 0
        if count >= MAX_NOT_YET:  # made-up hops cost a signature check and a read each
            self.throttled += 1
            raise Decline(f"{count} closes answered 'not yet' in {window:.0f} s: send it later")
        try:
            counter = await trio.to_thread.run_sync(
                self.book.countersign, request, address_of_peer(peer)
            )
        except BatchPending as exc:  # the close overtook a hop: not the worker's fault
            self._not_yet[peer] = (began, count + 1)
            if len(self._not_yet) > _MAX_WORKERS:
                self._not_yet = {
                    p: (b, c) for p, (b, c) in self._not_yet.items() if now - b < window
                }
            return pending_reply(exc.lacking, str(exc))
        except BatchRefused as exc:
            self._refuse(peer, str(exc))
            return _REFUSED + str(exc).encode()[:_MAX_WHY]
        self.countersigned += 1
        self.on_countersigned(request)
        return _ACCEPTED + counter

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        self.penalise(peer, why)
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning("peer %s: batch refused: %s (further ones are not logged)", peer, why)

    def _limits(self) -> RpcLimits:
        request = 32 * MAX_BATCH_HOPS + 256
        reply = 1 + _COUNT.size + 32 * MAX_BATCH_HOPS + _MAX_WHY
        return RpcLimits(request, reply, self.book.settings.close_timeout_s)
