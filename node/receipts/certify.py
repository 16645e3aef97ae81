"""Which receipts an honest data node certifies: hops that really are part of its microbatches.

A receipt signed by its worker and countersigned by its receiver proves only that two keys
agree. A data node certifies a hop only when it is also chained to the data node's own work:

* **checked** (``check_report``): the run, this data node, a relay stage, the run's units for
  its direction, both signatures; reported by its worker or its counterparty (both keep it);
* **chained** (``certifiable``): a forward at stage 1 computed from a frame this data node sent,
  a forward at stage k > 1 from the output of a chained forward at stage k - 1; a backward at
  the last stage from a gradient this data node sent, a backward at stage k from the output of
  a chained backward at stage k + 1. Acknowledged hops of attempts lost to a crash are chained
  like any others, so their workers are paid for them;
* **once per computation**: one receipt per (worker, microbatch, stage, direction, input) —
  a gradient re-sent around a dead receiver is the same work under a new attempt — and at most
  ``MAX_PER_HOP`` per (microbatch, stage, direction), lowest attempts first, which bounds what
  two colluding relays gain by forking a microbatch's chain to each other.

Whether worker and counterparty were bonded members of the run during the epoch is the chain's
to say; the epoch cycle asks it before building the tree (``node.receipts.epochs``). Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from contracts.certificate_tree import PreparedHop, SignedReceipt, check_signatures
from contracts.encoding import BACKWARD, FORWARD, scheduled_units
from gwtf.errors import ProtocolError
from node.receipts.book import ReceiptTerms

MAX_PER_HOP: Final = 4


@dataclass(frozen=True)
class Anchor:
    """A frame a data node sent to start a chain: a first forward, or a loss gradient."""

    iteration: int
    microbatch_id: int
    direction: int
    digest: bytes


def check_report(
    entry: SignedReceipt, terms: ReceiptTerms, data_node: str, reporter: str
) -> PreparedHop:
    """``entry`` prepared for a certificate, or a ``ProtocolError`` unless it is a receipt this
    data node may certify, reported by its worker or its counterparty."""
    r = entry.receipt
    if reporter not in (r.worker, r.counterparty):
        raise ProtocolError(f"receipt of {r.worker} to {r.counterparty} reported by {reporter}")
    check_fields(entry, terms, data_node)
    return PreparedHop.of(entry, terms.domain, check_signatures(entry, terms.domain))


def check_fields(entry: SignedReceipt, terms: ReceiptTerms, data_node: str) -> None:
    """A ``ProtocolError`` unless the receipt is of this run and data node, at a relay stage,
    for the run's units: what a data node checks of every receipt it certifies, its own ones
    (whose signatures it checked as it countersigned them) included."""
    r = entry.receipt
    if r.runId != terms.run_id or r.dataNode != data_node:
        raise ProtocolError(f"receipt for run {r.runId} and data node {r.dataNode}, not this one")
    if not 1 <= r.stage <= terms.stages:
        raise ProtocolError(f"receipt of stage {r.stage}, not a relay stage 1..{terms.stages}")
    if r.units != scheduled_units(r.direction, terms.units_per_hop):
        raise ProtocolError(f"receipt of {r.units} units, off the run's schedule")


def certifiable(
    prepared: Iterable[PreparedHop], anchors: Iterable[Anchor], stages: int
) -> list[PreparedHop]:
    """The receipts chained to ``anchors`` (see the module), once per computation; each hop
    key once (a report received twice is one receipt)."""
    unique = {p.hop_key: p for p in prepared}
    # By microbatch, then by (stage, direction): each hop is looked at once per link.
    hops: dict[tuple[int, int], dict[tuple[int, int], list[PreparedHop]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for p in unique.values():
        r = p.entry.receipt
        hops[(r.iteration, r.microbatchId)][(r.stage, r.direction)].append(p)
    starts: dict[tuple[int, int, int], set[bytes]] = defaultdict(set)
    for anchor in anchors:
        starts[(anchor.iteration, anchor.microbatch_id, anchor.direction)].add(anchor.digest)
    kept: list[PreparedHop] = []
    for (iteration, microbatch), links in sorted(hops.items()):
        for direction, order in ((FORWARD, range(1, stages + 1)), (BACKWARD, range(stages, 0, -1))):
            reached = starts.get((iteration, microbatch, direction), set())
            for stage in order:
                taken = _once_per_computation(
                    p
                    for p in links.get((stage, direction), ())
                    if p.entry.receipt.inputDigest in reached
                )
                kept.extend(taken)
                reached = {p.entry.receipt.outputDigest for p in taken}
    return kept


def _once_per_computation(candidates: Iterable[PreparedHop]) -> list[PreparedHop]:
    best: dict[tuple[str, bytes], PreparedHop] = {}
    for p in sorted(candidates, key=_preference):
        best.setdefault((p.entry.receipt.worker, p.entry.receipt.inputDigest), p)
    return sorted(best.values(), key=_preference)[:MAX_PER_HOP]


def _preference(p: PreparedHop) -> tuple[int, bytes]:
    return (p.entry.receipt.attempt, p.hop_key)
