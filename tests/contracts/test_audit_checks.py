"""The auditor's checks (``gwtf/node/audit/checks.py``) against the real contracts: an honest
certificate yields no finding; each kind of fraud is found, and its proof convicts on chain;
what the chain cannot judge is reported without a proof."""

from __future__ import annotations

from dataclasses import replace

from eth_utils.crypto import keccak

from gwtf.contracts.certificate_tree import LeafProof, SignedReceipt, tree_of_hops
from gwtf.contracts.encoding import WorkerSpan, sign_receipt
from gwtf.contracts.fraud_proofs import Fraud
from gwtf.node.audit.checks import (
    BAD_SEQUENCE,
    BAD_SPAN,
    BAD_TOTALS,
    EQUIVOCATION,
    INVALID_HOP,
    UNPROVEN,
    UNVERIFIED,
    WITHHELD,
    Finding,
    RunRules,
    TookPart,
    audit_certificate,
    equivocations,
    unverified_leaves,
    verifying_leaves,
)
from gwtf.node.audit.replays import draw_indices, draw_sample
from gwtf.node.audit.runner import LeafReader, LeafReading
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.epochs import EpochLedger
from tests.contracts.conftest import Certified, Staffed
from tests.contracts.test_disputes import assert_slashed, certified_with, hand_made, one_hop
from tests.contracts.test_node_epoch_cycle import suite_of
from tests.contracts.world import ETH, STAGES, UNITS_PER_HOP, World


def rules_of(w: World) -> RunRules:
    return RunRules(STAGES, UNITS_PER_HOP, w.ledger_domain)


def took_part(s: Staffed) -> TookPart:
    """The chain's answer, as the audit command asks it."""
    ledger = EpochLedger(suite_of(s.w), s.run, Sender.unlocked(s.w.sponsor))
    return lambda node, or_data_node: ledger.took_part(node, 0, or_data_node=or_data_node)


def served(tree: object) -> list[tuple[SignedReceipt, LeafProof]]:
    entries = tree.entries  # type: ignore[attr-defined]
    return [(entries[i], tree.leaf_proof(i)) for i in range(len(entries))]  # type: ignore[attr-defined]


def kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


def test_an_honest_certificate_and_its_receipts_yield_no_finding(certified: Certified) -> None:
    w = certified.w
    for spans in (None, certified.tree.spans):
        findings = audit_certificate(
            certified.cert, served(certified.tree), rules_of(w), took_part(certified),
            spans=spans,
        )  # fmt: skip
        assert findings == []
    assert equivocations([e for e in certified.tree.entries if e], w.ledger_domain) == []


def test_an_invalid_hop_is_found_and_its_proof_slashes_the_data_node(staffed: Staffed) -> None:
    w = staffed.w
    ghost = w.register("ghost", w.stranger)  # bonded, but never in the run
    tree, cert = certified_with(
        staffed,
        [one_hop(staffed), one_hop(staffed, worker_key=ghost, microbatchId=1)],
    )
    findings = audit_certificate(cert, served(tree), rules_of(w), took_part(staffed))
    assert kinds(findings) == [INVALID_HOP]
    (finding,) = findings
    assert "no bonded member" in finding.detail and finding.accused == staffed.data.address
    assert finding.proof is not None
    assert_slashed(w, w.prove(finding.proof), staffed.data, Fraud.INVALID_HOP, 2 * ETH)


def test_units_off_the_schedule_and_a_forged_countersignature_are_invalid_hops(
    staffed: Staffed,
) -> None:
    w = staffed.w
    good = one_hop(staffed, microbatchId=2)
    forged = SignedReceipt(good.receipt, good.worker_signature, good.worker_signature)
    tree, cert = certified_with(staffed, [one_hop(staffed, units=UNITS_PER_HOP + 1), forged])
    findings = audit_certificate(cert, served(tree), rules_of(w), took_part(staffed))
    assert kinds(findings) == [INVALID_HOP, INVALID_HOP]
    details = " ".join(f.detail for f in findings)
    assert "schedule" in details and "countersignature" in details


