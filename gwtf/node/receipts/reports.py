"""Receipts between workers and data nodes: reports in, certificate ranges out.

A relay reports each complete receipt it holds, as worker or as receiver, to the data node of
its microbatch, in batches of up to ``MAX_REPORT`` every ``period_s``
(``/gwtf/receipts/report/2.0.0``); none is lost while the data node is unreachable: they wait
in the outbox, and a restarted relay reports again what its database holds of recent epochs (a
report is idempotent; a receipt kept already is not checked again). A data node checks each
new receipt (``certify.check_report``), keeps the good ones and refuses, scores down and logs
once the sender of a bad one. It also keeps the digests of the frames it starts chains with.

Once a data node has submitted an epoch's certificate it answers each worker's
``/gwtf/certificate/range/1.0.0`` with the worker's first and last leaf and their proofs, which
is what the worker needs to claim.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Protocol

import trio
from libp2p.peer.id import ID

from gwtf.contracts.certificate_tree import CertificateTree, PreparedHop, SignedReceipt, WorkerRange
from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.book import Penalise, ReceiptTerms, address_of_peer
from gwtf.node.receipts.certify import check_report
from gwtf.node.receipts.wire import (
    MAX_RECEIPT_BYTES,
    MAX_REPORT,
    decode_range,
    decode_receipts,
    encode_range,
    encode_receipts,
)
from gwtf.node.store.hops import HopStore

log = logging.getLogger(__name__)

REPORT_PROTOCOL = "/gwtf/receipts/report/2.0.0"
RANGE_PROTOCOL = "/gwtf/certificate/range/1.0.0"
_RANGE_REQUEST = struct.Struct(">QQ")
_REPORT_REPLY = struct.Struct(">HH")
#: Receipts a relay holds for unreachable data nodes before it drops the oldest (they stay in
#: its database, and a restart reports them again).
MAX_OUTBOX = 100_000
#: Data nodes a relay keeps an outbox for: a hop's origin is the sender's word, and a peer
#: naming a new one on every hop must not grow the outbox or the flush without bound.
MAX_DATA_NODES = 16


class DataNodePeers(Protocol):
    """The run's data nodes' peer ids by address, as discovery knows them now. Does not block
    or raise."""

    def __call__(self) -> dict[str, str]: ...


@dataclass
class ReceiptReporter:
    """A relay's outbox of complete receipts (its own and those it countersigned), by data
    node address. Start ``run``."""

    rpc: RequestResponse
    timeout_s: float
    period_s: float = 1.0
    #: The data nodes' peer ids, by address, beyond those met as origins (discovery's).
    data_node_peers: DataNodePeers = dict
    outbox: dict[str, list[SignedReceipt]] = field(default_factory=dict)
    peers: dict[str, str] = field(default_factory=dict)
    reported: int = 0
    _wake: trio.Event = field(default_factory=trio.Event)

    def add(self, origin: str, entry: SignedReceipt) -> None:
        """Queue ``entry`` for its data node, whose peer id is ``origin`` ("": unknown here)."""
        address = entry.receipt.dataNode
        full = address not in self.outbox and len(self.outbox) >= MAX_DATA_NODES
        if full and address not in self.data_node_peers():
            return  # an origin nobody else knows of: kept in the database only
        if origin:
            self.peers.setdefault(address, origin)
        queue = self.outbox.setdefault(address, [])
        queue.append(entry)
        if len(queue) > MAX_OUTBOX:
            del queue[: len(queue) - MAX_OUTBOX]
        if len(queue) >= MAX_REPORT:
            self._wake.set()

    def requeue(self, entries: list[SignedReceipt]) -> None:
        """Queue receipts read back from the database (after a restart)."""
        for entry in entries:
            self.add(self.peers.get(entry.receipt.dataNode, ""), entry)

    @property
    def pending(self) -> int:
        return sum(len(queue) for queue in self.outbox.values())

    async def run(self) -> None:
        while True:
            with trio.move_on_after(self.period_s):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Send every queued receipt it can, to each data node at once (one that does not
        answer holds up no other); what a data node does not take stays queued."""
        async with trio.open_nursery() as nursery:
            for address in list(self.outbox):
                nursery.start_soon(self._flush_to, address)

    async def _flush_to(self, address: str) -> None:
        peer = self.peers.get(address) or self.data_node_peers().get(address)
        while peer and self.outbox.get(address):
            batch = self.outbox[address][:MAX_REPORT]
            try:
                reply = await self.rpc.request(
                    ID.from_base58(peer),
                    REPORT_PROTOCOL,
                    encode_receipts(batch),
                    _limits(self.timeout_s),
                )
                _, refused = _REPORT_REPLY.unpack(reply)
            except (PeerUnavailable, struct.error) as exc:
                log.info("receipts for %s wait: %s", address, exc)
                break
            if refused:
                log.warning("data node %s refused %s of %s receipts", address, refused, len(batch))
            del self.outbox[address][: len(batch)]
            self.reported += len(batch)


