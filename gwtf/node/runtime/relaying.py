"""A live node's part in circuit relaying (``gwtf.node.p2p.relay``), tied to its settings, its
address book and its own reachability verdict.

* Whether peers can dial it (``reachable``): ``p2p.reachable`` forces it (true or false);
  ``auto`` follows the node's dial-back check (``own_reachability``), and a node that listens on
  loopback only (the local swarm, the demo), which checks nothing, counts as reachable.
* A node that is not reachable, or not yet known to be, holds slots at its relays
  (``p2p.relays``, by default its bootstrap peers) and, up to ``MAX_CIRCUIT_ADDRESSES`` relays
  in all, at volunteers whose signed card says they relay and that the run admits, found as
  discovery reads their cards; its host advertises their circuits first, and they alone may
  open circuits to it. A verdict of reachable drops the slots; a later
  verdict of not reachable takes them again.
* A node with ``p2p.relay_service`` relays while it is not known to be unreachable, and says so
  in its signed card (``relay``) once it is known to be reachable.
* Which relays it trusts to dial peers through: its own (``p2p.relays`` or bootstrap peers, at
  their configured addresses), the run's data nodes (stage 0 in their signed cards, at the
  direct addresses of their own record) and volunteers whose signed card says they relay and
  that the run admits (at the direct addresses of that card). A circuit a peer advertises
  through any other relay is not tried: a peer could otherwise send this node to any address
  under any relay's name.
* Which addresses a peer is dialled at: its record in the address book, whose first address
  says whether it wants to be reached through a relay.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import multiaddr
import trio
from libp2p.peer.id import ID

from gwtf.errors import ConfigError
from gwtf.node.p2p.addresses import MAX_CIRCUIT_ADDRESSES
from gwtf.node.p2p.discovery_records import PeerCard
from gwtf.node.p2p.host import peer_info
from gwtf.node.p2p.reachability import Reachability
from gwtf.node.p2p.relay import RelaySlots, is_circuit
from gwtf.node.p2p.rpc import Admission, RequestResponse
from gwtf.node.runtime.discovery.address_book import AddressBook

log = logging.getLogger(__name__)


class CardOf(Protocol):
    """A peer's signed card as discovery last read it, None without one. Does not block or
    raise."""

    def __call__(self, peer: str, /) -> PeerCard | None: ...


class AllCards(Protocol):
    """Every signed card discovery holds now. Does not block or raise."""

    def __call__(self) -> Iterable[PeerCard]: ...


class RelaysChanged(Protocol):
    """Told whenever the relays this node holds slots at change (its record, cards and hints
    must name the new circuits). Must not block or raise."""

    def __call__(self) -> None: ...


@dataclass
class Relaying:
    """What the node's host, relay protocol, dialer and card ask about relays (see the module)."""

    #: Full addresses of this node's own relays.
    relays: tuple[str, ...]
    #: ``p2p.reachable``: True or False forces it; None lets the node's own check decide.
    forced: bool | None = True
    #: ``p2p.relay_service`` resolved for this node: it relays for others when reachable.
    relay_service: bool = False
    #: Who the run admits (None: everyone, a swarm without a chain).
    admit: Admission | None = None
    book: AddressBook | None = None
    #: Peers' signed cards as discovery last read them.
    cards: CardOf = lambda _peer: None
    #: Every signed card discovery holds: admitted volunteers whose card says they relay are
    #: taken as relays too, after the node's own.
    all_cards: AllCards = lambda: ()
    #: Relays a node behind NAT holds slots at, at most: its own first, then volunteers.
    most_relays: int = MAX_CIRCUIT_ADDRESSES
    slots: RelaySlots | None = None
    #: The dial-back check's last verdict (None: none yet, or nobody could check).
    verdict: bool | None = None
    #: The node listens on loopback only: no check runs, and it counts as reachable.
    loopback_only: bool = False
    #: This node's peer id (set by ``start``).
    own_id: str | None = None
    _configured: dict[ID, list[multiaddr.Multiaddr]] = field(default_factory=dict)
    _rpc: RequestResponse | None = None
    _nursery: trio.Nursery | None = None
    _on_change: RelaysChanged = lambda: None
    _slots_scope: trio.CancelScope | None = None

    def __post_init__(self) -> None:
        for address in self.relays:
            try:
                info = peer_info(address)
            except ConfigError:  # a bootstrap address without its id: discovery says so
                continue
            self._configured.setdefault(info.peer_id, []).extend(info.addrs)

    # ---- reachability --------------------------------------------------------------------------

    def reachable(self) -> bool | None:
        """Whether peers can dial this node (None: not known yet)."""
        if self.forced is not None:
            return self.forced
        return True if self.loopback_only else self.verdict

    def serving(self) -> bool:
        """Whether the node relays for others at the moment."""
        return self.relay_service and self.reachable() is not False

    def advertises_relay(self) -> bool:
        """Whether its card says it relays: it does, and peers are known to reach it."""
        return self.relay_service and self.reachable() is True

    def circuits(self) -> list[multiaddr.Multiaddr]:
        """The circuits this node is reached through (its host advertises them first)."""
        return self.slots.addresses() if self.slots is not None else []

    def holds_slot_at(self, relay: ID) -> bool:
        """Whether ``relay`` may open circuits to this node."""
        return self.slots is not None and self.slots.holds_slot_at(relay)

    async def start(
        self, rpc: RequestResponse, nursery: trio.Nursery, on_change: RelaysChanged
    ) -> None:
        """Take slots now unless the node is reachable: each relay is asked once before this
        returns, so the node's first record (cards, exchanges, hints) already names the
        circuits first, and ``on_change`` rewrites it whenever they change. A node forced
        unreachable with no address at all (it listens nowhere) waits for its first slot."""
        self._rpc, self._nursery, self._on_change = rpc, nursery, on_change
        self.own_id = str(rpc.host.get_id())
        if self.reachable() is True:
            return
        slots = self._take_slots()
        if slots is None:
            return
        await slots.asked.wait()
        while self.forced is False and not rpc.host.get_addrs():
            log.warning("no relay holds a slot for this node yet, and it has no other address")
            await trio.sleep(slots.check_s)

    def heard(self, result: Reachability) -> None:
        """A verdict of the node's own check: under ``auto``, take or drop the slots."""
        self.verdict = result.reachable
        if self.forced is not None or self._nursery is None:
            return
        if self.reachable() is True and self.slots is not None:
            assert self._slots_scope is not None
            self._slots_scope.cancel()
            self.slots = self._slots_scope = None
            log.info("peers reach this node: holding no relay slot")
            self._on_change()
        elif self.reachable() is not True and self.slots is None:
            self._take_slots()

    def describe(self, result: Reachability) -> str:
        """The verdict in one line, with what the node does about it."""
        text = result.describe()
        if result.reachable:
            return f"{text}; relaying for nodes behind NAT" if self.serving() else text
        held = self.slots.addresses() if self.slots is not None else []
        if held:
            through = "through relay " + ", ".join(str(addr) for addr in held)
        elif self._candidates():
            through = "through relay (no slot yet) " + ", ".join(self._candidates())
        else:
            through = "with no relay known (set p2p.relays)"
        return text.replace("running outbound-only", f"running outbound-only {through}", 1)

    def _candidates(self) -> list[str]:
        own = str(self._rpc.host.get_id()) if self._rpc is not None else None
        candidates = []
        for address in self.relays:
            try:
                relay = peer_info(address).peer_id
            except ConfigError:
                continue
            if str(relay) != own:
                candidates.append(address)
        return candidates

    def _take_slots(self) -> RelaySlots | None:
        assert self._rpc is not None and self._nursery is not None
        relays = self._candidates()
        if not relays:
            if self.forced is False:
                raise ConfigError(
                    "p2p.reachable is false but no relay is known: set p2p.relays or "
                    "p2p.bootstrap_peers to reachable nodes"
                )
            # Said once the check has found it unreachable (``describe``), not before: a data
            # node, which has no bootstrap peers, is usually public.
            log.info("no relay known to hold a slot at until peers are known to reach this node")
            return None
        slots = RelaySlots(self._rpc.host, relays, on_change=self._on_change)
        scope = trio.CancelScope()

        async def keep() -> None:
            with scope:
                async with trio.open_nursery() as both:
                    both.start_soon(slots.run)
                    both.start_soon(self._take_volunteers, slots)

        self.slots, self._slots_scope = slots, scope
        self._nursery.start_soon(keep)
        return slots

    async def _take_volunteers(self, slots: RelaySlots) -> None:
        """Take slots at volunteer relays as discovery finds them (up to ``most_relays`` in
        all), so that losing its own relay does not cut a node behind NAT off: a volunteer
        counts once its signed card says it relays and is reachable, and the run admits it."""
        assert self._rpc is not None
        own = str(self._rpc.host.get_id())
        while True:
            for card in list(self.all_cards()):
                if card.peer_id == own or not card.relays or card.reachable is not True:
                    continue
                direct = [a for a in (card.address, *card.other_addresses) if not is_circuit(a)]
                if not direct or slots.keeps(ID.from_base58(card.peer_id)):
                    continue
                if self.admit is not None and not await self.admit(card.peer_id):
                    continue
                if slots.add(direct[0], self.most_relays):
                    log.info("taking a slot at volunteer relay %s too", card.peer_id)
            await trio.sleep(slots.check_s)

    # ---- dialing -------------------------------------------------------------------------------

    def addresses_of(self, peer: ID) -> tuple[str, ...]:
        record = self.book.peers.get(str(peer)) if self.book is not None else None
        return record.addresses if record is not None else ()

    def waits_for(self, peer: str) -> bool:
        """Whether this node leaves the dialing to ``peer``: the peer's signed card says peers
        cannot dial it, and this node is reachable itself (the peer dials, or is reached
        through its circuit when a request needs it), or is behind NAT too and has the higher
        peer id (one circuit between two homes is enough: when both dialled, each at once after
        a cut, they opened two circuits through the same relay, and dialled again together
        whenever one of them dropped)."""
        card = self.cards(peer)
        if card is None or card.reachable is not False:
            return False
        if self.reachable() is True:
            return True
        return self.reachable() is False and self.own_id is not None and self.own_id > peer

    async def relay_addresses(self, relay: ID) -> list[multiaddr.Multiaddr]:
        """Where to dial ``relay``, if this node trusts it as a relay; else nothing."""
        configured = self._configured.get(relay)
        if configured:
            return configured
        record = self.book.peers.get(str(relay)) if self.book is not None else None
        if record is not None and record.stage == 0:
            return _direct(record.addresses)
        card = self.cards(str(relay))
        if card is None or not card.relays:
            return []
        if self.admit is not None and not await self.admit(str(relay)):
            log.info("not dialling through %s: its card says it relays, but it is not admitted",
                     relay)  # fmt: skip
            return []
        return _direct((card.address, *card.other_addresses))


def _direct(addresses: tuple[str, ...]) -> list[multiaddr.Multiaddr]:
    direct = [address for address in addresses if not is_circuit(address)]
    return [addr for address in direct for addr in peer_info(address).addrs]
