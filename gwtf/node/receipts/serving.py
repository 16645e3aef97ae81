"""Every node's receipts, served to whoever checks them: ``/gwtf/receipts/3.0.0``.

A request names a run, an epoch, which receipts (``SIGNED``: the complete receipts of the hops
this node computed; ``RECEIVED``: those it countersigned; ``CERTIFIED``: a data node's
certificate, each leaf with its Merkle proof against the root it submitted), an offset and a
page size; the answer is one page (``ReceiptPage``, at most ``MAX_PAGE`` receipts) and the
total, in a stable order (hop key; a certificate's leaf order); every page but the last is
full, and a reader ends a reading at a short one (a certificate read directly ends whole, the
leaves left out withheld by its data node). The spans a data node committed with a root
are not served: they are in the ledger's ``CertificatesSubmitted`` event. Anyone may
audit: peers the run admits are answered freely, any other peer within one shared rate
(``PUBLIC_RATE``), each within the layer's deadline; the database is read in a worker thread, so
a reader never holds up the node's hops. A node behind a NAT, which a reader cannot dial, is
read through a node it keeps a connection to: every node forwards ``/gwtf/receipts-via/3.0.0``
to its connected peers (``gwtf.node.p2p.forwarding``; the receipts are signed, so a forwarder
can withhold them but never forge one).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, Protocol

import trio
from libp2p.peer.id import ID

from gwtf.contracts.certificate_tree import CertificateTree, SignedReceipt
from gwtf.errors import ProtocolError
from gwtf.node.p2p.forwarding import forwarded, forwarded_limits, serve_forwarding
from gwtf.node.p2p.rpc import (
    Decline,
    PeerUnavailable,
    PublicRate,
    RequestDeclined,
    RequestResponse,
    RpcLimits,
    Seats,
)
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.cheats import Cheat
from gwtf.node.receipts.wire import (
    MAX_PAGE,
    MAX_PAGE_BYTES,
    ReceiptPage,
    decode_page,
    encode_page,
)
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore

RECEIPTS_PROTOCOL: Final = "/gwtf/receipts/3.0.0"
RECEIPTS_VIA_PROTOCOL: Final = "/gwtf/receipts-via/3.0.0"
SIGNED, RECEIVED, CERTIFIED = 0, 1, 2
_REQUEST = struct.Struct(">QQBIH")  # run, epoch, which, offset, page size
#: Requests per second, and burst, answered to all peers outside the run together.
PUBLIC_RATE: Final = (10.0, 20.0)
#: The most receipts ``fetch_receipts`` reads of one kind from one peer, unless told fewer (a
#: certificate's count): a peer claiming more is cut short.
MAX_FETCH: Final = 200_000
#: How often a page declined as busy is asked again (after 0.5, 1, 2, 4, 8, 8 ... s).
MAX_BUSY_RETRIES: Final = 8


class TreeOf(Protocol):
    """The certificate tree this data node submitted for an epoch, None when it has none. Does
    not block or raise."""

    def __call__(self, epoch: int, /) -> CertificateTree | None: ...


@dataclass
class ReceiptServer:
    """Answers ``/gwtf/receipts/3.0.0`` from a node's database and, for a data node, from the
    certificate trees it submitted (``trees(epoch)``)."""

    store: BatchStore
    terms: ReceiptTerms
    trees: TreeOf = lambda epoch: None
    #: A node that cheats on purpose serves what its cheat makes of its pages (``cheats``).
    cheat: Cheat | None = None

    def serve(
        self, rpc: RequestResponse, timeout_s: float, public: PublicRate | None = None
    ) -> None:
        rate = public or PublicRate(*PUBLIC_RATE)
        rpc.serve(RECEIPTS_PROTOCOL, self._answer, _limits(timeout_s), rate)

    async def _answer(self, peer: str, request: bytes) -> bytes:
        _checked(request)
        run_id, epoch, which, offset, size = _REQUEST.unpack(request)
        if run_id != self.terms.run_id:
            raise Decline(f"this node works on run {self.terms.run_id}, not {run_id}")
        size = min(size, MAX_PAGE)
        if which == CERTIFIED:
            tree = self.trees(epoch)
            if tree is None:
                raise Decline(f"no certificate of epoch {epoch} here (yet)")
            page = certified_page(tree, offset, size)
            return encode_page(self.cheat.certified_page(page) if self.cheat else page)
        role = WORKER if which == SIGNED else RECEIVER
        total, entries = await trio.to_thread.run_sync(
            self.store.page, role, run_id, epoch, offset, size
        )
        page = ReceiptPage(total, min(offset, total), tuple(entries))
        return encode_page(self.cheat.served(epoch, which, page) if self.cheat else page)


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


@dataclass(frozen=True)
class Fetched:
    """The pages read of one kind of a peer's receipts, in order, and why the reading stopped
    short (None: it did not)."""

    pages: tuple[ReceiptPage, ...]
    stopped: str | None = None

    @property
    def entries(self) -> list[SignedReceipt]:
        return [entry for page in self.pages for entry in page.entries]


async def fetch_receipts(
    rpc: RequestResponse,
    peer: str,
    run_id: int,
    epoch: int,
    which: int,
    timeout_s: float,
    limit: int = MAX_FETCH,
    start: int = 0,
    via: str | None = None,
) -> Fetched:
    """The pages of one kind of ``peer``'s receipts of ``epoch``, in order, from the
    ``start``-th, up to ``limit`` receipts; through the peer ``via`` when given
    (``/gwtf/receipts-via/3.0.0``). A page declined as busy (the public rate) is asked
    again after a backoff; any other failure ends the reading, and what was read before it is
    kept. A page shorter than asked that is not the last ends the reading too: an honest node
    fills every page but the last. Read through a forwarder, or of signed or countersigned
    receipts, that is a failed reading (``stopped``); a certificate's page read directly is
    kept, and the reading ends whole, so the leaves the data node left out are its own."""
    pages: list[ReceiptPage] = []
    offset, busy = start, 0
    end = start + limit
    if via is None:
        to, protocol, limits = peer, RECEIPTS_PROTOCOL, _limits(timeout_s)
    else:
        inner = _limits(timeout_s)
        to, protocol = via, RECEIPTS_VIA_PROTOCOL
        limits = forwarded_limits(inner.max_request_bytes, inner.max_response_bytes, timeout_s)
    while offset < end:
        asked = min(MAX_PAGE, end - offset)
        request = _REQUEST.pack(run_id, epoch, which, offset, asked)
        if via is not None:
            request = forwarded(peer, request)
        try:
            reply = await rpc.request(ID.from_base58(to), protocol, request, limits)
            page = decode_page(reply)
            if page.offset != offset:
                raise ProtocolError(
                    f"asked for receipts from {offset}, got a page from {page.offset}"
                )
            if which == CERTIFIED and len(page.leaves) != len(page.entries):
                raise ProtocolError("a page of a certificate without each receipt's leaf")
            if len(page.entries) < asked and offset + len(page.entries) < page.total:
                # An honest node fills every page but the last: one that drips a few
                # receipts a page would make the reading take a request per receipt.
                if via is None and which == CERTIFIED:
                    # Read directly, the short page is the data node's own withholding: the
                    # reading ends whole, and the leaves it left out count against it.
                    pages.append(page)
                    return Fetched(tuple(pages))
                raise ProtocolError(
                    f"a page of {len(page.entries)} receipts from {offset} of {page.total}, "
                    f"where {asked} were asked"
                )
        except RequestDeclined as exc:
            if "busy" in str(exc) and busy < MAX_BUSY_RETRIES:
                await trio.sleep(min(8.0, 0.5 * 2**busy))
                busy += 1
                continue
            return Fetched(tuple(pages), str(exc))
        except (PeerUnavailable, ProtocolError) as exc:
            return Fetched(tuple(pages), str(exc))
        busy = 0
        pages.append(page)
        offset += len(page.entries)
        if not page.entries or offset >= page.total:
            return Fetched(tuple(pages))
    return Fetched(tuple(pages), f"stopped at {limit} receipts")


def serve_receipts_forwarding(
    rpc: RequestResponse, timeout_s: float, seats: Seats | None = None
) -> None:
    """Forward ``/gwtf/receipts-via/3.0.0`` requests to connected peers (see the module);
    outsiders ``seats`` holds (seated jurors) within rates of their own."""
    public = PublicRate(*PUBLIC_RATE, seats=seats)
    limits = _limits(timeout_s)
    serve_forwarding(
        rpc, RECEIPTS_VIA_PROTOCOL, RECEIPTS_PROTOCOL, limits, "receipts", public, None, _checked
    )


def _checked(request: bytes) -> None:
    """``ProtocolError`` for a receipts request the server would find malformed (a forwarder
    checks so, so that what it passes on is never charged to it as malformed)."""
    if len(request) != _REQUEST.size:
        raise ProtocolError("a receipts request is (run u64, epoch u64, which u8, offset "
                            "u32, size u16)")  # fmt: skip
    which = _REQUEST.unpack(request)[2]
    if which not in (SIGNED, RECEIVED, CERTIFIED):
        raise ProtocolError(f"receipts of kind {which}: ask for 0, 1 or 2")


def _limits(timeout_s: float) -> RpcLimits:
    return RpcLimits(_REQUEST.size, MAX_PAGE_BYTES, timeout_s)
