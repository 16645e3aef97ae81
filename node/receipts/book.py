"""A node's receipts on the hot path: countersign what it received, sign what it computed.

A relay that sends the output of a hop it computed names, with the hop, the digest of the input
it computed from; the receiver rebuilds the receipt from the hop's header, the two peers' ids,
that digest and the digest of the frame it got, computes the hop, and countersigns the receipt
in its ack; the worker checks the countersignature, signs the receipt itself and keeps the
complete receipt, which it reports to the microbatch's data node (``node.receipts.reports``).
The worker signs after the ack, off the hop's path: its signature is needed by nobody until the
report, and the receiver needs only facts it can check.

Every signature is handed out only after the receipt it signs is committed to the node's
database under its hop key (``node.store.hops``), one receipt per hop key for ever, so no crash
or retry can make an honest node sign two versions of a hop. The commits are batched in a writer
thread (``BatchWriter``). A countersignature that does not check, or a sender re-using a hop
key, is refused, logged once and scored down; the training goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from contracts.certificate_tree import SignedReceipt
from contracts.encoding import (
    FORWARD,
    Eip712Domain,
    HopReceipt,
    hop_key,
    node_address_of,
    node_public_key,
    receipt_digest,
    recover_digest_signer,
    scheduled_units,
    sign_digest,
)
from gwtf.errors import ProtocolError
from node.p2p.identity import node_address_of_peer
from node.store.hops import ConflictingReceipt, HopStore, ToSign
from node.store.writer import BatchWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiptTerms:
    """What every receipt of a run shares, read from the chain once: the ledger's EIP-712
    domain, the run, its relay stages and the units a forward earns."""

    run_id: int
    domain: Eip712Domain
    stages: int
    units_per_hop: int


@dataclass(frozen=True)
class HopFacts:
    """A hop as both ends know it: its header's fields, who computed it, who received it and
    the digests of what went in and came out. ``stage`` is the worker's (relay) stage."""

    epoch: int
    origin: str  # the data node's peer id (base58)
    iteration: int
    microbatch_id: int
    stage: int
    direction: int
    attempt: int
    worker: str  # peer ids (base58)
    counterparty: str
    input_digest: bytes
    output_digest: bytes


@dataclass
class ReceiptCounts:
    """What this node's receipts did, reported with its status."""

    signed: int = 0  # receipts signed as worker (each complete: countersigned first)
    countersigned: int = 0  # receipts countersigned as receiver
    completed: int = 0  # own receipts complete and handed to the reporter
    refused: int = 0  # peers' signatures that did not check (logged once per peer)
    recomputed: int = 0  # completed receipts of a re-sent or repaired attempt (attempt > 0)


@functools.lru_cache(maxsize=4096)
def address_of_peer(peer: str) -> str:
    """The node address behind a base58 peer id (cached: a relay meets few peers, often)."""
    return node_address_of_peer(ID.from_base58(peer))


def worker_stage(direction: int, receiver_stage: int) -> int:
    """The stage that computed a hop, from the stage its header names (the receiver's)."""
    return receiver_stage - 1 if direction == FORWARD else receiver_stage + 1


@dataclass
class ReceiptBook:
    """One node's signing and countersigning of receipts. Start ``run`` in the node's nursery."""

    terms: ReceiptTerms
    private_key: bytes = field(repr=False)
    store: HopStore
    #: Called with (peer, why) when a peer misbehaves: the node scores the peer down.
    penalise: Callable[[str, str], None] = lambda peer, why: None
    #: Called with each complete receipt of this node's (the reporter takes it to the data node).
    on_complete: Callable[[str, SignedReceipt], None] = lambda origin, entry: None
    counts: ReceiptCounts = field(default_factory=ReceiptCounts)
    _warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.address = node_address_of(node_public_key(self.private_key))
        self._signing = BatchWriter(self.store.sign_once)
        self._countersigning = BatchWriter(self.store.countersign_once)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signing.run)
            nursery.start_soon(self._countersigning.run)

    def is_receipted(self, direction: int, receiver_stage: int) -> bool:
        """Whether a hop into ``receiver_stage`` has a receipt: its worker is a relay."""
        return 1 <= worker_stage(direction, receiver_stage) <= self.terms.stages

    def receipt(self, hop: HopFacts) -> HopReceipt:
        """The receipt of ``hop`` under this run's terms."""
        return HopReceipt(
            runId=self.terms.run_id,
            epoch=hop.epoch,
            dataNode=address_of_peer(hop.origin),
            iteration=hop.iteration,
            microbatchId=hop.microbatch_id,
            stage=hop.stage,
            direction=hop.direction,
            attempt=hop.attempt,
            worker=address_of_peer(hop.worker),
            counterparty=address_of_peer(hop.counterparty),
            inputDigest=hop.input_digest,
            outputDigest=hop.output_digest,
            units=scheduled_units(hop.direction, self.terms.units_per_hop),
        )

    # ------------------------------------------------------------ as receiver
    async def countersign(self, sender: str, receipt: HopReceipt) -> bytes:
        """This node's countersignature of a receipt of a hop it received and computed, once it
        is committed; b"" (refused) when the hop key holds another receipt already."""
        digest = receipt_digest(receipt, self.terms.domain)
        signature = await self._countersigning.submit(self._to_sign(receipt, digest))
        if isinstance(signature, ConflictingReceipt):
            self.refuse(sender, str(signature))  # the sender re-used a hop key
            return b""
        self.counts.countersigned += 1
        return signature

    # ------------------------------------------------------------ as worker
    def acknowledged(self, receiver: str, origin: str, receipt: HopReceipt, counter: bytes) -> bool:
        """The receiver acknowledged this node's hop with ``counter``: if it checks, sign the
        receipt (committed with the countersignature, in the background) and hand the complete
        receipt to ``on_complete``; a bad countersignature is refused (False)."""
        digest = receipt_digest(receipt, self.terms.domain)
        try:
            if recover_digest_signer(digest, counter) != receipt.counterparty:
                raise ProtocolError("it is not the receiver's")
        except ProtocolError as exc:
            self.refuse(receiver, f"countersignature refused: {exc}")
            return False

        def signed(
            signature: bytes | ConflictingReceipt | None, error: BaseException | None
        ) -> None:
            if error is not None or not isinstance(signature, bytes):
                # A conflicting receipt here is this node's own numbering gone wrong: it never
                # signs a second version; the hop goes unpaid rather than the node slashable.
                log.error(
                    "receipt of hop %s not signed: %s", hop_key(receipt).hex(), error or signature
                )
                return
            self.counts.signed += 1
            self.counts.completed += 1
            self.counts.recomputed += receipt.attempt > 0
            self.on_complete(origin, SignedReceipt(receipt, signature, counter))

        self._signing.post(self._to_sign(receipt, digest, counter), signed)
        return True

    # ------------------------------------------------------------ internals
    def _to_sign(self, receipt: HopReceipt, digest: bytes, counter: bytes | None = None) -> ToSign:
        key = self.private_key
        return ToSign(hop_key(receipt), receipt, digest, lambda: sign_digest(digest, key), counter)

    def refuse(self, peer: str, why: str) -> None:
        self.counts.refused += 1
        self.penalise(peer, why)
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning("peer %s: %s (further refusals of it are not logged)", peer, why)
