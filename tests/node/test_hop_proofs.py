"""A worker keeps the proofs of its own hops in a certificate only after checking each one: its
own leaf, at the index it asked, in the tree of the root on chain."""

from __future__ import annotations

from dataclasses import replace

import pytest
from eth_utils.crypto import keccak

from gwtf.contracts.certificate_tree import LeafProof, tree_of_hops
from gwtf.contracts.encoding import CertifiedHop
from gwtf.contracts.merkle import verify_proof
from gwtf.errors import ProtocolError
from gwtf.node.receipts.epochs import _check_range
from gwtf.node.receipts.proofs import checked_proofs

A, B = "0x" + "aa" * 20, "0x" + "bb" * 20


def tree():  # type: ignore[no-untyped-def]
    workers = [A, A, B, B, B, "0x" + "cc" * 20]
    hops = [
        CertifiedHop(i, 10 * i, worker, 10, keccak(b"k%d" % i), keccak(b"r%d" % i),
                     keccak(b"s%d" % i))
        for i, worker in enumerate(workers)
    ]  # fmt: skip
    return tree_of_hops(hops)


def test_a_workers_leaves_are_kept_with_proofs_that_check_against_the_root() -> None:
    t = tree()
    span = t.worker_range(B)
    assert span is not None
    leaves = [t.leaf_proof(i) for i in (2, 3, 4)]
    kept = checked_proofs(leaves, span, t.root)
    assert [k.leaf_index for k in kept] == [2, 3, 4]
    for k, leaf in zip(kept, leaves, strict=True):
        assert k.hop_key == leaf.hop.hopKey and k.root == t.root
        assert verify_proof(k.proof, t.root, leaf.hop.leaf())


@pytest.mark.parametrize("forgery", ["another's leaf", "a leaf out of place", "a wrong proof",
                                     "another root"])  # fmt: skip
def test_a_leaf_served_wrong_keeps_nothing(forgery: str) -> None:
    t = tree()
    span = t.worker_range(B)
    assert span is not None
    leaves = [t.leaf_proof(i) for i in (2, 3, 4)]
    root = t.root
    if forgery == "another's leaf":
        leaves[1] = t.leaf_proof(1)
    elif forgery == "a leaf out of place":
        leaves[0], leaves[1] = leaves[1], leaves[0]
    elif forgery == "a wrong proof":
        leaves[2] = LeafProof(replace(leaves[2].hop, units=11), leaves[2].proof)
    else:
        root = keccak(b"elsewhere")
    with pytest.raises(ProtocolError):
        checked_proofs(leaves, span, root)


@pytest.mark.parametrize("served", ["its span", "another's span proof", "a sub-range"])
def test_a_range_is_claimed_only_when_it_is_the_span_committed_on_chain(served: str) -> None:
    """Before it claims, a worker checks the range its data node serves against the root and the
    span root of the certificate on chain: a range that is not its span would be refused."""
    t = tree()
    assert t.ranges is not None
    span = t.worker_range(B)
    other = t.worker_range(A)
    assert span is not None and other is not None
    if served == "another's span proof":
        span = replace(span, range_proof=other.range_proof)
    elif served == "a sub-range":
        span = replace(span, last=span.first)
    if served == "its span":
        _check_range(span, t.root, t.ranges.root, span.worker)
        return
    with pytest.raises(ProtocolError, match="span it committed"):
        _check_range(span, t.root, t.ranges.root, span.worker)
