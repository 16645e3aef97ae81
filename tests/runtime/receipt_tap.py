"""Receipts on an in-process swarm without a chain: each node gets a real ``ReceiptBook`` (its
own key, its own SQLite database, its batches closed over its own host) on its data plane;
every batch closes at the end of each of the data node's iterations (``settle``) as well as on
the book's timer; every complete receipt either end hands on is collected with the data node's
anchors, and every hop a relay computes is noted. What an
honest data node would certify of them is then ``certified()`` (``gwtf.node.receipts.certify``),
and ``unpaid()`` lists the hops live relays computed that no certified receipt pays."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt
from gwtf.contracts.encoding import BACKWARD, FORWARD, HopReceipt, hop_key, ledger_domain
from gwtf.node.receipts.batching import BatchSettings
from gwtf.node.receipts.book import ReceiptTerms, address_of_peer
from gwtf.node.receipts.certify import Anchor, certifiable, check_report
from gwtf.node.receipts.recording import ReceiptBook
from gwtf.node.runtime.dataplane.hop import HopHeader, frame_digest
from gwtf.node.runtime.live_node import LiveNode
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.store.batches import BatchStore
from gwtf.node.store.database import open_database

#: (worker address, iteration, microbatch, stage, direction, input digest): one computation.
Computation = tuple[str, int, int, int, int, bytes]


@dataclass
class ReceiptTap:
    tmp_path: Path
    stages: int
    identity_of: Callable[[str], Any]  # a node's name -> its libp2p KeyPair
    entries: list[SignedReceipt] = field(default_factory=list)
    #: Hop keys of the receipts their workers hold whole (countersigned).
    complete_at_worker: set[bytes] = field(default_factory=set)
    anchors: list[Anchor] = field(default_factory=list)
    computed: list[Computation] = field(default_factory=list)
    books: dict[str, ReceiptBook] = field(default_factory=dict)
    #: When the nodes' batches close (besides each iteration's end).
    settings: BatchSettings = field(default_factory=BatchSettings)
    #: (peer, why) of every charge a node's book made (a refused batch, a withheld one).
    charged: list[tuple[str, str]] = field(default_factory=list)
    #: Every receipt a node recorded as worker, batched or not.
    recorded: list[HopReceipt] = field(default_factory=list)
    data_peer: str = ""

    @property
    def terms(self) -> ReceiptTerms:
        domain = ledger_domain(31337, "0x" + "ef" * 20)
        return ReceiptTerms(run_id=1, domain=domain, stages=self.stages, units_per_hop=10)

    def attach(self, name: str, node: LiveNode, nursery: trio.Nursery) -> None:
        db = open_database(f"sqlite:///{self.tmp_path / f'receipts-{name}'}.sqlite")
        key = self.identity_of(name).private_key.to_bytes()
        book = ReceiptBook(
            self.terms,
            key,
            BatchStore(db, self.terms.domain),
            lambda peer, why: self.charged.append((peer, why)),
            settings=self.settings,
        )
        book.on_complete = self._completed
        book.on_received = lambda origin, entry: self.entries.append(entry)
        book.on_signed = self.recorded.append
        self.books[name] = book
        node.plane.use_receipts(book)
        nursery.start_soon(book.run, node.rpc)
        if isinstance(node.role, RelayRole):
            self._note_computations(node.role)
        else:
            self.data_peer = node.plane.node_id
            node.plane.origin_send = self._anchor
            self._settle_after_iterations(node)

    def _settle_after_iterations(self, node: LiveNode) -> None:
        """The data node's iterations end once every batch of theirs is closed (a live data
        node serves on after its last iteration; this one stops)."""
        run_iteration = node.role.run_iteration

        async def then_settle(iteration: int) -> Any:
            result = await run_iteration(iteration)
            await self.settle()
            return result

        node.role.run_iteration = then_settle  # type: ignore[method-assign]

    async def settle(self) -> None:
        """Close every open batch of every node (a crashed node's close goes unanswered)."""
        async with trio.open_nursery() as nursery:
            for book in self.books.values():

                async def close(book: ReceiptBook) -> None:
                    with trio.move_on_after(10):
                        await book.close_due(iteration_end=True)

                nursery.start_soon(close, book)

    def _completed(self, origin: str, entry: SignedReceipt) -> None:
        self.entries.append(entry)
        self.complete_at_worker.add(hop_key(entry.receipt))

    def _anchor(self, header: HopHeader, digest: bytes) -> None:
        anchor = Anchor(header.iteration, header.microbatch_id, header.direction, digest)
        self.anchors.append(anchor)

    def _note_computations(self, role: RelayRole) -> None:
        worker = address_of_peer(role.plane.node_id)

        def noting(compute: Callable[..., bytes]) -> Callable[..., bytes]:
            def computed(header: HopHeader, frame: bytes, *rest: Any) -> bytes:
                out = compute(header, frame, *rest)
                self.computed.append(
                    (worker, header.iteration, header.microbatch_id, header.stage,
                     header.direction, frame_digest(frame))
                )  # fmt: skip
                return out

            return computed

        role._forward = noting(role._forward)  # type: ignore[method-assign]
        role._backward = noting(role._backward)  # type: ignore[method-assign]

    def certified(self) -> list[PreparedHop]:
        """What the data node certifies of every receipt reported to it."""
        data_node = address_of_peer(self.data_peer)
        prepared = [
            check_report(entry, self.terms, data_node, entry.receipt.worker)
            for entry in self.entries
        ]
        return certifiable(prepared, self.anchors, self.stages)

    def unpaid(self, dead: set[str]) -> set[Computation]:
        """Computations of relays not in ``dead`` (peer ids) no certified receipt pays, but
        those a dead node was to countersign: a hop whose receiver died before its batch
        closed, and a backward through such a forward (a batch's cost of a crash)."""
        paid = {_computation(p) for p in self.certified()}
        gone = {address_of_peer(peer) for peer in dead}
        lost = {_computation_of(r) for r in self.recorded if r.counterparty in gone}
        lost_forwards = {(r.worker, r.iteration, r.microbatchId, r.stage) for r in self.recorded
                         if r.counterparty in gone and r.direction == FORWARD}  # fmt: skip
        return {
            c
            for c in self.computed
            if c[0] not in gone
            and c not in lost
            and not (c[4] == BACKWARD and c[:4] in lost_forwards)
        } - paid

    def assert_every_hop_paid_once(self, dead: set[str]) -> Counter[tuple[int, int]]:
        """Every hop a relay not in ``dead`` computed is certified, each computation once;
        returns the certified hops of attempts past the first (the swarm's repairs and
        redos) by (stage, direction)."""
        assert self.computed and self.unpaid(dead) == set()
        certified = self.certified()
        assert len({_computation(p) for p in certified}) == len(certified), "each paid once"
        # Its worker holds each one whole, the kept outputs' too (their countersignature is
        # handed back): it can serve it to an auditor or a jury.
        gone = {address_of_peer(peer) for peer in dead}
        held = [p.hop_key for p in certified if p.entry.receipt.worker not in gone]
        assert set(held) <= self.complete_at_worker
        receipts = [p.entry.receipt for p in certified]
        return Counter((r.stage, r.direction) for r in receipts if r.attempt > 0)

    def backwards_without_their_forward(self) -> list[tuple[str, int, int, int]]:
        """Certified backwards (worker, iteration, microbatch, stage) whose worker holds no
        whole receipt of its forward of that hop: a juror replays a backward only with it."""
        whole = {
            (r.worker, r.iteration, r.microbatchId, r.stage)
            for r in (e.receipt for e in self.entries)
            if r.direction == FORWARD and hop_key(r) in self.complete_at_worker
        }
        backwards = {
            (r.worker, r.iteration, r.microbatchId, r.stage)
            for r in (p.entry.receipt for p in self.certified())
            if r.direction == BACKWARD
        }
        return sorted(backwards - whole)


def _computation(p: PreparedHop) -> Computation:
    return _computation_of(p.entry.receipt)


def _computation_of(r: HopReceipt) -> Computation:
    return (r.worker, r.iteration, r.microbatchId, r.stage, r.direction, r.inputDigest)
