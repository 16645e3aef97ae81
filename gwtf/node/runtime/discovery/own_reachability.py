"""A live node's own reachability: it serves dial-backs to its peers, checks itself with them,
maps its port where the router offers UPnP, and carries the verdict in its card.

A router's mapping is checked like any address (witnesses dial it back) and only then added to
the addresses the node advertises (``verified``). A node that listens on loopback only (the
local swarm, the demo) checks nothing: nobody outside the machine could reach it anyway.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import time
from typing import Protocol

import multiaddr
import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.host import full_addresses
from gwtf.node.p2p.port_mapping import PortMapping, map_port, unmap_port
from gwtf.node.p2p.reachability import (
    WITNESSES,
    DialbackService,
    Reachability,
    ReachabilityCheck,
    ReachabilityMonitor,
)
from gwtf.node.p2p.relay import is_circuit
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.discovery.address_book import AddressBook, own_record
from gwtf.node.runtime.discovery.run_discovery import RunDiscovery

log = logging.getLogger(__name__)


class VerdictHeard(Protocol):
    """Told of each reachability verdict of this node. Must not block or raise: the check's
    loop waits for it."""

    def __call__(self, verdict: Reachability, /) -> None: ...


def serve_dialbacks(rpc: RequestResponse, book: AddressBook) -> None:
    """Dial peers back on request, at the addresses their own records claim."""

    def claimed(peer: str) -> tuple[str, ...]:
        record = book.peers.get(peer)
        return record.addresses if record is not None else ()

    DialbackService(rpc, claimed).serve()


def public_port(rpc: RequestResponse) -> int | None:
    """The port this node listens on beyond loopback, or None (a loopback-only node)."""
    for listener in rpc.host.get_network().listeners.values():
        for addr in listener.get_addrs():
            names = [p.name for p in addr.protocols()]
            if names[:2] != ["ip4", "tcp"] and names[:2] != ["ip6", "tcp"]:
                continue
            if not ipaddress.ip_address(addr.value_for_protocol(names[0])).is_loopback:
                return int(addr.value_for_protocol("tcp"))
    return None


def loopback_only(rpc: RequestResponse) -> bool:
    """Whether the node listens, but on loopback only (the local swarm, the demo, tests)."""
    listeners = rpc.host.get_network().listeners.values()
    return public_port(rpc) is None and any(listener.get_addrs() for listener in listeners)


async def watch_reachability(
    rpc: RequestResponse,
    book: AddressBook,
    discovery: RunDiscovery,
    verified: list[multiaddr.Multiaddr],
    upnp: bool,
    on_verdict: VerdictHeard,
) -> None:
    """Check this node's reachability for as long as it runs (see the module)."""
    port = public_port(rpc)
    if port is None:
        return
    check = ReachabilityCheck(rpc)
    check.serve()
    mapping = await map_port(port) if upnp else None
    own_id = str(rpc.host.get_id())
    mapped = f"{mapping.address}/p2p/{own_id}" if mapping is not None else None

    def addresses() -> list[str]:
        # Its direct addresses only: a witness reaching it through its relay proves nothing.
        advertised = [a for a in full_addresses(rpc.host) if not is_circuit(a)]
        if mapped is None or mapped in advertised:
            return advertised
        return [mapped, *advertised][: len(advertised) + 1]

    def witnesses() -> list[ID]:
        connections = rpc.host.get_network().connections
        members = [ID.from_base58(peer) for peer in book.peers]
        connected = [peer for peer in members if connections.get(peer)]
        return random.sample(connected, min(WITNESSES, len(connected)))

    def heard(result: Reachability) -> None:
        if mapping is not None and mapped is not None:
            _adopt_mapping(result, mapping, mapped, verified, rpc, book)
        discovery.reachability = result
        on_verdict(result)
        if discovery.announced.is_set():
            trio.lowlevel.spawn_system_task(discovery.announce)

    monitor = ReachabilityMonitor(
        check, addresses, witnesses, heard, wall_ms=lambda: int(time.time() * 1000)
    )
    try:
        await monitor.run()
    finally:
        if mapping is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                await unmap_port(mapping)


def _adopt_mapping(
    result: Reachability,
    mapping: PortMapping,
    mapped: str,
    verified: list[multiaddr.Multiaddr],
    rpc: RequestResponse,
    book: AddressBook,
) -> None:
    """Advertise the router's mapping once witnesses reached the node there."""
    addr = multiaddr.Multiaddr(mapping.address)
    if result.reachable and result.address == mapped and addr not in verified:
        verified.append(addr)
        book.own = own_record(rpc, book.own.region)
        log.info("UPnP: peers reach this node at %s; advertising it", mapping.address)
    elif not result.reachable and addr not in verified:
        log.info("UPnP: peers did not reach this node at %s; not advertising it", mapping.address)