def test_bad_totals_and_a_broken_sequence_are_found_with_proofs_the_chain_takes(
    staffed: Staffed,
) -> None:
    w = staffed.w
    low, high = sorted((staffed.a, staffed.b), key=lambda k: int(k.address, 16))
    # Leaf 1 does not chain from leaf 0, and the last leaf ends short of the units claimed.
    tree = hand_made(w, staffed, [(0, 0, low, 100, 1), (1, 150, high, 100, 2)])
    w.to_submission(staffed.run, 0)
    cert = w.cert_of(tree, staffed.run, 0, staffed.data.address, count=2, units=300)
    w.submit(cert)
    # Whatever receipts the data node serves with such leaves, they are not the leaves'.
    some = one_hop(staffed)
    pairs = [(some, tree.leaf_proof(i)) for i in range(2)]
    findings = audit_certificate(cert, pairs, rules_of(w), took_part(staffed))
    assert sorted(kinds(findings)) == sorted([BAD_TOTALS, UNPROVEN, UNPROVEN, BAD_SEQUENCE])
    sequence = next(f for f in findings if f.kind == BAD_SEQUENCE)
    assert sequence.proof is not None
    assert_slashed(w, w.prove(sequence.proof), staffed.data, Fraud.BAD_SEQUENCE, 2 * ETH)


def test_a_counterparty_signing_two_versions_is_found_and_slashed(certified: Certified) -> None:
    w, b = certified.w, certified.b
    entry = next(e for e in certified.tree.entries if e and e.receipt.counterparty == b.address)
    other = replace(entry.receipt, outputDigest=keccak(text="another output"))
    second = SignedReceipt(
        other, entry.worker_signature, sign_receipt(other, w.ledger_domain, b.private_key)
    )
    seen = [e for e in certified.tree.entries if e] + [second, second]
    (finding,) = equivocations(seen, w.ledger_domain)
    assert finding.kind == EQUIVOCATION and finding.accused == b.address
    assert finding.proof is not None
    assert_slashed(w, w.prove(finding.proof), b, Fraud.EQUIVOCATION, 4 * ETH)


def test_leaves_a_data_node_will_not_serve_or_cannot_prove_are_reported_without_proof(
    certified: Certified,
) -> None:
    w, tree, cert = certified.w, certified.tree, certified.cert
    pairs = served(tree)
    entry, leaf = pairs[0]
    outside = LeafProof(replace(leaf.hop, units=leaf.hop.units + 1), leaf.proof)
    findings = audit_certificate(
        cert, [*pairs[2:], (entry, outside)], rules_of(w), took_part(certified)
    )
    assert sorted(kinds(findings)) == [UNPROVEN, WITHHELD]
    assert all(f.proof is None for f in findings)
    assert "2 of" in next(f for f in findings if f.kind == WITHHELD).detail


def test_what_a_forwarder_may_have_made_up_is_each_leaf_off_the_root_or_not_its_receipts(
    certified: Certified,
) -> None:
    w, tree, cert = certified.w, certified.tree, certified.cert
    pairs = served(tree)
    assert unverified_leaves(cert, pairs, w.ledger_domain) == []  # whole: one rebuild
    assert unverified_leaves(cert, pairs[1:], w.ledger_domain) == []  # in part: each proof
    (entry, leaf), (other, _) = pairs[0], pairs[1]
    outside = LeafProof(replace(leaf.hop, units=leaf.hop.units + 1), leaf.proof)
    assert unverified_leaves(cert, [(entry, outside), *pairs[1:]], w.ledger_domain) == [0]
    swapped = [(other, leaf), *pairs[1:]]  # leaf 0 with leaf 1's receipt
    assert unverified_leaves(cert, swapped, w.ledger_domain) == [0]


