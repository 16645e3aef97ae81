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
  countersigned by its sender (``gwtf.node.runtime.dataplane.exchange``). Each is chained through
  the frame its sender really sent; a "repair" from a frame nobody chained is chained to
  nothing;
* **once per computation**: one receipt per (worker, microbatch, stage, direction, input) —
  a gradient re-sent around a dead receiver is the same work under a new attempt — and at most
  ``MAX_PER_HOP`` per (microbatch, stage, direction), which bounds what colluding relays gain
  by forking a microbatch's chain to each other. A relay cannot be paid twice by faking a
  repair of its own hop (the same worker and input: one computation), and colluders who fork
  a chain are paid only for computations they did on chained inputs, at most ``MAX_PER_HOP``
  per hop, each replayable by the audit;
* **the data node's own path first** at that cap (``_ranks``): the hops it saw the microbatch
  through, walked back from the forward it received at the last stage and the backward it
  received at the first, each hop countersigned as received by the worker of the next, so
  accomplices' forks at attempt 0 never push out the relay that carried the microbatch, even
  after a repair (attempt > 0); then the other hops the data node countersigned and the
  forwards its path's backwards went through (a stand-in's kept forward, a redone one); then
  the rest. Within each, lowest attempts first. A computation is certified under its best
  ranked receipt, so the path's chain goes on from the output it really carried.

Whether worker and counterparty were bonded members of the run during the epoch is the chain's
to say; the epoch cycle asks it before building the tree (``gwtf.node.receipts.epochs``). Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt, check_signatures
from gwtf.contracts.encoding import BACKWARD, FORWARD, scheduled_units
from gwtf.errors import ProtocolError
from gwtf.node.receipts.book import ReceiptTerms

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
    """The receipts chained to ``anchors`` (see the module), once per computation, ranked at
    the ``MAX_PER_HOP`` cap by ``_ranks``; each hop key once (a report received twice is one
    receipt)."""
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
        rank = _ranks(links, stages)
        for direction, order in ((FORWARD, range(1, stages + 1)), (BACKWARD, range(stages, 0, -1))):
            reached = starts.get((iteration, microbatch, direction), set())
            for stage in order:
                candidates = [
                    p
                    for p in links.get((stage, direction), ())
                    if p.entry.receipt.inputDigest in reached
                ]
                taken = _once_per_computation(candidates, rank)
                kept.extend(taken)
                reached = {p.entry.receipt.outputDigest for p in taken}
    return kept


#: Ranks at the ``MAX_PER_HOP`` cap, best first (see ``_ranks``).
ON_PATH: Final = 0
VOUCHED: Final = 1
OTHER: Final = 2


def _ranks(links: dict[tuple[int, int], list[PreparedHop]], stages: int) -> dict[bytes, int]:
    """The rank of each of a microbatch's hops (by hop key; ``OTHER`` where absent).

    ``ON_PATH``: the hops the data node itself saw the microbatch through. It countersigned as
    receiver the last stage's forward it computed the loss from and the first stage's backward
    (a data node computes one of each per start of a microbatch: ``roles.data``); walking
    back from each, a hop whose output is the input of an ``ON_PATH`` hop and whose
    counterparty is that hop's worker, who countersigned it as received, is ``ON_PATH`` too.
    Nobody forges the data node's countersignature, so accomplices who fork a hop from its
    chained input, however low their attempts, rank after the relay that really carried it on.
    Rivals rank with the carrier only where its receiver countersigned them too: a colluding
    receiver (which could withhold the carrier's countersignature anyway), or accomplices who
    hold the carrier's input and deliver bit-identical copies of its output to an honest
    receiver, which computes each again and countersigns it.

    ``VOUCHED``: the other hops the data node countersigned (a kept forward it sent a stage-1
    stand-in, a gradient it had redone at the last stage), and the forwards of the worker of
    an ``ON_PATH`` or ``VOUCHED`` backward at its stage (the backward went through one of them:
    a stand-in's kept forward, a redone one). With one relay stage, a stage-1 forward the data
    node countersigned as its sender (kept) cannot be told from one it received, and ranks
    ``ON_PATH``."""
    rank: dict[bytes, int] = {}
    for entries in links.values():
        for p in entries:
            if p.entry.receipt.counterparty == p.entry.receipt.dataNode:
                rank[p.hop_key] = VOUCHED
    for direction, received_at, upstream in ((FORWARD, stages, -1), (BACKWARD, 1, 1)):
        stage = received_at
        seen = [
            p
            for p in links.get((stage, direction), ())
            if p.entry.receipt.counterparty == p.entry.receipt.dataNode
        ]
        while seen:  # each step one stage upstream, until past the first or last
            for p in seen:
                rank[p.hop_key] = ON_PATH
            received = {(p.entry.receipt.inputDigest, p.entry.receipt.worker) for p in seen}
            stage += upstream
            seen = [
                p
                for p in links.get((stage, direction), ())
                if (p.entry.receipt.outputDigest, p.entry.receipt.counterparty) in received
            ]
    for (stage, direction), entries in links.items():
        if direction != BACKWARD:
            continue
        workers = {p.entry.receipt.worker for p in entries if p.hop_key in rank}
        for p in links.get((stage, FORWARD), ()):
            if p.entry.receipt.worker in workers:
                rank[p.hop_key] = min(rank.get(p.hop_key, OTHER), VOUCHED)
    return rank


def _once_per_computation(
    candidates: Iterable[PreparedHop], rank: dict[bytes, int]
) -> list[PreparedHop]:
    """One receipt per (worker, input), its best ranked (the one on the path keeps the chain
    going on from its output), then the best ``MAX_PER_HOP``: by rank, then attempt."""

    def preference(p: PreparedHop) -> tuple[int, int, bytes]:
        return (rank.get(p.hop_key, OTHER), p.entry.receipt.attempt, p.hop_key)

    best: dict[tuple[str, bytes], PreparedHop] = {}
    for p in sorted(candidates, key=preference):
        best.setdefault((p.entry.receipt.worker, p.entry.receipt.inputDigest), p)
    return sorted(best.values(), key=preference)[:MAX_PER_HOP]
