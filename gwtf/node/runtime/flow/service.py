"""The flow protocol on the live host: the pure ``FlowNode`` fed by real messages and a real clock.

Incoming ``/gwtf/flow/3.0.0`` requests are decoded (bad bytes are charged to the sender) and handed
to the core with ``now``; everything the core answers is queued per destination and sent in order
by one task per peer, so messages to one peer keep their order as on the simulator's links. The
round trip of each send is folded into the core's delay estimate of that link, and whether the
link runs through a circuit relay, with the latency of the leg to that relay, into its cost.
The core's tick runs every ``tick_s``. Sends may fail: the protocol tolerates loss and detects
dead peers by keep-alive.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import trio
from libp2p.peer.id import ID

from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.protocol.node import FlowNode
from gwtf.coordinator_free.wire import PROTOCOL_ID, Message, decode, encode
from gwtf.node.p2p.relay import is_relayed, relay_through
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits

log = logging.getLogger(__name__)

LIMITS = RpcLimits(max_request_bytes=64 * 1024, max_response_bytes=16, timeout_s=5.0)
_OUTBOX_PER_PEER = 256


class FlowObserver(Protocol):
    """Told of each flow message (its sender and the message) after the flow core handled it.
    Must not block or raise: it runs in the request's handler."""

    def __call__(self, peer: str, message: Message, /) -> None: ...


@dataclass
class FlowService:
    rpc: RequestResponse
    node: FlowNode
    tick_s: float
    _outboxes: dict[str, trio.MemorySendChannel[bytes]] = field(default_factory=dict)
    _nursery: trio.Nursery | None = None
    dropped: int = 0
    #: Told of every message after the core handled it (a data node's pool of flows).
    observer: FlowObserver | None = None

    def serve(self) -> None:
        self.rpc.serve(PROTOCOL_ID, self._handle, LIMITS)

    async def _handle(self, peer: str, request: bytes) -> bytes:
        message = decode(request)  # WireFormatError is a ProtocolError: the rpc layer scores it
        self.dispatch(self.node.handle(peer, message, trio.current_time()))
        if self.observer is not None:
            self.observer(peer, message)
        return b""

    def dispatch(self, outbounds: Iterable[Outbound]) -> None:
        """Queue the core's messages; a full queue drops (the protocol tolerates loss)."""
        for outbound in outbounds:
            outbox = self._outbox(outbound.to)
            try:
                outbox.send_nowait(encode(outbound.message))
            except trio.WouldBlock:
                self.dropped += 1

    def _outbox(self, peer: str) -> trio.MemorySendChannel[bytes]:
        outbox = self._outboxes.get(peer)
        if outbox is None:
            if self._nursery is None:
                raise RuntimeError("FlowService.start must run before messages are sent")
            outbox, inbox = trio.open_memory_channel[bytes](_OUTBOX_PER_PEER)
            self._outboxes[peer] = outbox
            self._nursery.start_soon(self._send_loop, peer, inbox)
        return outbox

    async def _send_loop(self, peer: str, inbox: trio.MemoryReceiveChannel[bytes]) -> None:
        peer_id = ID.from_base58(peer)
        async for payload in inbox:
            started = trio.current_time()
            try:
                await self.rpc.request(peer_id, PROTOCOL_ID, payload, LIMITS)
            except PeerUnavailable as exc:
                log.debug("flow message to %s lost: %s", peer, exc)
                continue
            rtt_ms = (trio.current_time() - started) * 1000.0
            self._observe_path(peer, peer_id)
            if math.isfinite(rtt_ms):
                self.node.observe_link(peer, rtt_ms / 2.0)

    def _observe_path(self, peer: str, peer_id: ID) -> None:
        """Tell the core whether the link to ``peer`` runs through a relay, with its own
        latency estimate to that relay (the extra leg the edge's cost gains), if it has one."""
        relayed = is_relayed(self.rpc.host, peer_id)
        relay = relay_through(self.rpc.host, peer_id) if relayed else None
        known = None if relay is None else self.node.peers.get(str(relay))
        self.node.observe_relayed(peer, relayed, None if known is None else known.latency_ms)

    def start(self, nursery: trio.Nursery) -> None:
        """Run the senders and the ticker in ``nursery`` (the node's one nursery)."""
        self._nursery = nursery
        nursery.start_soon(self._tick_loop)

    async def _tick_loop(self) -> None:
        while True:
            self.dispatch(self.node.tick(trio.current_time()))
            await trio.sleep(self.tick_s)
