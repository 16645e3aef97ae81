"""A node's receipts on the hot path: sign what it computed, countersign what it received.

A relay that sends the output of a hop it computed signs the hop's receipt first (as a batch of
one: the ``HopBatch`` whose root is the receipt's digest, ``gwtf.contracts.encoding``) and sends,
with the hop, the digest of the input it computed from and its signature; the receiver rebuilds
the receipt from the hop's header, the two peers' ids, that digest and the digest of the frame
it got, checks the worker's signature, computes the hop, commits the whole receipt and
countersigns it in its ack. The worker checks the countersignature and keeps the complete
receipt too. Both report it to the microbatch's data node (``gwtf.node.receipts.reports``; a data
node takes it twice as once): what a countersignature vouches for is on the receiver's disk
before the worker learns of it, so a crash of either end does not cost the worker its pay, and
a receiver that will not report does not either once the worker has its ack.

Every signature is handed out only after the receipt it signs is committed to the node's
database under its hop key (``gwtf.node.store.hops``), one receipt per hop key for ever, so no crash
or retry can make an honest node sign two versions of a hop. The commits are batched in writer
threads (``BatchWriter``). A signature that does not check, or a sender re-using a hop key, is
refused, logged once and scored down; the training goes on (the hop is computed and
acknowledged, unreceipted).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol, get_type_hints

import trio
from libp2p.peer.id import ID

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    FORWARD,
    HOP_RECEIPT_FIELDS,
    Eip712Domain,
    HopReceipt,
    hop_key,
    node_address_of,
    node_public_key,
    receipt_digest,
    recover_digest_signer,
    scheduled_units,
    sign_digest,
    signing_digest,
    snake_case,
)
from gwtf.errors import ProtocolError
from gwtf.node.p2p.identity import node_address_of_peer
from gwtf.node.store.hops import ConflictingReceipt, HopStore, ToSign
from gwtf.node.store.writer import BatchWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiptTerms:
    """What every receipt of a run shares, read from the chain once: the ledger's EIP-712
    domain, the run, its relay stages and the units a forward earns."""

    run_id: int
    domain: Eip712Domain
    stages: int
    units_per_hop: int


@functools.lru_cache(maxsize=4096)
def address_of_peer(peer: str) -> str:
    """The node address behind a base58 peer id (cached: a relay meets few peers, often)."""
    return node_address_of_peer(ID.from_base58(peer))


class HopFacts(NamedTuple):
    """A hop as both ends know it: its header's fields, who computed it, who received it and
    the digests of what went in and came out. ``stage`` is the worker's (relay) stage.

    These are the ``HopReceipt``'s fields less the run's (its id and units, from
    ``ReceiptTerms``), in snake case and in the receipt's order, its nodes as the peer ids the
    data plane meets rather than addresses: ``check_mirrors_receipt`` holds this declaration to
    the receipt's at import, and ``receipt`` is the one conversion to it. Built by keyword.
    A named tuple, not a frozen dataclass: a relay builds one for every hop it signs,
    countersigns or counts, and a tuple is built in half the time."""

    epoch: int
    data_node: str  # peer ids (base58); the data node is the hop header's ``origin``
    iteration: int
    microbatch_id: int
    stage: int
    direction: int
    attempt: int
    worker: str
    counterparty: str
    input_digest: bytes
    output_digest: bytes

    def receipt(
        self, terms: ReceiptTerms, address_of: Callable[[str], str] = address_of_peer
    ) -> HopReceipt:
        """The hop's receipt under ``terms``, its peers' addresses from ``address_of``.
        Raises ``ProtocolError`` for a field the receipt cannot hold (a peer id that is no
        node's, a value out of range)."""
        # Spelled out, not a loop over the fields: a relay converts every hop it signs or
        # countersigns, and the mirror check keeps this in step with the receipt.
        return HopReceipt(
            runId=terms.run_id,
            epoch=self.epoch,
            dataNode=address_of(self.data_node),
            iteration=self.iteration,
            microbatchId=self.microbatch_id,
            stage=self.stage,
            direction=self.direction,
            attempt=self.attempt,
            worker=address_of(self.worker),
            counterparty=address_of(self.counterparty),
            inputDigest=self.input_digest,
            outputDigest=self.output_digest,
            units=scheduled_units(self.direction, terms.units_per_hop),
        )


#: The receipt's fields a run's terms give, not a hop's facts.
RUN_FIELDS: Final = ("runId", "units")


def check_mirrors_receipt(facts: type) -> None:
    """Raise ``TypeError`` unless ``facts`` declares exactly the ``HopReceipt``'s fields less
    ``RUN_FIELDS``, in snake case, in the receipt's order, each of the receipt field's Python
    type: a field added to the receipt fails the node's import until its hops carry it."""
    receipt_types = get_type_hints(HopReceipt)  # Annotated[int, "uint64"] -> int
    expected = [
        (snake_case(name), receipt_types[name])
        for name, _ in HOP_RECEIPT_FIELDS
        if name not in RUN_FIELDS
    ]
    declared = list(get_type_hints(facts).items())
    if declared != expected:
        raise TypeError(
            f"{facts.__name__} declares {declared}, not the HopReceipt's fields less "
            f"{', '.join(RUN_FIELDS)}: {expected}; declare those, in that order"
        )


check_mirrors_receipt(HopFacts)


@dataclass
class ReceiptCounts:
    """What this node's receipts did, reported with its status."""

    signed: int = 0  # receipts signed as worker (before the hop is sent)
    countersigned: int = 0  # receipts countersigned as receiver
    completed: int = 0  # own receipts complete (countersigned) and handed to the reporter
    refused: int = 0  # peers' signatures that did not check (logged once per peer)
    recomputed: int = 0  # completed receipts of a re-sent or repaired attempt (attempt > 0)


def worker_stage(direction: int, receiver_stage: int) -> int:
    """The stage that computed a hop, from the stage its header names (the receiver's)."""
    return receiver_stage - 1 if direction == FORWARD else receiver_stage + 1


class Penalise(Protocol):
    """Charge a peer that misbehaved (its id, and why, for the log): the node scores it down.
    Must not block or raise."""

    def __call__(self, peer: str, why: str, /) -> None: ...


class ReceiptCompleted(Protocol):
    """Told of a complete (countersigned) receipt and the data node it goes to (its origin's
    peer id). Must not block or raise: it runs in the hop's exchange."""

    def __call__(self, origin: str, entry: SignedReceipt, /) -> None: ...


class ReceiptSigned(Protocol):
    """Told of each receipt this node signed as worker. Must not block or raise."""

    def __call__(self, receipt: HopReceipt, /) -> None: ...


@dataclass
class ReceiptBook:
    """One node's signing and countersigning of receipts. Start ``run`` in the node's nursery."""

    terms: ReceiptTerms
    private_key: bytes = field(repr=False)
    store: HopStore
    #: Called with (peer, why) when a peer misbehaves: the node scores the peer down.
    penalise: Penalise = lambda peer, why: None
    #: Called with each complete receipt of this node's (the reporter takes it to the data node).
    on_complete: ReceiptCompleted = lambda origin, entry: None
    #: Called with each complete receipt this node countersigned (a relay reports it too).
    on_received: ReceiptCompleted = lambda origin, entry: None
    #: Called with each receipt this node signed as worker: it has work to claim in that
    #: receipt's epoch, even if its own copy of the countersignature never comes.
    on_signed: ReceiptSigned = lambda receipt: None
    counts: ReceiptCounts = field(default_factory=ReceiptCounts)
    _warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.address = node_address_of(node_public_key(self.private_key))
        self._signing = BatchWriter(self.store.sign_once)
        self._countersigning = BatchWriter(self.store.countersign_once)
        # Nobody waits on the worker's own copy of a countersignature (the receiver holds the
        # whole receipt): it is written in larger, later batches.
        self._completing = BatchWriter(self.store.add_countersignatures, linger_s=0.05)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signing.run)
            nursery.start_soon(self._countersigning.run)
            nursery.start_soon(self._completing.run)

    def is_receipted(self, direction: int, receiver_stage: int) -> bool:
        """Whether a hop into ``receiver_stage`` has a receipt: its worker is a relay."""
        return 1 <= worker_stage(direction, receiver_stage) <= self.terms.stages

    def receipt(self, hop: HopFacts) -> HopReceipt:
        """The receipt of ``hop`` under this run's terms."""
        return hop.receipt(self.terms)

    # ------------------------------------------------------------ as worker
    async def sign(self, receipt: HopReceipt, conflicts: list[bool] | None = None) -> bytes | None:
        """This node's signature of a hop it computed, once committed; None when its hop key
        holds another receipt already (``conflicts`` learns it: the sender re-sends the hop
        under a fresh attempt; else it goes unreceipted and unpaid rather than the node
        slashable)."""
        digest = receipt_digest(receipt, self.terms.domain)
        try:
            signature = await self._signing.submit(self._to_sign(receipt, digest))
        except Exception as exc:  # the database's (disk full, locked): the hop goes on unpaid
            log.error("receipt of hop %s not signed: %s", hop_key(receipt).hex(), exc)
            return None
        if isinstance(signature, ConflictingReceipt):
            log.warning("receipt of hop %s not signed: %s", hop_key(receipt).hex(), signature)
            if conflicts is not None:
                conflicts.append(True)
            return None
        self.counts.signed += 1
        self.on_signed(receipt)
        return signature

    def acknowledged(
        self, receiver: str, origin: str, receipt: HopReceipt, signature: bytes, counter: bytes
    ) -> bool:
        """The receiver acknowledged this node's hop with ``counter``: if it checks, keep it
        with the receipt (in the background) and hand the complete receipt to
        ``on_complete``; a bad countersignature is refused (False)."""
        signed = signing_digest(receipt, self.terms.domain)
        if not self._signed_by(receiver, signed, counter, receipt.counterparty, "countersignature"):
            return False

        def kept(_: None, error: BaseException | None) -> None:
            if error is not None:
                # The receiver holds the complete receipt and reports it; only this node's
                # own record of it is missing.
                log.error("countersignature of hop %s not kept: %s", hop_key(receipt).hex(), error)
            self.counts.completed += 1
            self.counts.recomputed += receipt.attempt > 0
            self.on_complete(origin, SignedReceipt(receipt, signature, counter))

        self._completing.post((hop_key(receipt), counter), kept)
        return True

    # ------------------------------------------------------------ as receiver
    async def countersign(
        self, sender: str, origin: str, receipt: HopReceipt, worker_signature: bytes
    ) -> bytes:
        """This node's countersignature of a receipt of a hop it received and computed, once
        the whole receipt is committed; b"" (refused) when the worker's signature does not
        check or the hop key holds another receipt already."""
        digest = receipt_digest(receipt, self.terms.domain)
        if not self._signed_by(
            sender,
            signing_digest(receipt, self.terms.domain, (), digest),
            worker_signature,
            receipt.worker,
            "receipt signature",
        ):
            return b""
        fresh: list[bool] = []  # whether this receipt was countersigned now, not before
        item = self._to_sign(receipt, digest, worker_signature, fresh)
        counter = await self._countersigning.submit(item)
        if isinstance(counter, ConflictingReceipt):
            self.refuse(sender, str(counter))  # the sender re-used a hop key
            return b""
        if fresh:  # a request again for a receipt held is answered, not reported again
            self.counts.countersigned += 1
            self.on_received(origin, SignedReceipt(receipt, worker_signature, counter))
        return counter

    # ------------------------------------------------------------ internals
    def _to_sign(
        self,
        receipt: HopReceipt,
        digest: bytes,
        worker_signature: bytes | None = None,
        fresh: list[bool] | None = None,
    ) -> ToSign:
        """``receipt`` to sign under its hop key; ``fresh`` learns whether it was signed now
        (the writer calls ``sign`` only for a key it holds no receipt of)."""
        key = self.private_key
        domain = self.terms.domain

        def sign() -> bytes:
            if fresh is not None:
                fresh.append(True)
            # Each receipt is signed as a batch of one (its proof empty).
            return sign_digest(signing_digest(receipt, domain, (), digest), key)

        return ToSign(hop_key(receipt), receipt, digest, sign, worker_signature)

    def _signed_by(
        self, peer: str, digest: bytes, signature: bytes, signer: str, what: str
    ) -> bool:
        """Whether ``signer`` signed ``digest``; if not, ``peer`` is refused for it."""
        try:
            if recover_digest_signer(digest, signature) != signer:
                raise ProtocolError("it is not its party's, or not of the hop received")
        except ProtocolError as exc:
            self.refuse(peer, f"{what} refused: {exc}")
            return False
        return True

    def refuse(self, peer: str, why: str) -> None:
        self.counts.refused += 1
        self.penalise(peer, why)
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning("peer %s: %s (further refusals of it are not logged)", peer, why)
