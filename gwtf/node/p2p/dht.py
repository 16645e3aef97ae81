"""The node's Kademlia DHT: where a run's peers and a stage's replicas are looked up.

A thin adapter over py-libp2p's ``KadDHT`` in server mode. Every peer of a run *provides* the
run's key and its stage's key (provider records: many peers per key); its signed card (region,
role, stage, address) is a value under ``/gwtf/card/<peer id>``. Every lookup runs under an
explicit deadline and returns what it found by then.

Settings chosen, and why:
* Server mode: every node answers DHT queries, so a joiner needs only one bootstrap peer.
* ``strict_validation``: this DHT stores only namespaces with a validator (``gwtf`` cards plus
  the library's ``pk``/``ipns``), so other peers cannot park arbitrary values on our nodes.
* Only admitted peers are answered (the same check as every request/response protocol), so
  a stranger can neither read the run's records nor store any on its nodes.
* No random walk: swarms are small and every lookup already walks toward the key; the walk
  would add background queries on cores busy training.
* Provider lookups read the local store *and* ask the peers closest to the key: py-libp2p
  0.8's ``find_providers`` returns the local store alone as soon as it holds anything, and a
  node that provides a key always holds itself there, so it would never see newcomers.
* A card is asked of its owner first (one round trip) rather than by an iterative lookup per
  card; the DHT is the fallback. Both paths call private methods of py-libp2p 0.8 (pinned
  ``<0.9``); the discovery tests fail loudly if they change.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, INetStream
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.records.validator import NamespacedValidator, Validator
from libp2p.tools.anyio_service import background_trio_service

from gwtf.errors import ProtocolError
from gwtf.node.p2p.dialing import Dialer
from gwtf.node.p2p.discovery_records import (
    CARD_NAMESPACE,
    PeerCard,
    card_key,
    newest_card_index,
    open_card,
)
from gwtf.node.p2p.host import ADDRESS_TTL_S
from gwtf.node.p2p.rpc import Admission

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DhtSettings:
    """Deadlines and bounds of DHT work (seconds; counts)."""

    lookup_timeout_s: float = 5.0
    announce_timeout_s: float = 15.0
    dial_timeout_s: float = 3.0
    max_providers: int = 256
    parallel_queries: int = 8


class CardValidator(Validator):
    """Lets the DHT store and return only well-formed cards signed by the peer they name."""

    def validate(self, key: str, value: bytes) -> None:
        open_card(key, value)

    def select(self, key: str, values: list[bytes]) -> int:
        return newest_card_index(key, values)


class RunDirectory:
    """One node's DHT: join through bootstrap peers, announce itself, look peers up."""

    def __init__(
        self,
        host: IHost,
        settings: DhtSettings | None = None,
        admit: Admission | None = None,
        dialer: Dialer | None = None,
    ) -> None:
        self.host = host
        self.dialer = dialer or Dialer(host)
        self.settings = settings or DhtSettings()
        validator = NamespacedValidator({CARD_NAMESPACE: CardValidator()}, strict_validation=True)
        self.dht = KadDHT(host, DHTMode.SERVER, validator=validator, strict_validation=True)
        self.refused: dict[str, int] = {}
        self._announced_all = True  # the last announcement reached every record's peers
        if admit is not None:
            self._serve_only(admit)

    def _serve_only(self, admit: Admission) -> None:
        """Answer DHT queries only from peers ``admit`` lets in, like every other protocol."""

        async def on_stream(stream: INetStream) -> None:
            peer = str(stream.muxed_conn.peer_id)
            try:
                if await admit(peer):
                    await self.dht.handle_stream(stream)
                    return
                self.refused[peer] = self.refused.get(peer, 0) + 1
                log.warning("refused a DHT stream from %s: not admitted to the run", peer)
                await stream.reset()
            except Exception:  # supervision boundary: nothing may escape a libp2p handler
                log.exception("DHT handler failed on a stream from %s", peer)
                with contextlib.suppress(Exception):
                    await stream.reset()

        self.host.set_stream_handler(PROTOCOL_ID, on_stream)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RunDirectory]:
        async with background_trio_service(self.dht):
            yield self

    async def add_bootstrap(self, peer: PeerInfo) -> bool:
        """Dial a bootstrap peer and put it in the routing table; False if it cannot be reached."""
        with trio.move_on_after(self.settings.dial_timeout_s):
            try:
                # The routing table takes a peer's addresses from the peerstore: a dial alone
                # leaves them out, and the table would stay empty.
                self.host.get_peerstore().add_addrs(peer.peer_id, peer.addrs, ADDRESS_TTL_S)
                await self.dialer.connect(peer.peer_id, peer.addrs)
                return await self.dht.add_peer(peer.peer_id)
            except Exception as exc:  # libp2p's dial errors share no useful base class
                log.info("bootstrap peer %s unreachable: %s", peer.peer_id, exc)
                return False
        log.info("bootstrap peer %s did not answer within the deadline", peer.peer_id)
        return False

    def routing_table_size(self) -> int:
        return self.dht.get_routing_table_size()

    async def announce(self, card: bytes, provider_keys: list[bytes]) -> bool:
        """Store this node's card and provide ``provider_keys``, all at once; False if any
        part did not finish before the deadline."""
        own_key = card_key(str(self.host.get_id()))
        done: list[str] = []

        async def put_card() -> None:
            try:
                await self.dht.put_value(own_key, card)
                done.append("card")
            except ValueError as exc:  # the local store holds a newer card of this node
                log.warning("this node's card was not stored: %s", exc)

        async def provide(key: bytes) -> None:
            if await self.dht.provider_store.provide(key):
                done.append(key.hex())

        with trio.move_on_after(self.settings.announce_timeout_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(put_card)
                for key in provider_keys:
                    nursery.start_soon(provide, key)
        complete = len(done) == 1 + len(provider_keys)
        if complete != self._announced_all:
            # Said once when it starts and once when it ends: a node alone in its run, or
            # with dead peers in its routing table, misses some every period.
            if complete:
                log.info("every DHT record is announced again")
            else:
                log.info("announced %s of %s DHT records; retrying each period (quiet until "
                         "all are)", len(done), 1 + len(provider_keys))  # fmt: skip
        self._announced_all = complete
        return complete

    async def find_providers(self, key: bytes) -> list[PeerInfo]:
        """Providers of ``key``: the local store, then the routing table's peers closest to the
        key, then the closest ones a network lookup finds, until the deadline."""
        own_id = self.host.get_id()
        found: dict[ID, PeerInfo] = {}
        for info in self.dht.provider_store.get_providers(key):
            found.setdefault(info.peer_id, info)
        asked: set[ID] = {own_id}
        limiter = trio.CapacityLimiter(self.settings.parallel_queries)

        async def ask(peer: ID) -> None:
            async with limiter:
                # Private in py-libp2p 0.8, and the only call that asks one peer for the
                # providers it stores (see the module docstring).
                store = self.dht.provider_store
                providers, _closer = await store._get_providers_from_peer_with_closers(peer, key)
            for info in providers:
                if len(found) < self.settings.max_providers:
                    found.setdefault(info.peer_id, info)

        async def ask_all(peers: list[ID]) -> None:
            async with trio.open_nursery() as nursery:
                for peer in peers:
                    if peer not in asked:
                        asked.add(peer)
                        nursery.start_soon(ask, peer)

        with trio.move_on_after(self.settings.lookup_timeout_s):
            # One round trip to the peers already known answers at once in a small swarm; the
            # iterative lookup that follows covers a large one.
            await ask_all(self.dht.routing_table.find_local_closest_peers(key))
            await ask_all(await self.dht.peer_routing.find_closest_peers_network(key))
        return list(found.values())

    async def fetch_card(self, peer_id: str) -> PeerCard | None:
        """The newest valid card of ``peer_id``, or None if none arrives before the deadline.

        The peer itself is asked first (one round trip, and it holds its newest card); the DHT
        (the peers closest to the key, or the local store) only when the peer cannot be
        reached. A peer that serves a bad card of its own gets no second chance.
        """
        key = card_key(peer_id)
        try:
            with trio.move_on_after(self.settings.lookup_timeout_s):
                value = await self._value_from_owner(peer_id, key)
                if value is None:
                    value = await self.dht.get_value(key)
                return None if value is None else open_card(key, value)
        except ProtocolError as exc:
            log.warning("dropped a bad card of %s: %s", peer_id, exc)
        return None

    async def card_from_owner(self, peer_id: str) -> PeerCard | None:
        """``peer_id``'s card from ``peer_id`` itself: an answer is also a sign of life.

        None if it cannot be reached in time; ``ProtocolError`` if its card is bad.
        """
        key = card_key(peer_id)
        with trio.move_on_after(self.settings.lookup_timeout_s):
            value = await self._value_from_owner(peer_id, key)
            return None if value is None else open_card(key, value)
        return None

    async def _value_from_owner(self, peer_id: str, key: str) -> bytes | None:
        """The owner's answer for ``key``; None if it is unreachable or has no such value."""
        try:
            # Private in py-libp2p 0.8: GET_VALUE to one peer, without the iterative lookup.
            value = await self.dht.value_store._get_from_peer(ID.from_base58(peer_id), key.encode())
        except Exception as exc:  # unreachable, or a malformed peer id: fall back to the DHT
            log.debug("card of %s not served by itself: %s", peer_id, exc)
            return None
        return value if isinstance(value, bytes) else None

    async def find_cards(
        self,
        key: bytes,
        known: dict[str, PeerCard],
        skip: Collection[str] = (),
    ) -> tuple[list[PeerCard], list[str]]:
        """Cards of the providers of ``key``, and the providers whose card did not come.

        ``known`` cards are reused rather than fetched again; providers in ``skip`` (whose card
        was bad or missing a moment ago) are left out, so a bad provider costs one fetch.
        """
        providers = await self.find_providers(key)
        cards: list[PeerCard] = []
        missing: list[str] = []
        limiter = trio.CapacityLimiter(self.settings.parallel_queries)

        async def fetch(peer_id: str) -> None:
            async with limiter:
                card = await self.fetch_card(peer_id)
            if card is None:
                missing.append(peer_id)
            else:
                cards.append(card)

        async with trio.open_nursery() as nursery:
            for info in providers:
                peer_id = str(info.peer_id)
                if peer_id in known:
                    cards.append(known[peer_id])
                elif peer_id != str(self.host.get_id()) and peer_id not in skip:
                    nursery.start_soon(fetch, peer_id)
        return cards, missing
