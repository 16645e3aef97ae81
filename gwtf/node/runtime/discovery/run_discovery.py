"""Finding the peers of a run and the replicas of a stage: DHT first, hints, exchange as fallback.

One task per node. It joins the DHT through the bootstrap peers, announces the node (signed
card, providers of the run's key and of its stage's key), looks the run's peers up now and then
and feeds them into the address book, and listens to the run's hint topic, whose hints feed the
same book. Peer exchange (``address_book``) is kept as a fallback: it runs only in a round
where the DHT knows no peer at all (an empty routing table, or a bootstrap peer that has no
DHT), so a swarm still forms when the DHT cannot.

Everything learned is checked: a card must be signed by the peer it names and be for this run
(and stage, for a stage lookup); a hint must be about its author and for this run; a peer the
admission check refuses is not learned; a malformed hint counts against its author's score.
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol

import trio
from libp2p.crypto.keys import PrivateKey

from gwtf.errors import ProtocolError
from gwtf.node.p2p.dht import DhtSettings, RunDirectory
from gwtf.node.p2p.discovery_records import (
    Hint,
    PeerCard,
    decode_hint,
    encode_hint,
    hint_topic,
    run_key,
    sign_card,
    stage_key,
)
from gwtf.node.p2p.hints import GossipSettings, HintChannel
from gwtf.node.p2p.host import peer_info
from gwtf.node.p2p.reachability import Reachability
from gwtf.node.p2p.scoring import Offence
from gwtf.node.runtime.discovery.address_book import AddressBook, PeerRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiscoverySettings:
    run_id: int
    stage: int  # 0 for a data node
    role: str  # "data" | "relay"
    bootstrap: tuple[str, ...] = ()
    period_s: float = 1.0
    #: Lookups back off to this period while they find nobody new (hints still arrive at once).
    #: Each lookup and each card fetch opens DHT streams (~12 ms of CPU each in py-libp2p), so an
    #: idle swarm's discovery must stay rare: at 4 s and a revive every 1 s, five idle nodes
    #: burned 0.35 of a core; at these defaults about a third of that.
    max_period_s: float = 15.0
    reannounce_s: float = 60.0
    retry_refused_s: float = 30.0
    revive_per_round: int = 3
    revive_period_s: float = 5.0
    #: A card older than this (by the reader's wall clock) is stale: 3 announce periods, which
    #: also absorbs a minute of clock skew between machines.
    card_ttl_s: float = 180.0
    exchange_fallback: bool = True
    use_hints: bool = True
    dht: DhtSettings = field(default_factory=DhtSettings)
    gossip: GossipSettings = field(default_factory=GossipSettings)


@dataclass
class DiscoveryCounters:
    dht_peers: int = 0
    hints_used: int = 0
    hints_dropped: int = 0
    cards_dropped: int = 0
    stale_cards: int = 0
    exchanges: int = 0
    restarts: int = 0


class SpareCapacity(Protocol):
    """The microbatches this node could take on now beyond its flows' (its card's and hints'
    ``spare``). Does not block or raise."""

    def __call__(self) -> int: ...


class WallClockMs(Protocol):
    """Wall-clock time in milliseconds since the Unix epoch: a card's issue time, and what its
    age is measured against. Does not block or raise."""

    def __call__(self) -> int: ...


class RelaysForOthers(Protocol):
    """Whether this node relays for the run's nodes behind NAT now (its card says so). Does not
    block or raise."""

    def __call__(self) -> bool: ...


class RunDiscovery:
    """Keeps ``book`` filled with the run's peers; ``replicas_of`` finds a stage's replicas."""

    def __init__(
        self,
        book: AddressBook,
        key: PrivateKey,
        settings: DiscoverySettings,
        spare_of: SpareCapacity = lambda: 0,
        wall_ms: WallClockMs = lambda: int(time.time() * 1000),
    ) -> None:
        self.wall_ms = wall_ms
        self.book = book
        self.key = key
        self.settings = settings
        self.spare_of = spare_of
        #: The node's last reachability verdict, which its card carries (None: none yet;
        #: an unknown verdict is carried as unchecked).
        self.reachability: Reachability | None = None
        #: Whether the node relays for the run's nodes behind NAT (its card says so).
        self.relays_for_others: RelaysForOthers = lambda: False
        self.directory, self.hints = self._services()
        self.cards: dict[str, PeerCard] = {}
        #: Providers whose card was bad, missing or for another run, and when: not asked again
        #: until ``retry_refused_s`` has passed.
        self.refused: dict[str, float] = {}
        #: Peers that said they were leaving, and when (wall clock, ms).
        self.left: dict[str, int] = {}
        self.counters = DiscoveryCounters()
        self.announced = trio.Event()
        self.ready = trio.Event()  # the DHT and the hint topic are up
        #: Set once the node answers its run's protocols; until then it looks peers up but
        #: announces nothing (card, provider records, hints), so no peer learns of it and
        #: opens a stream it would refuse. None: announce at once.
        self.serving: trio.Event | None = None

    async def run(self) -> None:
        """Run until cancelled; on an orderly stop, say so on the hint topic (best effort).

        A failure inside discovery (py-libp2p's DHT and pubsub services have raised from their
        own background tasks) restarts it with fresh services after a period instead of taking
        the node down: discovery only feeds the address book.
        """
        while True:
            try:
                await self._run_services()
            except Exception:  # supervision boundary: the node keeps training without discovery
                self.counters.restarts += 1
                log.exception("discovery failed; restarting it in %s s", self.settings.period_s)
            await trio.sleep(self.settings.period_s)
            self.directory, self.hints = self._services()

    def _services(self) -> tuple[RunDirectory, HintChannel | None]:
        host = self.book.rpc.host
        directory = RunDirectory(
            host, self.settings.dht, admit=self._admits, dialer=self.book.rpc.dialer
        )
        if not self.settings.use_hints:
            return directory, None
        return directory, HintChannel(host, hint_topic(self.settings.run_id), self.settings.gossip)

    async def _run_services(self) -> None:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self.directory.running())
            nursery = await stack.enter_async_context(trio.open_nursery())
            if self.hints is not None:
                await stack.enter_async_context(self.hints.running())
                nursery.start_soon(self.hints.receive_forever, self.on_hint)
            self.ready.set()
            try:
                nursery.start_soon(self._announce_forever)
                nursery.start_soon(self._revive_forever)
                await self._discover_forever()
            except trio.Cancelled:
                with trio.CancelScope(shield=True), trio.move_on_after(0.5):
                    await self.publish_hint("leaving")
                raise

    async def _announce_forever(self) -> None:
        if self.serving is not None:
            await self.serving.wait()
        spare_hinted = 0
        while True:
            await self._join_bootstrap()
            announced = await self.announce()
            if self.spare_of() != spare_hinted and await self.publish_hint("spare"):
                spare_hinted = self.spare_of()
            await trio.sleep(self.settings.reannounce_s if announced else self.settings.period_s)

    async def _discover_forever(self) -> None:
        period_s = self.settings.period_s
        while True:
            await self._join_bootstrap()
            found = await self.find_run_peers()
            if self.directory.routing_table_size() == 0 and self.settings.exchange_fallback:
                await self._exchange()
            period_s = (
                self.settings.period_s if found else min(2 * period_s, self.settings.max_period_s)
            )
            await trio.sleep(period_s)

    async def _revive_forever(self) -> None:
        """Ask a few known peers in turn for their card, every period.

        An answer proves the peer alive (``book.on_heard``: the node re-introduces a peer its
        flow core gave up on during a slow moment) and refreshes its card. Turn by turn, every
        peer is asked within ``len(peers) / revive_per_round`` revive periods.
        """
        cursor = 0
        while True:
            await trio.sleep(self.settings.revive_period_s)
            peers = sorted(self.book.peers)
            count = min(self.settings.revive_per_round, len(peers))
            chosen = [peers[(cursor + i) % len(peers)] for i in range(count)]
            cursor += count
            async with trio.open_nursery() as nursery:
                for peer_id in chosen:
                    nursery.start_soon(self._revive, peer_id)

    async def _revive(self, peer_id: str) -> None:
        try:
            card = await self.directory.card_from_owner(peer_id)
        except ProtocolError as exc:
            log.warning("peer %s served a bad card of its own: %s", peer_id, exc)
            return
        if card is None or card.run_id != self.settings.run_id or self._is_stale(card):
            return
        self.cards[peer_id] = card
        self.book.learn(
            PeerRecord(peer_id, card.address, card.region, card.stage, card.other_addresses)
        )
        self.book.on_heard(peer_id)

    async def _join_bootstrap(self) -> None:
        connections = self.book.rpc.host.get_network().connections
        for address in self.settings.bootstrap:
            peer = peer_info(address)
            if not connections.get(peer.peer_id) or self.directory.routing_table_size() == 0:
                await self.directory.add_bootstrap(peer)

    def own_card(self) -> PeerCard:
        """This node's card as of now: its addresses and its last reachability verdict."""
        reach = self.reachability
        return PeerCard(
            peer_id=self.book.own.peer_id,
            run_id=self.settings.run_id,
            stage=self.settings.stage,
            role=self.settings.role,
            region=self.book.own.region,
            address=self.book.own.address,
            issued_ms=self.wall_ms(),
            other_addresses=self.book.own.other_addresses,
            reachable=reach.reachable if reach is not None else None,
            reach_checked_ms=reach.checked_ms if reach is not None else 0,
            relays=self.relays_for_others(),
        )

    async def announce(self) -> bool:
        """Publish this node's card and provider records, then hint that it joined."""
        card = self.own_card()
        keys = [run_key(self.settings.run_id), stage_key(self.settings.run_id, self.settings.stage)]
        done = await self.directory.announce(sign_card(card, self.key), keys)
        await self.publish_hint("stage" if self.announced.is_set() else "joined")
        if done:
            self.announced.set()
        return done

    async def publish_hint(self, kind: str) -> bool:
        """Best effort: False when hints are off or the hint could not be sent."""
        if self.hints is None:
            return False
        return await self.hints.publish(encode_hint(self._hint(kind)))

    async def find_run_peers(self) -> int:
        """Look the run's peers up in the DHT and learn them; returns how many were new."""
        cards = await self._find_cards(run_key(self.settings.run_id))
        return await self._learn_cards(cards, stage=None)

    async def replicas_of(self, stage: int) -> list[PeerRecord]:
        """The replicas of ``stage`` the DHT names first, then others the book knows."""
        await self.ready.wait()
        cards = await self._find_cards(stage_key(self.settings.run_id, stage))
        await self._learn_cards(cards, stage=stage)
        found = {c.peer_id for c in cards if c.run_id == self.settings.run_id and c.stage == stage}
        replicas = [r for r in self.book.replicas_of(stage) if r.peer_id in found]
        others = [r for r in self.book.replicas_of(stage) if r.peer_id not in found]
        return replicas + others

    async def weight_sources(self, stage: int) -> list[PeerRecord]:
        """Whom a joiner asks for ``stage``'s state: its replicas, then peers of unknown stage
        (learned by exchange), never peers known to serve another stage."""
        replicas = await self.replicas_of(stage)
        unknown = [r for r in self.book.peers.values() if r.stage is None]
        return replicas + unknown

    async def _find_cards(self, key: bytes) -> list[PeerCard]:
        now = trio.current_time()
        skip = {p for p, at in self.refused.items() if now - at < self.settings.retry_refused_s}
        # A card not re-issued within its time to live is fetched anew; if the newest one to
        # be found is still that old, its peer stopped announcing: it is gone.
        fresh = {p: c for p, c in self.cards.items() if not self._is_stale(c)}
        cards, missing = await self.directory.find_cards(key, fresh, skip)
        for peer_id in missing:
            self.refused[peer_id] = now
            self.counters.cards_dropped += 1
        for card in [c for c in cards if self._is_stale(c)]:
            self.refused[card.peer_id] = now
            self.cards.pop(card.peer_id, None)
            self.book.forget(card.peer_id)
            self.counters.stale_cards += 1
        return [c for c in cards if not self._is_stale(c)]

    def _is_stale(self, card: PeerCard) -> bool:
        age_s = (self.wall_ms() - card.issued_ms) / 1000
        return age_s > self.settings.card_ttl_s or card.issued_ms <= self.left.get(card.peer_id, -1)

    async def _learn_cards(self, cards: list[PeerCard], stage: int | None) -> int:
        new = 0
        for card in cards:
            if card.run_id != self.settings.run_id:
                # A peer that provides this run's key while its own card names another run.
                self.refused[card.peer_id] = trio.current_time()
                self.counters.cards_dropped += 1
                log.warning("dropped the card of %s: it is for run %s", card.peer_id, card.run_id)
                continue
            self.cards[card.peer_id] = card
            if stage is not None and card.stage != stage:
                continue  # an honest card, just not a replica of the stage asked for
            if card.peer_id in self.book.peers or not await self._admits(card.peer_id):
                continue
            self.book.learn(
                PeerRecord(
                    card.peer_id, card.address, card.region, card.stage, card.other_addresses
                )
            )
            self.counters.dht_peers += 1
            new += 1
        return new

    async def _admits(self, peer_id: str) -> bool:
        rpc = self.book.rpc
        if rpc.scores.is_banned(peer_id, trio.current_time()) or not await rpc.admit(peer_id):
            rpc.refused[peer_id] = rpc.refused.get(peer_id, 0) + 1
            return False
        return True

    async def on_hint(self, data: bytes, author: str) -> None:
        try:
            hint = decode_hint(data, author, self.settings.run_id)
        except ProtocolError as exc:
            self.counters.hints_dropped += 1
            score = self.book.rpc.scores.penalise(
                author, Offence.MALFORMED_MESSAGE, trio.current_time()
            )
            log.warning("dropped a hint from %s: %s; score now %.0f", author, exc, score)
            return
        if not await self._admits(author):
            self.counters.hints_dropped += 1
            return
        self.counters.hints_used += 1
        if hint.kind == "leaving":
            # Its DHT records outlive it: cards it issued until now no longer count.
            self.left[author] = self.wall_ms()
            self.book.forget(author)
            self.cards.pop(author, None)
            return
        self.book.learn(PeerRecord(author, hint.address, hint.region, hint.stage))
        self.book.on_heard(author)
        if hint.kind == "spare":
            self.book.spare[author] = hint.spare

    async def _exchange(self) -> None:
        known = list(self.book.peers.values())
        sample = random.Random(len(known)).sample(known, min(3, len(known)))
        for address in list(self.settings.bootstrap) + [r.address for r in sample]:
            self.counters.exchanges += 1
            await self.book.exchange_with(address)

    def _hint(self, kind: str) -> Hint:
        spare = max(0, min(self.spare_of(), 1 << 16)) if kind == "spare" else 0
        own = self.book.own
        return Hint(kind, self.settings.run_id, self.settings.stage, own.region, own.address, spare)
