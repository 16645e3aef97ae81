"""Every node's receipts, served to whoever checks them: ``/gwtf/receipts/1.0.0``.

A request names a run, an epoch, which receipts (``SIGNED``: the complete receipts of the hops
this node computed; ``RECEIVED``: those it countersigned; ``CERTIFIED``: a data node's
certificate, each leaf with its Merkle proof against the root it submitted), an offset and a
page size; the answer is one page (``ReceiptPage``, at most ``MAX_PAGE`` receipts) and the
total, in a stable order (hop key; a certificate's leaf order). Served only to peers the run
admits (the request/response layer's admission) within the layer's deadline; the database is
read in a worker thread, so a reader never holds up the node's hops.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio
from libp2p.peer.id import ID

from contracts.certificate_tree import CertificateTree
from gwtf.errors import ProtocolError
from node.p2p.rpc import Decline, RequestResponse, RpcLimits
from node.receipts.book import ReceiptTerms
from node.receipts.wire import MAX_PAGE, ReceiptPage, decode_page, encode_page
from node.store.hops import HopStore
from node.store.models import ReceivedHop, SignedHop

RECEIPTS_PROTOCOL: Final = "/gwtf/receipts/1.0.0"
SIGNED, RECEIVED, CERTIFIED = 0, 1, 2
_REQUEST = struct.Struct(">QQBIH")  # run, epoch, which, offset, page size
#: The most pages ``fetch_receipts`` reads of one answer: a peer claiming more is cut short.
MAX_PAGES: Final = 4096


@dataclass
class ReceiptServer:
    """Answers ``/gwtf/receipts/1.0.0`` from a node's database and, for a data node, from the
    certificate trees it submitted (``trees(epoch)``)."""

    store: HopStore
    terms: ReceiptTerms
    trees: Callable[[int], CertificateTree | None] = lambda epoch: None

    def serve(self, rpc: RequestResponse, timeout_s: float) -> None:
        rpc.serve(RECEIPTS_PROTOCOL, self._answer, _limits(timeout_s))

    async def _answer(self, peer: str, request: bytes) -> bytes:
        if len(request) != _REQUEST.size:
            raise ProtocolError("a receipts request is (run u64, epoch u64, which u8, offset "
                                "u32, size u16)")  # fmt: skip
        run_id, epoch, which, offset, size = _REQUEST.unpack(request)
        if run_id != self.terms.run_id:
            raise Decline(f"this node works on run {self.terms.run_id}, not {run_id}")
        size = min(size, MAX_PAGE)
        if which == CERTIFIED:
            tree = self.trees(epoch)
            if tree is None:
                raise Decline(f"no certificate of epoch {epoch} here (yet)")
            return encode_page(certified_page(tree, offset, size))
        if which not in (SIGNED, RECEIVED):
            raise ProtocolError(f"receipts of kind {which}: ask for 0, 1 or 2")
        table = SignedHop if which == SIGNED else ReceivedHop
        total, entries = await trio.to_thread.run_sync(
            self.store.page, table, run_id, epoch, offset, size
        )
        return encode_page(ReceiptPage(total, min(offset, total), tuple(entries)))


def certified_page(tree: CertificateTree, offset: int, size: int) -> ReceiptPage:
    """Leaves ``offset`` … ``offset + size`` of ``tree`` with their receipts and proofs."""
    indices = range(min(offset, tree.count), min(offset + size, tree.count))
    entries = [tree.entries[i] for i in indices]
    if any(entry is None for entry in entries):
        raise Decline("this certificate's receipts are not all held here")
    return ReceiptPage(
        tree.count,
        indices.start,
        tuple(e for e in entries if e is not None),
        tuple(tree.leaf_proof(i) for i in indices),
    )


async def fetch_receipts(
    rpc: RequestResponse, peer: str, run_id: int, epoch: int, which: int, timeout_s: float
) -> list[ReceiptPage]:
    """Every page of one kind of ``peer``'s receipts of ``epoch``, read in order (at most
    ``MAX_PAGES``). Raises ``PeerUnavailable`` or ``ProtocolError`` as the peer answers."""
    pages: list[ReceiptPage] = []
    offset = 0
    while len(pages) < MAX_PAGES:
        request = _REQUEST.pack(run_id, epoch, which, offset, MAX_PAGE)
        reply = await rpc.request(
            ID.from_base58(peer), RECEIPTS_PROTOCOL, request, _limits(timeout_s)
        )
        page = decode_page(reply)
        if page.offset != offset:
            raise ProtocolError(f"asked for receipts from {offset}, got a page from {page.offset}")
        pages.append(page)
        offset += len(page.entries)
        if not page.entries or offset >= page.total:
            break
    return pages


def _limits(timeout_s: float) -> RpcLimits:
    return RpcLimits(_REQUEST.size, 1 << 20, timeout_s)
