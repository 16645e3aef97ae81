"""What the API needs from a node, as a Protocol the node implements (``gwtf.node.local_api``).

Every read is answered from the node's database and an immutable snapshot of its status, never
from the trio loop, so a slow request cannot hold up training. ``claim`` is the one mutation: it
asks the node's epoch cycle to claim now, and blocks (in the API's worker thread) until that
answer comes back.
"""

from __future__ import annotations

from typing import Protocol

from gwtf.api.schemas import (
    ClaimResult,
    Earnings,
    FlowView,
    Health,
    History,
    NodeView,
    PeerView,
    ReceiptPage,
    RunView,
    Slashed,
    Status,
)


class NotReady(Exception):
    """The node cannot answer yet (starting up, no receipts): the API says 503 with why."""


class Refused(Exception):
    """The node refuses a request for a reason the caller can fix: the API says 409 with why."""


class NodeServices(Protocol):
    def health(self) -> Health: ...

    def status(self) -> Status: ...

    def peers(self) -> list[PeerView]: ...

    def flows(self) -> list[FlowView]: ...

    def history(self) -> History: ...

    def earnings(self) -> Earnings: ...

    def receipts(self, offset: int, limit: int, epoch: int | None) -> ReceiptPage: ...

    def node(self) -> NodeView: ...

    def runs(self) -> list[RunView]: ...

    def slashes(self) -> list[Slashed]: ...

    def metrics(self) -> dict[str, float]:
        """Counters and gauges by metric name (``gwtf.api.metrics.METRICS`` names them)."""
        ...

    def claim(self, epoch: int | None) -> ClaimResult: ...
