"""Batches of receipts: what a worker signs and its counterparty countersigns once for many hops.

A batch holds receipts of one run and epoch in which one worker worked for one counterparty;
its ``HopBatch`` commits to the Merkle tree (``gwtf.contracts.merkle``, OpenZeppelin's layout)
over their digests in the order given. Each receipt then carries both signatures of the batch and
its proof in the tree (``SignedReceipt.proof``), which is all the disputes contract needs to
rebuild the batch from that receipt alone. Pure: no chain, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    Eip712Domain,
    HopBatch,
    HopReceipt,
    hop_key,
    receipt_digest,
    sign_digest,
)
from gwtf.contracts.merkle import MerkleTree, build_tree
from gwtf.errors import ProtocolError


def batch_of(receipts: Sequence[HopReceipt], domain: Eip712Domain) -> tuple[HopBatch, MerkleTree]:
    """The batch of ``receipts`` (at least one, all of one run, epoch, worker and counterparty,
    one receipt per hop key) and its tree over their digests, in the order given. Two receipts
    of one hop key in a batch are an equivocation by both its signers (``proveEquivocation``
    takes them from one batch as from two), so no batch holds them."""
    if not receipts:
        raise ProtocolError("a batch holds at least one receipt")
    first = receipts[0]
    scope = (first.runId, first.epoch, first.worker, first.counterparty)
    for r in receipts:
        if (r.runId, r.epoch, r.worker, r.counterparty) != scope:
            raise ProtocolError(
                f"a batch of {first.worker} for {first.counterparty} in run {first.runId} "
                f"epoch {first.epoch} cannot hold a receipt of {r.worker} for {r.counterparty} "
                f"in run {r.runId} epoch {r.epoch}"
            )
    if len({hop_key(r) for r in receipts}) != len(receipts):
        raise ProtocolError("a batch holds one receipt per hop key")
    digests = [receipt_digest(r, domain) for r in receipts]
    tree = build_tree(digests)
    return HopBatch.of(first, tree.root), tree


def sealed(
    receipts: Sequence[HopReceipt],
    tree: MerkleTree,
    worker_signature: bytes,
    counterparty_signature: bytes,
) -> list[SignedReceipt]:
    """Each receipt of a batch (``tree``: its ``batch_of`` tree) with both signatures of the
    batch and its proof in it."""
    return [
        SignedReceipt(r, worker_signature, counterparty_signature, tuple(tree.proof(i)))
        for i, r in enumerate(receipts)
    ]


def sign_batch(
    receipts: Sequence[HopReceipt],
    domain: Eip712Domain,
    worker_key: bytes,
    counterparty_key: bytes,
) -> list[SignedReceipt]:
    """``receipts`` as one batch signed by ``worker_key`` and countersigned by
    ``counterparty_key`` (both parties' keys at hand: tests and benchmarks)."""
    batch, tree = batch_of(receipts, domain)
    digest = batch.digest(domain)
    return sealed(
        receipts, tree, sign_digest(digest, worker_key), sign_digest(digest, counterparty_key)
    )
