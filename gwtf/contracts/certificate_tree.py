"""A data node's certificate tree for one epoch: the hops it certifies, as one Merkle root.

Owns the rules an honest tree follows, which the disputes contract checks: leaf ``i`` is the
``CertifiedHop`` of one signed and countersigned receipt, with ``index = i`` and ``unitsBefore``
the sum of the units of leaves ``0..i-1``; the leaves are sorted by (worker, hop key), strictly,
so each hop is certified once and each worker's hops form one range, which the worker claims
with the proofs of its first and last leaf. The tree is OpenZeppelin's StandardMerkleTree over
the leaves in index order. The data node commits the ranges with the root as the tree's spans
(one ``WorkerSpan`` per worker, in worker order, partitioning the leaves and units), and a
claim also proves its range in the range tree over them (``range_leaf``, the same layout), so
the ledger never pays one unit to two workers. Pure: no chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from gwtf.contracts.encoding import (
    CertifiedHop,
    CertRef,
    Eip712Domain,
    HopReceipt,
    SpanRange,
    WorkerSpan,
    hop_key,
    range_leaf,
    receipt_digest,
    recover_digest_signer,
    signatures_hash,
    signing_digest,
)
from gwtf.contracts.merkle import MerkleTree, build_tree
from gwtf.errors import ProtocolError


@dataclass(frozen=True)
class SignedReceipt:
    """A receipt with its worker's signature and its counterparty's countersignature of the
    batch that holds it, and its proof in that batch (empty: a batch of one)."""

    receipt: HopReceipt
    worker_signature: bytes
    counterparty_signature: bytes
    proof: tuple[bytes, ...] = ()

    def signing_digest(self, domain: Eip712Domain, digest: bytes | None = None) -> bytes:
        """What both signatures sign: the digest of the receipt's batch (``digest``: the
        receipt's own digest, when computed already). Kept on the entry for its last domain:
        an auditor needs it for the leaf's check and again in the equivocation search."""
        kept = self.__dict__.get("_signing")
        if kept is not None and (kept[0] is domain or kept[0] == domain):
            return kept[1]  # type: ignore[no-any-return]
        value = signing_digest(self.receipt, domain, self.proof, digest)
        object.__setattr__(self, "_signing", (domain, value))  # not a field: eq and repr skip it
        return value

    def seal(self) -> tuple[list[bytes], bytes, bytes]:
        """Its ``BatchSeal`` as a contract argument."""
        return (list(self.proof), self.worker_signature, self.counterparty_signature)

    def signatures_hash(self) -> bytes:
        """What its certificate leaf commits of its seal."""
        return signatures_hash(self.worker_signature, self.counterparty_signature, self.proof)


@dataclass(frozen=True)
class LeafProof:
    """A leaf of a certificate tree with its Merkle proof."""

    hop: CertifiedHop
    proof: tuple[bytes, ...]

    def as_args(self) -> tuple[tuple[object, ...], list[bytes]]:
        """The leaf and proof as contract arguments."""
        return self.hop.as_tuple(), list(self.proof)


@dataclass(frozen=True)
class SpanProof:
    """A span of a certificate as its leaf of the range tree, with its Merkle proof."""

    span: SpanRange
    proof: tuple[bytes, ...]

    def as_args(self) -> tuple[tuple[object, ...], list[bytes]]:
        """The span and proof as contract arguments."""
        return self.span.as_tuple(), list(self.proof)


@dataclass(frozen=True)
class WorkerRange:
    """A worker's leaves in one tree: what it claims, with the proofs of both ends and of its
    span in the range tree."""

    worker: str
    first: LeafProof
    last: LeafProof
    range_proof: tuple[bytes, ...]

    @property
    def units(self) -> int:
        return self.last.hop.unitsBefore + self.last.hop.units - self.first.hop.unitsBefore

    def range_leaf(self) -> bytes:
        """The range tree's leaf that the first and last leaf bound."""
        first, last = self.first.hop, self.last.hop
        return range_leaf(
            self.worker, first.index, last.index, first.unitsBefore, last.unitsBefore + last.units
        )

    def claim_args(self, cert: CertRef) -> tuple[object, ...]:
        """``claimReward``'s arguments for this range of ``cert``."""
        return claim_reward_args(cert, self.first, self.last, self.range_proof)


def claim_reward_args(
    cert: CertRef, first: LeafProof, last: LeafProof, range_proof: Sequence[bytes]
) -> tuple[object, ...]:
    """``WorkLedger.claimReward(cert, first, firstProof, last, lastProof, rangeProof)``'s
    arguments: the one encoding of a claim, honest (``WorkerRange.claim_args``) or not."""
    (first_hop, first_proof), (last_hop, last_proof) = first.as_args(), last.as_args()
    return (cert.as_tuple(), first_hop, first_proof, last_hop, last_proof, list(range_proof))


