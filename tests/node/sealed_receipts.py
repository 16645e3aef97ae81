"""A node's database seeded with complete receipts as its live data plane leaves them: each in a
countersigned batch (``gwtf.node.store.batches``), here a batch of one per receipt, whose root
is the receipt's digest and proof empty (what ``sign_receipt`` signs)."""

from __future__ import annotations

from collections.abc import Sequence

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import HopBatch, hop_key, receipt_digest
from gwtf.node.store.batches import BatchStore, ClosedBatch


def keep_sealed(store: BatchStore, entries: Sequence[SignedReceipt], role: str) -> None:
    """Record each entry's receipt in ``role`` and commit its batch of one with both
    signatures (an entry without a countersignature's is kept signed, unanswered)."""
    store.record([e.receipt for e in entries], role)
    for e in entries:
        r = e.receipt
        batch = HopBatch(
            r.runId, r.epoch, r.worker, r.counterparty, receipt_digest(r, store.domain)
        )
        closed = ClosedBatch(
            batch, (hop_key(r),), e.worker_signature, e.counterparty_signature or None
        )
        store._commit(closed, role, [batch.root])
