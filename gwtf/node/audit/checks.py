"""What an auditor checks of an epoch's certificates and receipts, and the fraud proof of each
finding the chain judges alone. Pure: the chain's answers come in as values and callables.

The rules are ``Disputes.sol``'s, one for one, so a finding with a proof is one the chain
convicts on, and an honest tree yields none:

* **invalid hop** (``proveInvalidHop``): a leaf whose receipt is off the run's schedule (run,
  epoch, data node, relay stage, direction, units), does not match its leaf (worker, units, hop
  key), is countersigned by its own worker, lacks either party's signature, or names a worker
  that was no bonded member of the run during the epoch, or a counterparty that was neither a
  bonded member nor one of its data nodes;
* **bad totals** (``proveBadTotals``): a leaf beyond the count, leaf 0 with units before it, the
  last leaf not ending at the certificate's units;
* **bad sequence** (``proveBadSequence``): two different leaves with one index, or adjacent
  leaves whose prefix sums do not chain or that are not strictly increasing in (worker, hop key);
* **bad span** (``proveBadSpan``): a span committed with the certificate (read from the
  transaction that submitted it, or served by the data node when a contract wallet submitted
  it; checked against the certificate's ranges root) that covers a leaf of another worker, or
  whose units end off its last leaf's. Held only against a tree no other proof convicts: one
  conviction voids the certificate, and the rule assumes leaves in order;
* **equivocation** (``proveEquivocation``): two different receipts of one hop key signed by one
  key, the worker of both (and counterparty of neither) or the counterparty of both (and not the
  worker), across everything the auditor has seen.

What the chain cannot judge is reported without a proof: leaves a data node served fewer of
than its count (``withheld``), a served leaf not in the tree, a served receipt that is not its
leaf's or served spans that are not the certificate's (``unproven``), and, accusing nobody, a
certificate the auditor could not read whole, leaves or spans (``unchecked``: unreachable,
throttled, or a page that broke off). A data node read through a forwarder (it cannot be
dialled) answers for no byte the forwarder passed on: leaves that do not verify against the
certificate's root, or whose receipt is not the leaf's, are ``unverified`` (``unverified_leaves``),
accusing nobody, as is a forwarded reading that ends short of the certificate's count.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from gwtf.contracts import fraud_proofs
from gwtf.contracts.certificate_tree import (
    LeafProof,
    SignedReceipt,
    SpanProof,
    ranges_tree,
    span_disagreement,
    span_ranges,
)
from gwtf.contracts.encoding import (
    BACKWARD,
    CertifiedHop,
    CertRef,
    Eip712Domain,
    WorkerSpan,
    hop_key,
    receipt_digest,
    recover_digest_signer,
    scheduled_units,
)
from gwtf.contracts.fraud_proofs import FraudProof
from gwtf.contracts.merkle import MerkleTree, build_tree, verify_proof
from gwtf.errors import ProtocolError

INVALID_HOP: Final = "invalid hop"
BAD_TOTALS: Final = "bad totals"
BAD_SEQUENCE: Final = "bad sequence"
BAD_SPAN: Final = "bad span"
EQUIVOCATION: Final = "equivocation"
WITHHELD: Final = "withheld"
UNPROVEN: Final = "unproven"
UNCHECKED: Final = "unchecked"
UNVERIFIED: Final = "unverified"
#: Versions of one hop kept per signer while looking for a second: enough for any honest mix of
#: a receipt seen from several nodes, and a bound on what a peer's made-up versions cost.
MAX_VERSIONS: Final = 4


class TookPart(Protocol):
    """Whether a node (its address) took part in the run during the epoch, as a member or,
    with ``or_data_node``, as a data node: the chain's ``wasMemberDuring`` (or
    ``wasDataNodeBefore``) and ``bondedDuring``. Blocks on the chain (the audit runs it in a
    worker thread); what the chain's client raises when it does not answer goes through."""

    def __call__(self, node: str, or_data_node: bool, /) -> bool: ...


@dataclass(frozen=True)
class RunRules:
    """What the chain knows of a run that a hop's validity depends on."""

    stages: int
    units_per_hop: int
    domain: Eip712Domain


@dataclass(frozen=True)
class Finding:
    """One thing wrong: its kind, the node it accuses, what was seen, and the fraud proof the
    chain judges it by (None: no contract judges it alone, or no longer); ``judged`` when the
    chain has convicted on it already (the certificate voided, the signer slashed)."""

    kind: str
    accused: str
    detail: str
    proof: FraudProof | None = None
    judged: bool = False

    def as_json(self) -> dict[str, object]:
        """The finding as the audit's JSON reports it."""
        return {
            "kind": self.kind,
            "accused": self.accused,
            "detail": self.detail,
            "provable_on_chain": self.proof is not None,
            "judged": self.judged,
            "fraud_proof": self.proof.function if self.proof is not None else None,
        }


