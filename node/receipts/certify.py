"""Which receipts an honest data node certifies: hops that really are part of its microbatches.

A receipt signed by its worker and countersigned by its receiver proves only that two keys
agree. A data node certifies a hop only when it is also chained to the data node's own work:

* **checked** (``check_report``): the run, this data node, a relay stage, the run's units for
  its direction, both signatures; reported by its worker or its counterparty (both keep it);
* **chained** (``certifiable``): a forward at stage 1 computed from a frame this data node sent,
  a forward at stage k > 1 from the output of a chained forward at stage k - 1; a backward at
  the last stage from a gradient this data node sent, a backward at stage k from the output of
  a chained backward at stage k + 1. Acknowledged hops of attempts lost to a crash are chained
  like any others, so their workers are paid for them, and so are the hops the swarm repairs
  or redoes: a re-sent hop is receipted again by its sender, and a hop whose receiver keeps
  its output (a stand-in's forward, a redone gradient) is signed by that receiver and
  countersigned by its sender (``node.runtime.dataplane.exchange``). Each is chained through
  the frame its sender really sent; a "repair" from a frame nobody chained is chained to
  nothing;
* **once per computation**: one receipt per (worker, microbatch, stage, direction, input) —
  a gradient re-sent around a dead receiver is the same work under a new attempt — and at most
  ``MAX_PER_HOP`` per (microbatch, stage, direction), the path's own hops first and then the
  kept ones (a stand-in's, a redo's), lowest attempts first, which bounds what
  two colluding relays gain by forking a microbatch's chain to each other. A relay cannot be
  paid twice by faking a repair of its own hop (the same worker and input: one computation),
  and colluders who fork a chain with "repairs" are paid only for computations they did on
  chained inputs, at most ``MAX_PER_HOP`` per hop, each replayable by the audit.

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
            senders: dict[bytes, set[str]] = defaultdict(set)  # digest -> the workers it is of
            first = True
            for stage in order:
                candidates = [
                    p
                    for p in links.get((stage, direction), ())
                    if p.entry.receipt.inputDigest in reached
                ]
                kept_ones = {
                    p.hop_key for p in candidates if _kept(p, senders, first and stages > 1)
                }
                taken = _once_per_computation(candidates, kept_ones)
                kept.extend(taken)
                reached = {p.entry.receipt.outputDigest for p in taken}
                senders = defaultdict(set)
                for p in taken:
                    senders[p.entry.receipt.outputDigest].add(p.entry.receipt.worker)
                first = False
    return kept


def _kept(p: PreparedHop, senders: dict[bytes, set[str]], first: bool) -> bool:
    """Whether ``p`` is a hop whose worker kept the output (a stand-in's forward, a redone
    gradient): its counterparty is the node its input came from (the sender of it, or the data
    node for the first link), where a hop sent on names the next node. A path's own hops are
    certified before these at the ``MAX_PER_HOP`` cap, so that repairs (however many ask for
    one) never push the relay that carried the microbatch on out of its hop's certificate."""
    r = p.entry.receipt
    if first:
        return r.counterparty == r.dataNode
    return r.counterparty in senders.get(r.inputDigest, set())


def _once_per_computation(
    candidates: Iterable[PreparedHop], kept_ones: set[bytes]
) -> list[PreparedHop]:
    def preference(p: PreparedHop) -> tuple[bool, int, bytes]:
        return (p.hop_key in kept_ones, p.entry.receipt.attempt, p.hop_key)

    best: dict[tuple[str, bytes], PreparedHop] = {}
    for p in sorted(candidates, key=preference):
        best.setdefault((p.entry.receipt.worker, p.entry.receipt.inputDigest), p)
    return sorted(best.values(), key=preference)[:MAX_PER_HOP]