@dataclass(frozen=True)
class CertificateTree:
    """A certificate tree: its leaves, the receipts behind them (when known), the tree, and the
    spans the data node commits with it (None for a published tree whose leaves are not one
    range per worker in worker order) with their range tree."""

    hops: tuple[CertifiedHop, ...]
    entries: tuple[SignedReceipt | None, ...]
    tree: MerkleTree
    spans: tuple[WorkerSpan, ...] | None = None
    ranges: MerkleTree | None = None

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def count(self) -> int:
        return len(self.hops)

    @property
    def units(self) -> int:
        return self.hops[-1].unitsBefore + self.hops[-1].units

    def cert_ref(self, run_id: int, epoch: int, data_node: str) -> CertRef:
        """The certificate this tree and its spans back."""
        if self.ranges is None:
            raise ProtocolError("this tree has no spans: its leaves are not one range per worker")
        return CertRef(
            run_id, epoch, data_node, self.root, self.count, self.units, self.ranges.root
        )

    def leaf_proof(self, index: int) -> LeafProof:
        """Leaf ``index`` with its proof, for a claim or a fraud proof."""
        return LeafProof(self.hops[index], tuple(self.tree.proof(index)))

    def spans_or_raise(self) -> tuple[WorkerSpan, ...]:
        """The spans the data node submits with the root."""
        if self.spans is None:
            raise ProtocolError("this tree has no spans: its leaves are not one range per worker")
        return self.spans

    def with_spans(self, spans: Sequence[WorkerSpan]) -> CertificateTree:
        """The same tree with ``spans`` (those its data node committed) and their range tree."""
        return replace(self, spans=tuple(spans), ranges=ranges_tree(spans))

    def span_ranges(self) -> tuple[SpanRange, ...]:
        """The spans with where each starts, in span order (none for a tree without spans)."""
        return span_ranges(self.spans or ())

    def span_proof(self, k: int) -> SpanProof:
        """Span ``k`` as its range-tree leaf with its proof, for a span fraud proof."""
        if self.spans is None or self.ranges is None:
            raise ProtocolError("this tree has no spans: its leaves are not one range per worker")
        return SpanProof(self.span_ranges()[k], tuple(self.ranges.proof(k)))

    def worker_range(self, worker: str) -> WorkerRange | None:
        """The range of ``worker``'s leaves (None when the tree holds none of its hops): its
        span's ends with the span's proof when it has a span within the leaves, else its first
        and last leaf (with the span's proof, or none)."""
        indices = [i for i, hop in enumerate(self.hops) if hop.worker.lower() == worker.lower()]
        if not indices:
            return None
        first, last = indices[0], indices[-1]
        range_proof: tuple[bytes, ...] = ()
        spans = self.spans or ()
        for k, span in enumerate(spans):
            if span.worker.lower() == worker.lower() and self.ranges is not None:
                range_proof = tuple(self.ranges.proof(k))
                if span.lastIndex < len(self.hops):
                    first = spans[k - 1].lastIndex + 1 if k else 0
                    last = span.lastIndex
        return WorkerRange(
            self.hops[indices[0]].worker,
            self.leaf_proof(first),
            self.leaf_proof(last),
            range_proof,
        )

    def workers(self) -> list[str]:
        """The workers whose hops the tree certifies, in tree order."""
        seen: dict[str, None] = {}
        for hop in self.hops:
            seen.setdefault(hop.worker, None)
        return list(seen)


def spans_of(hops: Sequence[CertifiedHop]) -> tuple[WorkerSpan, ...] | None:
    """The spans of ``hops`` in tree order: one per run of one worker's leaves, ending at the
    running sum of their units; None unless every worker has one run of some units and the
    workers strictly increase (a tree laid out as ``build_certificate_tree`` lays it out)."""
    spans: list[WorkerSpan] = []
    running = 0
    for position, hop in enumerate(hops):
        running += hop.units
        if spans and spans[-1].worker == hop.worker:
            spans[-1] = WorkerSpan(hop.worker, position, running)
            continue
        if spans and int(hop.worker, 16) <= int(spans[-1].worker, 16):
            return None
        spans.append(WorkerSpan(hop.worker, position, running))
    ends = [0, *(span.unitsEnd for span in spans)]
    return tuple(spans) if spans and all(a < b for a, b in pairwise(ends)) else None


def span_ranges(spans: Sequence[WorkerSpan]) -> tuple[SpanRange, ...]:
    """``spans`` with where each starts: the leaf after the previous span's last, the units
    after its end (the first at 0)."""
    ranges = []
    first_index = units_before = 0
    for span in spans:
        ranges.append(
            SpanRange(span.worker, first_index, span.lastIndex, units_before, span.unitsEnd)
        )
        first_index, units_before = span.lastIndex + 1, span.unitsEnd
    return tuple(ranges)


