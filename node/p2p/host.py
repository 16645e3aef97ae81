"""Building a libp2p host the way GWTF needs it: Noise + yamux, one connection per peer."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.network.config import ConnectionConfig
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from gwtf.errors import ConfigError
from node.p2p.addresses import LOOPBACK, advertised, parse_announce, parse_listen

log = logging.getLogger(__name__)

#: How long closing the sockets of a stopping host may take before it is given up.
_CLOSE_S = 2.0
#: How long a peer's address stays in the peerstore (py-libp2p needs a time to live).
ADDRESS_TTL_S = 3600


def build_host(
    key_pair: KeyPair,
    dial_timeout_s: float = 10.0,
    announce: Sequence[str] = (),
    verified: list[multiaddr.Multiaddr] | None = None,
) -> IHost:
    """A host that advertises ``announce`` (public addresses, best first), then ``verified``
    (a list its owner adds to while the host runs: a router's port mapping that peers reached),
    then the addresses it listens on (``addresses.advertised``)."""
    configured = [parse_announce(addr) for addr in announce]
    later = verified if verified is not None else []
    # One connection per peer: py-libp2p otherwise dials three and waits ~250 ms on each connect.
    config = ConnectionConfig(max_connections_per_peer=1, dial_timeout=dial_timeout_s)
    return new_host(
        key_pair=key_pair,
        connection_config=config,
        muxer_preference="YAMUX",
        addrs_factory=lambda listening: advertised(listening, [*configured, *later]),
        # Identify's observed address of a node behind a NAT is its router's mapping of one
        # outgoing connection, a port nobody can dial back: never advertise it unchecked.
        disable_identify_address_discovery=True,
    )


@asynccontextmanager
async def running_host(
    key_pair: KeyPair,
    listen: Sequence[str] = (LOOPBACK,),
    announce: Sequence[str] = (),
    verified: list[multiaddr.Multiaddr] | None = None,
) -> AsyncIterator[IHost]:
    """A started host listening on ``listen`` (loopback with an ephemeral port by default) and
    advertising ``announce`` first, then ``verified`` (``build_host``)."""
    addrs = [parse_listen(addr) for addr in listen]
    host = build_host(key_pair, announce=announce, verified=verified)
    async with host.run(listen_addrs=addrs):
        try:
            yield host
        finally:
            # py-libp2p serves each TCP listener from a trio system task that only its
            # ``close`` stops, and its own shutdown path awaits other things first, which a
            # cancelled node (Ctrl-C, a crash in-process) never gets past. The listener then
            # kept accepting connections nobody served, and open connections stayed up
            # unread: peers waited out their deadlines instead of seeing the node go.
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_S):
                await close_sockets(host)


async def close_sockets(host: IHost) -> None:
    """Stop listening and close every connection, as the end of the process would."""
    network = host.get_network()
    closers = [listener.close for listener in network.listeners.values()]
    closers += [conn.close for conns in network.connections.values() for conn in conns]
    for close in closers:
        try:
            await close()
        except Exception as exc:  # one socket that fails to close must not keep the rest open
            log.debug("closing a socket of a stopping host failed: %s", exc)


def point_at(host: IHost, peer_id: ID, addrs: Sequence[multiaddr.Multiaddr]) -> None:
    """Make ``addrs`` the only addresses ``host`` dials ``peer_id`` at, from now on.

    A peer that moved (a restart on a new port) would otherwise be dialled at its old address
    first, each time at the cost of a dial's deadline (``node.p2p.dialing``), and py-libp2p
    refuses for a while to dial a peer whose dial failed."""
    host.get_peerstore().clear_addrs(peer_id)
    network = host.get_network()
    if isinstance(network, Swarm):
        network.unblock_peer(peer_id)
    host.get_peerstore().add_addrs(peer_id, addrs, ADDRESS_TTL_S)


def peer_info(address: str) -> PeerInfo:
    """Parse a full ``/ip4/.../tcp/.../p2p/<id>`` address of a bootstrap peer."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(address))
    except Exception as exc:  # multiaddr raises several unrelated types for bad text
        raise ConfigError(
            f"bad peer address {address!r}: {exc}; expected /ip4/HOST/tcp/PORT/p2p/PEER_ID"
        ) from exc


def full_addresses(host: IHost) -> list[str]:
    """Every address ``host`` advertises, best first, each with its peer id."""
    addrs = [str(addr) for addr in host.get_addrs()]
    return [addr if "/p2p/" in addr else f"{addr}/p2p/{host.get_id()}" for addr in addrs]


def full_address(host: IHost) -> str:
    """The address of ``host`` that peers dial first, with its peer id."""
    return full_addresses(host)[0]
