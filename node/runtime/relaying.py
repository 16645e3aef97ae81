"""A live node's part in circuit relaying (``node.p2p.relay``), tied to its settings and address
book.

* Which relays it trusts to dial peers through: its own (``p2p.relays``, by default its
  bootstrap peers, at their configured addresses) and the run's data nodes (stage 0 in their
  signed cards, at the direct addresses of their own record). A circuit a peer advertises
  through any other relay is not tried: a peer could otherwise send this node to any address
  under any relay's name.
* Which addresses a peer is dialled at: its record in the address book, whose first address
  says whether it wants to be reached through a relay.
* For a node nobody can dial (``p2p.reachable = false``): its slots at its relays, whose
  circuits its host advertises first and which alone may open circuits to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.peer.id import ID

from gwtf.errors import ConfigError
from node.p2p.host import peer_info
from node.p2p.relay import RelaySlots, is_circuit
from node.p2p.rpc import RequestResponse
from node.runtime.discovery.address_book import AddressBook

log = logging.getLogger(__name__)


@dataclass
class Relaying:
    """What the node's host, relay protocol and dialer ask about relays (see the module)."""

    #: Full addresses of this node's own relays.
    relays: tuple[str, ...]
    book: AddressBook | None = None
    slots: RelaySlots | None = None
    _configured: dict[ID, list[multiaddr.Multiaddr]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for address in self.relays:
            try:
                info = peer_info(address)
            except ConfigError:  # a bootstrap address without its id: discovery says so
                continue
            self._configured.setdefault(info.peer_id, []).extend(info.addrs)

    def circuits(self) -> list[multiaddr.Multiaddr]:
        """The circuits this node is reached through (its host advertises them first)."""
        return self.slots.addresses() if self.slots is not None else []

    def holds_slot_at(self, relay: ID) -> bool:
        """Whether ``relay`` may open circuits to this node."""
        return self.slots is not None and self.slots.holds_slot_at(relay)

    def addresses_of(self, peer: ID) -> tuple[str, ...]:
        record = self.book.peers.get(str(peer)) if self.book is not None else None
        return record.addresses if record is not None else ()

    def relay_addresses(self, relay: ID) -> list[multiaddr.Multiaddr]:
        """Where to dial ``relay``, if this node trusts it as a relay; else nothing."""
        configured = self._configured.get(relay)
        if configured:
            return configured
        record = self.book.peers.get(str(relay)) if self.book is not None else None
        if record is None or record.stage != 0:
            return []
        direct = [address for address in record.addresses if not is_circuit(address)]
        return [addr for address in direct for addr in peer_info(address).addrs]

    async def hold_slots(
        self, rpc: RequestResponse, nursery: trio.Nursery, on_change: Callable[[], None]
    ) -> None:
        """Take slots at the node's relays and keep them, each relay asked once before this
        returns: the node's first record (cards, exchanges, hints) already names the circuits
        first, and ``on_change`` rewrites it whenever they change. A node with no address at
        all (it listens nowhere) waits for its first slot."""
        own = str(rpc.host.get_id())
        relays = [address for address in self.relays if not address.endswith(own)]
        if not relays:
            raise ConfigError(
                "p2p.reachable is false but no relay is known: set p2p.relays or "
                "p2p.bootstrap_peers to reachable nodes"
            )
        self.slots = RelaySlots(rpc.host, relays, on_change=on_change)
        nursery.start_soon(self.slots.run)
        await self.slots.asked.wait()
        while not rpc.host.get_addrs():
            log.warning("no relay holds a slot for this node yet, and it has no other address")
            await trio.sleep(self.slots.check_s)