@dataclass
class ReceiptInbox:
    """A data node's intake of reported receipts and of its own chains' anchors, and its
    answers to workers' range requests. ``serve`` it, and start ``run``."""

    rpc: RequestResponse
    terms: ReceiptTerms
    address: str
    store: HopStore
    timeout_s: float
    penalise: Penalise = lambda peer, why: None
    #: The certificate tree of each epoch this data node submitted (the epoch cycle's).
    trees: dict[int, CertificateTree] = field(default_factory=dict)
    accepted: int = 0
    refused: int = 0
    _anchors: list[dict[str, object]] = field(default_factory=list)
    _warned: set[str] = field(default_factory=set)

    def serve(self) -> None:
        self.rpc.serve(REPORT_PROTOCOL, self._report, _limits(self.timeout_s))
        self.rpc.serve(RANGE_PROTOCOL, self._range, _limits(self.timeout_s))

    def note_origin(
        self, epoch: int, iteration: int, microbatch: int, direction: int, digest: bytes
    ) -> None:
        """A frame this data node sent to start a chain (kept at the next flush)."""
        self._anchors.append(
            {
                "run_id": self.terms.run_id, "epoch": epoch, "iteration": iteration,
                "microbatch_id": microbatch, "direction": direction, "digest": digest,
            }
        )  # fmt: skip

    async def run(self) -> None:
        while True:
            await trio.sleep(0.25)
            await self.flush_anchors()

    async def flush_anchors(self) -> None:
        anchors, self._anchors = self._anchors, []
        if anchors:
            await trio.to_thread.run_sync(self.store.add_anchors, anchors)

    async def _report(self, peer: str, request: bytes) -> bytes:
        entries = decode_receipts(request)
        reporter = address_of_peer(peer)

        def check_and_keep() -> tuple[int, list[str]]:
            # Two signature recoveries and the leaf's hashes per receipt: in a worker thread,
            # so the data node's loop (the pipeline's hub) never waits on a report. A receipt
            # kept already (its worker and its receiver both report it) is not checked again,
            # nor one this node countersigned itself (its worker reports it to its receiver).
            hashed = [PreparedHop.of(entry, self.terms.domain) for entry in entries]
            kept = self.store.reported_hashes([p.hop_key for p in hashed])
            good, bad, again = [], [], 0
            for p in hashed:
                if kept.get(p.hop_key) == (p.receipt_digest, p.signatures_hash):
                    again += 1
                    continue
                try:
                    good.append(check_report(p.entry, self.terms, self.address, reporter))
                except ProtocolError as exc:
                    bad.append(str(exc))
            if good:
                self.store.add_reported(good)
            return len(good) + again, bad

        accepted, bad = await trio.to_thread.run_sync(check_and_keep)
        for why in bad:
            self._refuse(peer, why)
        self.accepted += accepted
        return _REPORT_REPLY.pack(accepted, len(bad))

    async def _range(self, peer: str, request: bytes) -> bytes:
        if len(request) != _RANGE_REQUEST.size:
            raise ProtocolError("a range request is (run u64, epoch u64)")
        run_id, epoch = _RANGE_REQUEST.unpack(request)
        tree = self.trees.get(epoch)
        if run_id != self.terms.run_id or tree is None:
            raise Decline(f"no certificate of run {run_id} epoch {epoch} here (yet)")
        return encode_range(tree.worker_range(address_of_peer(peer)))

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        self.penalise(peer, why)
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning("peer %s: receipt refused: %s (further ones are not logged)", peer, why)


async def request_range(
    rpc: RequestResponse, data_node_peer: str, run_id: int, epoch: int, timeout_s: float
) -> WorkerRange | None:
    """This node's range of a data node's certificate (``WorkerRange`` or None)."""
    reply = await rpc.request(
        ID.from_base58(data_node_peer),
        RANGE_PROTOCOL,
        _RANGE_REQUEST.pack(run_id, epoch),
        _limits(timeout_s),
    )
    return decode_range(reply)


def _limits(timeout_s: float) -> RpcLimits:
    return RpcLimits(2 + MAX_REPORT * MAX_RECEIPT_BYTES, 16_384, timeout_s)
