"""A run's gossipsub topic for hints: lossy announcements that nothing depends on.

Thin adapter over py-libp2p's ``Pubsub`` + ``GossipSub``. Messages are signed by their author
(strict signing), so a receiver learns who wrote a hint; what a hint means is decided in
``gwtf.node.p2p.discovery_records``. py-libp2p drops silently (about 10 messages/s per peer and
topic, queues of 32): a hint may never arrive, so anything that must arrive goes over
request/response streams instead.

Settings chosen, and why:
* Mesh degree 6 (low 4, high 12): the gossipsub spec's defaults; swarms here are small, so the
  mesh is every peer of the run until it grows past a dozen.
* Heartbeat every 1 s (the spec's default; py-libp2p ships 120 s): the mesh forms within a
  second or two of peers connecting, and a joiner's first hint already has somewhere to go.
* Only the run's topic is allowed, and inbound RPCs are capped at 64 KiB: a hint is a few
  hundred bytes.
* No blacklist for peers that are not admitted: py-libp2p 0.8's ``add_to_blacklist`` can crash
  the pubsub service (a ``KeyError`` in its teardown task when the peer has just gone). Their
  hints are dropped on arrival instead; what they can read is what a card says.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, ISubscriptionAPI
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

log = logging.getLogger(__name__)

#: Called with (message bytes, author's peer id) for each hint received.
OnHint = Callable[[bytes, str], Awaitable[None]]


@dataclass(frozen=True)
class GossipSettings:
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval_s: int = 1
    publish_timeout_s: float = 2.0
    ready_timeout_s: float = 5.0
    max_inbound_rpc_bytes: int = 64 << 10


class HintChannel:
    """Publish to and receive from one topic; never raises on a lost or refused hint."""

    def __init__(self, host: IHost, topic: str, settings: GossipSettings | None = None) -> None:
        self.host = host
        self.topic = topic
        self.settings = settings or GossipSettings()
        self.router = GossipSub(
            protocols=[PROTOCOL_ID_V11],
            degree=self.settings.degree,
            degree_low=self.settings.degree_low,
            degree_high=self.settings.degree_high,
            heartbeat_interval=self.settings.heartbeat_interval_s,
        )
        self.pubsub = Pubsub(
            host,
            self.router,
            strict_signing=True,
            max_inbound_rpc_size=self.settings.max_inbound_rpc_bytes,
            allowed_topics={topic},
        )
        self.subscription: ISubscriptionAPI | None = None
        self.published = 0
        self.received = 0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[HintChannel]:
        async with background_trio_service(self.pubsub), background_trio_service(self.router):
            with trio.fail_after(self.settings.ready_timeout_s):
                await self.pubsub.wait_until_ready()
                self.subscription = await self.pubsub.subscribe(self.topic)
            yield self

    async def publish(self, data: bytes) -> bool:
        """Send one hint to the topic; False if it could not even be handed to the mesh."""
        with trio.move_on_after(self.settings.publish_timeout_s):
            try:
                await self.pubsub.publish(self.topic, data)
            except Exception as exc:  # pubsub raises assorted types; a hint is best effort
                log.info("a hint on %s was not sent: %s", self.topic, exc)
                return False
            self.published += 1
            return True
        return False

    async def receive_forever(self, on_hint: OnHint) -> None:
        """Hand every hint from another peer to ``on_hint`` until cancelled."""
        if self.subscription is None:
            raise RuntimeError("receive_forever needs a running channel")
        own_id = self.host.get_id()
        while True:
            message = await self.subscription.get()
            try:
                author = ID(message.from_id)
            except Exception as exc:  # a malformed author id: pubsub checked the signature only
                log.info("dropped a hint with a bad author id: %s", exc)
                continue
            if author == own_id:
                continue
            self.received += 1
            await on_hint(bytes(message.data), str(author))