def test_a_made_up_entry_beside_the_true_one_drops_only_itself_and_cannot_steer_the_draw(
    certified: Certified,
) -> None:
    """Entries a data node makes up at a true leaf's index, for that leaf's worker, are dropped
    each on its own: the true leaf stays, and the sample drawn from what verifies is not
    steered by made-up digests that would rank ahead of it."""
    w, tree, cert = certified.w, certified.tree, certified.cert
    pairs = served(tree)
    entry, leaf = pairs[0]
    made_up = [
        (entry, LeafProof(replace(leaf.hop, receiptDigest=keccak(bytes([k]))), leaf.proof))
        for k in range(8)
    ]
    mixed = [*made_up, *pairs]
    assert verifying_leaves(cert, mixed, w.ledger_domain) == pairs
    seeds = (bytes([i]) * 32 for i in range(256))
    steered = next(s for s in seeds if any(p in made_up for p in draw_sample(s, mixed, 1)))
    drawn = draw_sample(steered, verifying_leaves(cert, mixed, w.ledger_domain), 1)
    assert not any(p in made_up for p in drawn)
    assert any(p[0].receipt.worker == entry.receipt.worker for p in drawn)


def test_a_whole_tree_served_is_checked_by_its_root_and_proven_with_its_own_proofs(
    staffed: Staffed,
) -> None:
    """Every leaf served in order: the auditor rebuilds the tree once instead of checking each
    proof, and a finding's proof comes from that tree, so a data node serving garbage proofs
    with its leaves cannot spoil the fraud proof. A leaf that is not the tree's falls back to
    each proof checked."""
    w = staffed.w
    ghost = w.register("ghost", w.stranger)
    tree, cert = certified_with(
        staffed,
        [one_hop(staffed), one_hop(staffed, worker_key=ghost, microbatchId=1)],
    )
    garbage = [(e, LeafProof(leaf.hop, (keccak(text="junk"),))) for e, leaf in served(tree)]
    (finding,) = audit_certificate(cert, garbage, rules_of(w), took_part(staffed))
    assert finding.kind == INVALID_HOP and finding.proof is not None
    # Tampered: the rebuilt root differs, so each garbage proof is checked, and fails.
    entry, leaf = garbage[0]
    tampered = [(entry, LeafProof(replace(leaf.hop, units=leaf.hop.units + 1), leaf.proof))]
    findings = audit_certificate(cert, tampered + garbage[1:], rules_of(w), took_part(staffed))
    assert kinds(findings) == [UNPROVEN, UNPROVEN, WITHHELD]
    assert_slashed(w, w.prove(finding.proof), staffed.data, Fraud.INVALID_HOP, 2 * ETH)


def test_the_re_execution_sample_takes_every_worker_of_a_certificate(staffed: Staffed) -> None:
    """A sample of k hops per certificate alone would reach a relay holding a small share of a
    large certificate's hops too rarely to deter wrong tensors (gwtf/contracts/README.md): each
    worker's first-ranked hop is taken whatever k, then the next ranked up to k."""
    s, w = staffed, staffed.w
    tree = w.certificate_tree(w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], range(8)))
    served = [
        (entry, tree.leaf_proof(i))
        for i, entry in enumerate(tree.entries)
        if entry is not None and entry.receipt.worker in (s.a.address, s.b.address)
    ]
    relays = {s.a.address, s.b.address}
    for seed in (keccak(b"block one"), keccak(b"block two"), keccak(b"block three")):
        ranked = sorted(served, key=lambda p: keccak(seed + p[1].hop.receiptDigest))
        for k in (0, 1, 2):
            sample = draw_sample(seed, served, k)
            assert sorted(e.receipt.worker for e, _ in sample) == sorted(relays)
            for entry, _ in sample:  # each worker's first-ranked hop
                first = next(e for e, _ in ranked if e.receipt.worker == entry.receipt.worker)
                assert entry == first
        sample = draw_sample(seed, served, 5)
        assert len(sample) == 5 and {e.receipt.worker for e, _ in sample} == relays
        assert [p for p in ranked if p in sample] == sample  # in rank order
        assert len(draw_sample(seed, served, 10 * len(served))) == len(served)