def audit_certificate(
    cert: CertRef,
    served: Sequence[tuple[SignedReceipt, LeafProof]],
    rules: RunRules,
    took_part: TookPart,
    *,
    complete: bool = True,
    spans: Sequence[WorkerSpan] | None = None,
) -> list[Finding]:
    """Every finding in what a data node served of ``cert`` (each receipt with its leaf, and
    the spans it committed, when read); ``complete`` False: the auditor read only part of it,
    so what is missing is not counted."""
    findings: list[Finding] = []
    proven: dict[int, list[LeafProof]] = defaultdict(list)
    took = _cached(took_part)
    rebuilt = _whole_tree(cert, served)

    def with_proof(leaf: LeafProof) -> LeafProof:
        """The leaf with a proof the chain accepts. A tree served whole was rebuilt, so its
        leaves are known to be in it and a proof is built only for a finding that needs one."""
        if rebuilt is None:
            return leaf
        return LeafProof(leaf.hop, tuple(rebuilt.proof(leaf.hop.index)))

    for entry, leaf in served:
        hop = leaf.hop
        if rebuilt is None and not verify_proof(leaf.proof, cert.root, hop.leaf()):
            findings.append(
                Finding(UNPROVEN, cert.dataNode, f"leaf {hop.index} is not in the tree")
            )
            continue
        proven[hop.index].append(leaf)
        if _contradicts_totals(cert, hop):
            findings.append(
                Finding(
                    BAD_TOTALS,
                    cert.dataNode,
                    f"leaf {hop.index} contradicts count or units",
                    fraud_proofs.bad_totals(cert, with_proof(leaf)),
                )
            )
        if not _is_the_leafs(entry, hop, rules.domain):
            detail = f"the receipt served for leaf {hop.index} is not the leaf's"
            findings.append(Finding(UNPROVEN, cert.dataNode, detail))
            continue
        why = invalid_because(cert, hop, entry, rules, took)
        if why is not None:
            findings.append(
                Finding(
                    INVALID_HOP,
                    cert.dataNode,
                    f"leaf {hop.index}: {why}",
                    fraud_proofs.invalid_hop(cert, with_proof(leaf), entry),
                )
            )
    findings.extend(_sequence_findings(cert, proven, with_proof))
    if spans is not None and not any(f.proof is not None for f in findings):
        findings.extend(span_findings(cert, spans, proven, with_proof))
    missing = cert.count - len([i for i in proven if i < cert.count])
    if complete and missing > 0:
        detail = f"{missing} of {cert.count} leaves not served"
        findings.append(Finding(WITHHELD, cert.dataNode, detail))
    return findings


def unverified_leaves(
    cert: CertRef, served: Sequence[tuple[SignedReceipt, LeafProof]], domain: Eip712Domain
) -> list[int]:
    """The indices of the leaves in ``served`` that are not in ``cert``'s tree or whose receipt
    is not the leaf's: what a forwarder may have made up, since the leaves, their proofs and
    the signed receipts are all a forwarder cannot forge. One rebuild of the tree when it was
    served whole, else one proof per leaf."""
    rebuilt = _whole_tree(cert, served)
    return [
        leaf.hop.index
        for entry, leaf in served
        if not _verifies(cert, rebuilt, entry, leaf, domain)
    ]


def verifying_leaves(
    cert: CertRef, served: Sequence[tuple[SignedReceipt, LeafProof]], domain: Eip712Domain
) -> list[tuple[SignedReceipt, LeafProof]]:
    """The entries of ``served`` that verify (``unverified_leaves``' complement), each judged
    on its own: a made-up entry served beside the true one at the same index drops only
    itself."""
    rebuilt = _whole_tree(cert, served)
    return [(e, leaf) for e, leaf in served if _verifies(cert, rebuilt, e, leaf, domain)]


def _verifies(
    cert: CertRef,
    rebuilt: MerkleTree | None,
    entry: SignedReceipt,
    leaf: LeafProof,
    domain: Eip712Domain,
) -> bool:
    in_tree = rebuilt is not None or verify_proof(leaf.proof, cert.root, leaf.hop.leaf())
    return in_tree and _is_the_leafs(entry, leaf.hop, domain)


