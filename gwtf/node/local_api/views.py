"""``NodeViews``: the node's answers to its local API (``gwtf.api.services.NodeServices``).

Reads come from the ``SnapshotBox`` (status, peers, flows, the chain's last reading) and the node
database (``NodeRecords``); nothing here touches the trio loop except ``claim``, which hands the
request to the loop through its token and waits for the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio

from gwtf.api.schemas import (
    Amount,
    ClaimResult,
    Earnings,
    FlowView,
    Health,
    History,
    InclusionProof,
    NodeView,
    PeerView,
    ReceiptPage,
    ReceiptView,
    RunView,
    Slashed,
    Status,
)
from gwtf.api.services import NotReady, Refused
from gwtf.contracts.encoding import FORWARD
from gwtf.node.local_api.earnings import claim_view, earnings_of
from gwtf.node.local_api.snapshot import ChainParts, SnapshotBox
from gwtf.node.local_api.watcher import claim_records
from gwtf.node.store.models import RECEIPT_COLUMNS
from gwtf.node.store.views import NodeRecords, ReceiptRow


class ClaimNow(Protocol):
    """Claim now, on the node's loop, an epoch's work (None: every settled epoch's); returns
    the epochs claimed. Waits on the chain for the claims' transactions; raises ``Refused`` with
    what to do when there is nothing to claim (yet)."""

    async def __call__(self, epoch: int | None, /) -> list[int]: ...


@dataclass
class NodeViews:
    box: SnapshotBox
    records: NodeRecords | None  # None: the node keeps no receipts
    run_id: int
    node_address: str
    claim_now: ClaimNow | None = None
    trio_token: trio.lowlevel.TrioToken | None = None

    def health(self) -> Health:
        snapshot = self.box.snapshot
        if snapshot is None:
            return Health(status="starting", detail="the node's host and worker are not up yet")
        return snapshot.status.health

    def status(self) -> Status:
        return self.box.get().status

    def peers(self) -> list[PeerView]:
        return list(self.box.get().peers)

    def flows(self) -> list[FlowView]:
        return list(self.box.get().flows)

    def history(self) -> History:
        return History(points=list(self.box.get().history))

    def metrics(self) -> dict[str, float]:
        snapshot = self.box.snapshot
        return dict(snapshot.counters) if snapshot is not None else {}

    def node(self) -> NodeView:
        node = self._chain().node
        if node is None:
            raise NotReady("this node is not registered on chain")
        return node

    def runs(self) -> list[RunView]:
        return list(self._chain().runs)

    def slashes(self) -> list[Slashed]:
        return list(self._chain().slashes)

    def earnings(self) -> Earnings:
        records = self._records()
        chain = self._chain()
        claims = claim_records(records, self.run_id)
        epochs = earnings_of(self.run_id, records.work(self.run_id), claims, chain.view)
        return Earnings(
            run_id=self.run_id,
            node_address=self.node_address,
            chain_time=chain.view.now,
            epochs=epochs,
            total_claimed=Amount.of(sum(int(e.claimed.wei) for e in epochs)),
            total_claimable=Amount.of(sum(int(e.claimable.wei) for e in epochs)),
            total_pending=Amount.of(sum(int(e.pending.wei) for e in epochs)),
            stake_holds=chain.node.stake_holds if chain.node is not None else [],
        )

    def receipts(self, offset: int, limit: int, epoch: int | None) -> ReceiptPage:
        total, rows = self._records().receipts(self.run_id, offset, limit, epoch)
        return ReceiptPage(
            items=[receipt_view(r) for r in rows], total=total, offset=offset, limit=limit
        )

    def claim(self, epoch: int | None) -> ClaimResult:
        if self.claim_now is None or self.trio_token is None:
            raise Refused("this node sends no claims: start it with a wallet (chain.wallet_file)")
        asked = trio.from_thread.run(self.claim_now, epoch, trio_token=self.trio_token)
        records = self._records()
        claims = [c for c in claim_records(records, self.run_id) if c.epoch in asked]
        return ClaimResult(asked=asked, claims=[claim_view(c) for c in claims])

    def _records(self) -> NodeRecords:
        if self.records is None:
            raise NotReady("this node keeps no receipts (chain.receipts is off)")
        return self.records

    def _chain(self) -> ChainParts:
        chain = self.box.chain
        if chain is None:
            raise NotReady("the chain has not been read yet; it is read every few seconds")
        return chain


def receipt_view(row: ReceiptRow) -> ReceiptView:
    """A receipt as the API shows it: its fields under their column names, bytes in hex."""
    r = row.receipt
    values = {column: _json(getattr(r, name)) for name, column in RECEIPT_COLUMNS.items()}
    values["direction"] = "forward" if r.direction == FORWARD else "backward"
    counter = row.counterparty_signature
    return ReceiptView.model_validate(
        values
        | {
            "hop_key": _hex(row.hop_key),
            "receipt_digest": _hex(row.receipt_digest),
            "worker_signature": _hex(row.worker_signature),
            "counterparty_signature": None if counter is None else _hex(counter),
            "as_worker": bool(row.as_worker),
            "batch_root": None if row.batch_root is None else _hex(row.batch_root),
            "batch_proof": _hashes(row.batch_proof),
            "proof": inclusion_proof(row),
        }
    )


def inclusion_proof(row: ReceiptRow) -> InclusionProof | None:
    if row.root is None or row.proof is None or row.signatures_hash is None:
        return None
    return InclusionProof(
        root=_hex(row.root),
        leaf_index=int(row.leaf_index or 0),
        units_before=int(row.units_before or 0),
        signatures_hash=_hex(row.signatures_hash),
        siblings=_hashes(row.proof),
    )


def _hashes(joined: bytes | None) -> list[str]:
    """A Merkle proof stored as one column (32 bytes a hash) as a list of hex hashes."""
    value = bytes(joined or b"")
    return [_hex(value[i : i + 32]) for i in range(0, len(value), 32)]


def _hex(value: bytes) -> str:
    return "0x" + bytes(value).hex()


def _json(value: object) -> object:
    return _hex(value) if isinstance(value, bytes) else value
