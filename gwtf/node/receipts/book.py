"""A node's receipts on the hot path: record what it computed and received, sign in batches.

A relay that sends the output of a hop it computed commits the hop's receipt, open, under its
hop key first and sends, with the hop, the digest of the input it computed from; the receiver
rebuilds the receipt from the hop's header, the two peers' ids, that digest and the digest of
the frame it got, computes the hop and commits the receipt, open, before it acks. Neither signs
anything per hop: the worker closes its open receipts for a receiver in batches
(``gwtf.node.receipts.batching``: every ``max_hops`` hops, after ``max_age_s``, at the
iteration's end), the receiver countersigns a batch only from receipts on its own disk
(``gwtf.node.receipts.batch_closing``), and both hand each receipt of a countersigned batch,
with both signatures and its inclusion proof, to the reporter (``on_complete``,
``on_received``).

One receipt per hop key for ever (``gwtf.node.store.batches``): a hop key that holds another
receipt here is not recorded again, so the sender re-sends under a fresh attempt, and a
receiver re-using a key is refused and scored down; the training goes on (the hop is computed
and acknowledged, unreceipted). Commits are gathered in a writer thread (``BatchWriter``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol, get_type_hints

from libp2p.peer.id import ID

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    FORWARD,
    HOP_RECEIPT_FIELDS,
    Eip712Domain,
    HopReceipt,
    scheduled_units,
    snake_case,
)
from gwtf.node.p2p.identity import node_address_of_peer

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

    signed: int = 0  # receipts recorded as worker (before the hop is sent)
    countersigned: int = 0  # receipts recorded as receiver (before the ack)
    completed: int = 0  # own receipts in a countersigned batch, handed to the reporter
    refused: int = 0  # peers' hops or batches refused (logged once per peer)
    recomputed: int = 0  # completed receipts of a re-sent or repaired attempt (attempt > 0)


def worker_stage(direction: int, receiver_stage: int) -> int:
    """The stage that computed a hop, from the stage its header names (the receiver's)."""
    return receiver_stage - 1 if direction == FORWARD else receiver_stage + 1


class Penalise(Protocol):
    """Charge a peer that misbehaved (its id, and why, for the log): the node scores it down.
    Must not block or raise."""

    def __call__(self, peer: str, why: str, /) -> None: ...


class ReceiptCompleted(Protocol):
    """Told of a complete (batch-countersigned) receipt and the data node it goes to (its
    origin's peer id). Must not block or raise."""

    def __call__(self, origin: str, entry: SignedReceipt, /) -> None: ...


class ReceiptSigned(Protocol):
    """Told of each receipt this node recorded as worker. Must not block or raise."""

    def __call__(self, receipt: HopReceipt, /) -> None: ...


class BatchSealed(Protocol):
    """Told of the receipts of a batch this node closed as worker: countersigned (True) or
    withheld (False). Must not block or raise."""

    def __call__(self, receipts: tuple[HopReceipt, ...], whole: bool, /) -> None: ...