def with_root_proofs(
    cert: CertRef,
    served: Sequence[tuple[SignedReceipt, LeafProof]],
    leaves: Sequence[tuple[SignedReceipt, LeafProof]],
) -> list[tuple[SignedReceipt, LeafProof]]:
    """``leaves`` (of ``served``, that verify: ``unverified_leaves``), each with a proof that
    leads to ``cert``'s root: its own, or, where the tree was served whole and checked by
    rebuilding it, the rebuilt tree's, since the proofs served with a whole tree are never
    checked and a data node could serve them broken to make a fraud proof the chain refuses.
    A leaf with neither (it was not verified) is dropped."""
    rebuilt: MerkleTree | None = None
    kept = []
    for entry, leaf in leaves:
        if not verify_proof(leaf.proof, cert.root, leaf.hop.leaf()):
            if rebuilt is None:
                rebuilt = _whole_tree(cert, served)
            if rebuilt is None:
                continue
            leaf = LeafProof(leaf.hop, tuple(rebuilt.proof(leaf.hop.index)))
        kept.append((entry, leaf))
    return kept


def span_findings(
    cert: CertRef,
    spans: Sequence[WorkerSpan],
    proven: dict[int, list[LeafProof]],
    with_proof: Callable[[LeafProof], LeafProof],
) -> list[Finding]:
    """The first leaf of each span that contradicts it (``proveBadSpan``), among the leaves
    ``proven`` in the tree by index; the spans must be the certificate's (its ranges root).
    Walks the leaves read, never the spans' index ranges, which a data node chooses."""
    range_tree = ranges_tree(spans) if spans else None
    if range_tree is None or range_tree.root != cert.rangesRoot:
        return [Finding(UNPROVEN, cert.dataNode, "the spans served are not the certificate's")]
    ranges = span_ranges(spans)
    lasts = [span.lastIndex for span in ranges]
    findings: list[Finding] = []
    reported: set[int] = set()
    for index in sorted(proven):
        k = bisect.bisect_left(lasts, index)  # the span holding ``index``: they partition
        if k == len(ranges) or k in reported:
            continue
        span = ranges[k]
        leaf = next((leaf for leaf in proven[index] if span_disagreement(span, leaf.hop)), None)
        if leaf is None:
            continue
        reported.add(k)
        why = span_disagreement(span, leaf.hop)
        shown = SpanProof(span, tuple(range_tree.proof(k)))
        proof = fraud_proofs.bad_span(cert, shown, with_proof(leaf))
        findings.append(Finding(BAD_SPAN, cert.dataNode, f"span {k}: {why}", proof))
    return findings


def _whole_tree(
    cert: CertRef, served: Sequence[tuple[SignedReceipt, LeafProof]]
) -> MerkleTree | None:
    """The certificate's tree rebuilt from what was served, when that is every leaf once, in
    index order, and its root is the certificate's: n hashes instead of one proof (log n
    hashes) per leaf. None otherwise, and each leaf's own proof is checked."""
    if len(served) != cert.count or any(leaf.hop.index != i for i, (_, leaf) in enumerate(served)):
        return None
    try:
        tree = build_tree([leaf.hop.leaf() for _, leaf in served])
    except ProtocolError:
        return None
    return tree if tree.root == cert.root else None


def invalid_because(
    cert: CertRef, hop: CertifiedHop, entry: SignedReceipt, rules: RunRules, took_part: TookPart
) -> str | None:
    """Why ``Disputes._isValidHop`` would find the leaf's hop invalid, or None when valid."""
    r = entry.receipt
    if (r.runId, r.epoch, r.dataNode.lower()) != (cert.runId, cert.epoch, cert.dataNode.lower()):
        return "a receipt of another run, epoch or data node"
    if not 1 <= r.stage <= rules.stages or r.direction > BACKWARD:
        return f"stage {r.stage} direction {r.direction} is off the run"
    if r.units != scheduled_units(r.direction, rules.units_per_hop):
        return f"{r.units} units, off the run's schedule"
    if hop.worker.lower() != r.worker.lower() or hop.units != r.units or hop.hopKey != hop_key(r):
        return "the leaf does not match its receipt"
    if r.worker.lower() == r.counterparty.lower():
        return "countersigned by its own worker"
    signed = entry.signing_digest(rules.domain, hop.receiptDigest)
    if _signer(signed, entry.worker_signature) != r.worker.lower():
        return "the worker signature is not the worker's"
    if _signer(signed, entry.counterparty_signature) != r.counterparty.lower():
        return "the countersignature is not the counterparty's"
    if not took_part(r.worker, False):
        return f"worker {r.worker} was no bonded member during the epoch"
    if not took_part(r.counterparty, True):
        return f"counterparty {r.counterparty} was neither a bonded member nor a data node"
    return None