def test_spans_off_the_tree_are_found_and_their_proof_slashes_the_data_node(
    staffed: Staffed,
) -> None:
    """The data node's valid tree with spans that move a's last leaf into b's span: the
    auditor, given the spans the data node serves, finds the leaf in the wrong span and its
    proof convicts; spans served that are not the certificate's prove nothing."""
    w, run, data = staffed.w, staffed.run, staffed.data
    honest = w.certificate_tree(w.pipeline_hops(run, 0, data, [staffed.a, staffed.b], range(2)))
    assert honest.spans is not None
    first, second = honest.spans
    moved = first.lastIndex
    shifted = (
        replace(first, lastIndex=moved - 1, unitsEnd=honest.hops[moved].unitsBefore),
        second,
    )
    tree = replace(tree_of_hops(honest.hops, shifted), entries=honest.entries)
    cert = w.cert_of(tree, run, 0, data.address, spans=shifted)
    w.to_submission(run, 0)
    w.submit(cert, spans=shifted)
    rules, took = rules_of(w), took_part(staffed)
    wrong = audit_certificate(cert, served(tree), rules, took, spans=honest.spans)
    assert [(f.kind, f.detail, f.proof) for f in wrong] == [
        (UNPROVEN, "the spans served are not the certificate's", None)
    ]
    findings = audit_certificate(cert, served(tree), rules, took, spans=shifted)
    assert kinds(findings) == [BAD_SPAN]
    (finding,) = findings
    assert f"leaf {moved} of {honest.hops[moved].worker} lies in the span of" in finding.detail
    assert finding.proof is not None and finding.accused == data.address
    assert_slashed(w, w.prove(finding.proof), data, Fraud.BAD_SPAN, 2 * ETH)


def test_the_sample_is_drawn_over_the_committed_indices_one_in_each_relays_span() -> None:
    """The sample's indices come from the leaf count and spans on chain alone, so whatever a
    data node serves (or cuts short) cannot change them: one index in each relay's span, none
    in a data node's own span, then up to k in all, every index once."""
    relays, data_node = ["0x" + "0a" * 20, "0x" + "0c" * 20], "0x" + "0d" * 20
    spans = [
        WorkerSpan(relays[0], 9, 10),  # leaves 0-9
        WorkerSpan(relays[1], 10, 11),  # leaf 10
        WorkerSpan(data_node, 29, 30),  # leaves 11-29: the data node's own
    ]
    for seed in (keccak(b"block one"), keccak(b"block two"), keccak(b"block three")):
        for k in (0, 1, 2):
            drawn = draw_indices(seed, 30, spans, k, {data_node})
            assert len(drawn) == 2 and drawn[0] in range(10) and drawn[1] == 10
        drawn = draw_indices(seed, 30, spans, 5, {data_node})
        assert len(set(drawn)) == 5 and all(i <= 10 for i in drawn)
        assert sorted(draw_indices(seed, 30, spans, 100, {data_node})) == list(range(11))
        assert draw_indices(seed, 30, spans, 5, {data_node}) == drawn  # the same for everyone
        # No spans (a provider without old logs): indices over every leaf.
        assert len(set(draw_indices(seed, 30, None, 7, set()))) == 7


def test_sampled_leaves_nobody_serves_name_the_data_node_only_when_it_was_dialled(
    certified: Certified,
) -> None:
    """Asked directly, the data node serves its own certificate: a sampled leaf it and every
    forwarder withheld is its withholding. Read only through forwarders, any of which can
    withhold, it accuses nobody."""
    cert = certified.cert
    dialled = LeafReader(None, "peer", True, (), 1.0)
    (finding,) = dialled.findings(cert, LeafReading([], [3, 5], [], []), 8)
    assert finding.kind == WITHHELD and finding.accused == cert.dataNode
    assert "2 of 8 sampled leaves (first: leaf 3)" in finding.detail
    forwarded = LeafReader(None, "peer", False, ("forwarder",), 1.0)
    (finding,) = forwarded.findings(cert, LeafReading([], [], [3], []), 8)
    assert finding.kind == UNVERIFIED and finding.accused == ""
    assert dialled.findings(cert, LeafReading([], [], [], []), 8) == []
