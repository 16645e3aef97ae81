"""The close of a batch between two nodes: ``/gwtf/receipts/batch-close/1.0.0``.

The worker sends a ``CloseRequest`` (``gwtf.node.receipts.batching``); the receiver answers
``0x01`` and its 65-byte countersignature, or ``0x00`` and why it refuses (the first hop it
lacks, a root it does not rebuild): a refusal is an answer, so the worker learns why. A
request that is not one is the sender's fault (the RPC layer charges it); a batch refused is
charged to its worker too, since an honest worker only closes hops its receiver acked. The
store's work (a transaction and a signature per batch) runs off the trio loop.

Like ``BatchBook``, nothing in the live data plane starts this yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.batching import MAX_BATCH_HOPS, BatchBook, CloseRequest
from gwtf.node.receipts.book import Penalise, address_of_peer
from gwtf.node.store.batches import BatchRefused

log = logging.getLogger(__name__)

CLOSE_PROTOCOL: Final = "/gwtf/receipts/batch-close/1.0.0"
_ACCEPTED, _REFUSED = b"\x01", b"\x00"
_MAX_WHY: Final = 400  # bytes of a refusal's reason


def answer_of(reply: bytes) -> tuple[bytes | None, str]:
    """A receiver's reply to a close: (its countersignature, "") or (None, why not). Its
    reason is a peer's bytes: shown quoted (``repr``, no control characters), never raw."""
    if reply[:1] == _ACCEPTED and len(reply) == 66:
        return reply[1:], ""
    if reply[:1] == _REFUSED:
        return None, f"refused: {reply[1 : 1 + _MAX_WHY].decode('utf-8', 'replace')!r}"
    return None, "its answer is not one"


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
    countersigned: int = 0
    refused: int = 0
    _warned: set[str] = field(default_factory=set)

    def serve(self) -> None:
        self.rpc.serve(CLOSE_PROTOCOL, self._close, self._limits())

    async def close_due(self, now: float, iteration_end: bool = False) -> int:
        """Close and send every batch due; the number countersigned."""
        done = 0
        for run_id, epoch, receiver in self.book.due(now, iteration_end):
            peer = self.peer_of(receiver)
            if peer is None:
                continue
            request = await trio.to_thread.run_sync(self.book.close, run_id, epoch, receiver, now)
            if request is not None:
                done += await self.send(request, peer)
        return done

    async def send(self, request: CloseRequest, peer: str) -> bool:
        """Send one close request (a new one, or one ``BatchBook.resume`` returned) to the
        receiver ``peer``; whether it came back countersigned. A timeout or a refusal stops
        and scores the receiver (``BatchBook.answered``)."""
        answer, why = None, ""
        try:
            reply = await self.rpc.request(
                ID.from_base58(peer), CLOSE_PROTOCOL, request.encode(), self._limits()
            )
            answer, why = answer_of(reply)
        except PeerUnavailable as exc:
            why = f"no answer: {exc}"
        return await trio.to_thread.run_sync(self.book.answered, request, peer, answer, why)

    async def _close(self, peer: str, data: bytes) -> bytes:
        request = CloseRequest.decode(data)  # a ProtocolError: charged by the RPC layer
        try:
            counter = await trio.to_thread.run_sync(
                self.book.countersign, request, address_of_peer(peer)
            )
        except BatchRefused as exc:
            self._refuse(peer, str(exc))
            return _REFUSED + str(exc).encode()[:_MAX_WHY]
        self.countersigned += 1
        return _ACCEPTED + counter

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        self.penalise(peer, why)
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning("peer %s: batch refused: %s (further ones are not logged)", peer, why)

    def _limits(self) -> RpcLimits:
        request = 32 * MAX_BATCH_HOPS + 256
        return RpcLimits(request, 1 + _MAX_WHY, self.book.settings.close_timeout_s)