def equivocations(entries: Iterable[SignedReceipt], domain: Eip712Domain) -> list[Finding]:
    """Each key that signed two different receipts of one hop in one role, once. Linear: each
    signature is recovered once, and each (hop key, signer) keeps its first few versions."""
    versions: dict[tuple[bytes, str], list[tuple[bytes, SignedReceipt, bytes]]] = defaultdict(list)
    findings: list[Finding] = []
    convicted: set[str] = set()
    for entry in entries:
        digest = receipt_digest(entry.receipt, domain)
        signed = entry.signing_digest(domain, digest)
        key = hop_key(entry.receipt)
        for signature in (entry.worker_signature, entry.counterparty_signature):
            signer = _signer(signed, signature)
            if not signer or signer in convicted:
                continue
            held = versions[(key, signer)]
            for other_digest, other, other_signature in held:
                if other_digest == digest:
                    break
                finding = _equivocation(signer, other, other_signature, entry, signature)
                if finding is not None:
                    convicted.add(signer)
                    findings.append(finding)
                    break
            else:
                if len(held) < MAX_VERSIONS:
                    held.append((digest, entry, signature))
    return findings


def _equivocation(
    signer: str,
    first: SignedReceipt,
    first_signature: bytes,
    second: SignedReceipt,
    second_signature: bytes,
) -> Finding | None:
    """The finding if ``signer``'s role in both receipts is one the contract convicts."""
    a, b = first.receipt, second.receipt
    as_worker = signer == a.worker.lower() and signer not in (
        a.counterparty.lower(), b.counterparty.lower()
    )  # fmt: skip
    as_counterparty = (
        signer == a.counterparty.lower() == b.counterparty.lower() and signer != a.worker.lower()
    )
    if not (as_worker or as_counterparty):
        return None
    accused = a.worker if as_worker else a.counterparty
    proof = fraud_proofs.equivocation(
        accused, a, first_signature, b, second_signature, first.proof, second.proof
    )
    role = "worker" if as_worker else "counterparty"
    detail = f"signed two receipts of one hop of microbatch {a.microbatchId} as {role}"
    return Finding(EQUIVOCATION, accused, detail, proof)


def _contradicts_totals(cert: CertRef, hop: CertifiedHop) -> bool:
    return (
        hop.index >= cert.count
        or (hop.index == 0 and hop.unitsBefore != 0)
        or (hop.index == cert.count - 1 and hop.unitsBefore + hop.units != cert.units)
    )


def _sequence_findings(
    cert: CertRef,
    proven: dict[int, list[LeafProof]],
    with_proof: Callable[[LeafProof], LeafProof],
) -> list[Finding]:
    findings = []
    for index, leaves in sorted(proven.items()):
        distinct = {leaf.hop.leaf(): leaf for leaf in leaves} if len(leaves) > 1 else {}
        if len(distinct) > 1:
            first, second = list(distinct.values())[:2]
            proof = fraud_proofs.bad_sequence(cert, with_proof(first), with_proof(second))
            findings.append(Finding(BAD_SEQUENCE, cert.dataNode, f"two leaves {index}", proof))
        following = proven.get(index + 1)
        if following and _breaks(leaves[0].hop, following[0].hop):
            proof = fraud_proofs.bad_sequence(cert, with_proof(leaves[0]), with_proof(following[0]))
            detail = f"leaves {index} and {index + 1} do not chain"
            findings.append(Finding(BAD_SEQUENCE, cert.dataNode, detail, proof))
    return findings


def _breaks(hop: CertifiedHop, following: CertifiedHop) -> bool:
    ordered = (int(hop.worker, 16), hop.hopKey) < (int(following.worker, 16), following.hopKey)
    return hop.unitsBefore + hop.units != following.unitsBefore or not ordered


def _is_the_leafs(entry: SignedReceipt, hop: CertifiedHop, domain: Eip712Domain) -> bool:
    return (
        hop.receiptDigest == receipt_digest(entry.receipt, domain)
        and hop.signaturesHash == entry.signatures_hash()
    )


@functools.lru_cache(maxsize=1 << 18)
def _signer(digest: bytes, signature: bytes) -> str:
    """The signer's address in lower case, or "" where OpenZeppelin's ``tryRecover`` fails.
    Cached: an audit recovers each signature of a certificate's leaves again when it looks for
    equivocations, and recovery is most of an audit's time (``bench/audit.py``)."""
    try:
        return recover_digest_signer(digest, signature).lower()
    except ProtocolError:
        return ""


def _cached(took_part: TookPart) -> TookPart:
    answers: dict[tuple[str, bool], bool] = {}

    def cached(node: str, or_data_node: bool) -> bool:
        key = (node.lower(), or_data_node)
        if key not in answers:
            answers[key] = took_part(node, or_data_node)
        return answers[key]

    return cached