def ranges_tree(spans: Sequence[WorkerSpan]) -> MerkleTree:
    """The range tree over ``spans`` (what ``submitCertificates`` computes on chain)."""
    return build_tree([span.leaf() for span in span_ranges(spans)])


def span_disagreement(span: SpanRange, hop: CertifiedHop) -> str | None:
    """What a leaf at an index of ``span`` contradicts in it (``Disputes.proveBadSpan``'s
    rule), or None: the leaf names another worker, or it is the span's last leaf and its units
    do not end at the span's end."""
    if not span.firstIndex <= hop.index <= span.lastIndex:
        return None
    if hop.worker.lower() != span.worker.lower():
        return f"leaf {hop.index} of {hop.worker} lies in the span of {span.worker}"
    end = hop.unitsBefore + hop.units
    if hop.index == span.lastIndex and end != span.unitsEnd:
        return f"the span of {span.worker} ends at {span.unitsEnd} units, its last leaf at {end}"
    return None


def check_signatures(entry: SignedReceipt, domain: Eip712Domain) -> bytes:
    """The receipt's digest, or a ``ProtocolError`` unless the receipt is signed by its worker
    and countersigned by its counterparty, two different keys: the part of the certification
    rules that needs no chain (membership and bonds are the data node's to check against it)."""
    receipt = entry.receipt
    if receipt.worker == receipt.counterparty:
        raise ProtocolError(f"a receipt of {receipt.worker} is countersigned by its own worker")
    digest = receipt_digest(receipt, domain)
    signed = entry.signing_digest(domain, digest)
    if recover_digest_signer(signed, entry.worker_signature) != receipt.worker:
        raise ProtocolError(f"the worker signature is not {receipt.worker}'s")
    if recover_digest_signer(signed, entry.counterparty_signature) != receipt.counterparty:
        raise ProtocolError(f"the countersignature is not {receipt.counterparty}'s")
    return digest


@dataclass(frozen=True)
class PreparedHop:
    """A signed receipt with the hashes its leaf needs, computed once (a data node prepares
    each receipt as it is reported, so an epoch's end only sorts and builds the tree)."""

    entry: SignedReceipt
    hop_key: bytes
    receipt_digest: bytes
    signatures_hash: bytes

    @classmethod
    def of(
        cls, entry: SignedReceipt, domain: Eip712Domain, digest: bytes | None = None
    ) -> PreparedHop:
        return cls(
            entry,
            hop_key(entry.receipt),
            digest if digest is not None else receipt_digest(entry.receipt, domain),
            entry.signatures_hash(),
        )


def build_certificate_tree(
    entries: Sequence[SignedReceipt], domain: Eip712Domain
) -> CertificateTree:
    """The honest tree of ``entries``: sorted by (worker, hop key), prefix sums from 0. The same
    hop twice is an error: a data node certifies each hop once."""
    return tree_of_prepared([PreparedHop.of(e, domain) for e in entries])


def tree_of_prepared(prepared: Sequence[PreparedHop]) -> CertificateTree:
    """``build_certificate_tree`` of receipts whose hashes are already computed."""
    if not prepared:
        raise ProtocolError("a certificate tree needs at least one hop")
    ordered = sorted(prepared, key=lambda p: (int(p.entry.receipt.worker, 16), p.hop_key))
    hops: list[CertifiedHop] = []
    running = 0
    for index, p in enumerate(ordered):
        receipt = p.entry.receipt
        if index and hops[-1].hopKey == p.hop_key and hops[-1].worker == receipt.worker:
            raise ProtocolError(f"hop {p.hop_key.hex()} of {receipt.worker} is certified twice")
        hops.append(
            CertifiedHop(
                index, running, receipt.worker, receipt.units, p.hop_key, p.receipt_digest,
                p.signatures_hash,
            )
        )  # fmt: skip
        running += receipt.units
    return _tree(hops, tuple(p.entry for p in ordered), spans_of(hops))


def tree_of_hops(
    hops: Sequence[CertifiedHop], spans: Sequence[WorkerSpan] | None = None
) -> CertificateTree:
    """The tree of ``hops`` exactly as given (an auditor rebuilding a published tree, or a test
    building a dishonest one), with ``spans`` or else those its layout gives (``spans_of``);
    no rule is checked."""
    if not hops:
        raise ProtocolError("a certificate tree needs at least one hop")
    return _tree(
        hops, tuple(None for _ in hops), tuple(spans) if spans is not None else spans_of(hops)
    )


def _tree(
    hops: Sequence[CertifiedHop],
    entries: tuple[SignedReceipt | None, ...],
    spans: tuple[WorkerSpan, ...] | None,
) -> CertificateTree:
    return CertificateTree(
        tuple(hops),
        entries,
        build_tree([h.leaf() for h in hops]),
        spans,
        ranges_tree(spans) if spans else None,
    )
