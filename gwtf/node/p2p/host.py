"""Building a libp2p host the way GWTF needs it: Noise + yamux, one connection per peer."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
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
from gwtf.node.p2p.addresses import (
    LOOPBACK,
    advertised,
    parse_announce,
    parse_listen,
    with_circuits,
)
from gwtf.node.p2p.yamux_window import MUXER_OPTIONS, Violation, WindowedMuxers

log = logging.getLogger(__name__)

#: How long closing the sockets of a stopping host may take before it is given up.
_CLOSE_S = 2.0
#: How long a peer's address stays in the peerstore (py-libp2p needs a time to live).
ADDRESS_TTL_S = 3600


def build_host(
    key_pair: KeyPair,
    dial_timeout_s: float = 10.0,
    announce: Sequence[str] = (),
    circuits: Callable[[], Sequence[multiaddr.Multiaddr]] = tuple,
    verified: list[multiaddr.Multiaddr] | None = None,
) -> IHost:
    """A host that advertises the relay circuits ``circuits()`` names at the moment (a node
    behind NAT), ``announce`` (public addresses, best first), then ``verified`` (a list its
    owner adds to while the host runs: a router's port mapping that peers reached), then the
    addresses it listens on (``addresses.advertised``)."""
    configured = [parse_announce(addr) for addr in announce]
    later = verified if verified is not None else []
    # One connection per peer: py-libp2p otherwise dials three and waits ~250 ms on each connect.
    config = ConnectionConfig(max_connections_per_peer=1, dial_timeout=dial_timeout_s)
    host = new_host(
        key_pair=key_pair,
        connection_config=config,
        # Yamux that enforces its receive windows (``yamux_window``), and no mplex fallback.
        muxer_opt=MUXER_OPTIONS,
        addrs_factory=lambda listening: advertised(listening, [*configured, *later]),
        # Identify's observed address of a node behind a NAT is its router's mapping of one
        # outgoing connection, a port nobody can dial back: never advertise it unchecked.
        disable_identify_address_discovery=True,
    )
    _advertise_circuits(host, circuits)
    _honour_muxer_options(host)
    return host


def _honour_muxer_options(host: IHost) -> None:
    """Make ``host``'s upgrader build the yamux class of ``MUXER_OPTIONS`` (py-libp2p 0.8.1's
    negotiation builds its own ``Yamux`` otherwise; ``yamux_window.WindowedMuxers``)."""
    upgrader = getattr(host.get_network(), "upgrader", None)
    if upgrader is None:  # the swarm's layout changed: refuse to run without the guard
        raise RuntimeError("py-libp2p's swarm has no upgrader: the yamux window guard is not set")
    timeout = upgrader.muxer_multistream.negotiate_timeout
    upgrader.muxer_multistream = WindowedMuxers(MUXER_OPTIONS, timeout)


def on_window_violation(host: IHost, hook: Violation) -> bool:
    """Call ``hook(peer)`` too when a peer of ``host`` sends past a stream's receive window
    (its connection is closed in any case); whether ``host`` has the guard to hook (one built
    by ``build_host`` has)."""
    upgrader = getattr(host.get_network(), "upgrader", None)
    muxers = getattr(upgrader, "muxer_multistream", None)
    if not isinstance(muxers, WindowedMuxers):
        return False
    muxers.hooks.append(hook)
    return True


def _advertise_circuits(host: IHost, circuits: Callable[[], Sequence[multiaddr.Multiaddr]]) -> None:
    """Put ``circuits()`` (``/…/p2p/RELAY/p2p-circuit``) ahead of ``host``'s own addresses.

    Not through ``addrs_factory``: py-libp2p's ``get_addrs`` cuts every address it returns at
    its first ``/p2p/`` part to append the host's own, which turns a circuit address into the
    relay's plain address with the wrong peer id. Every user of ``get_addrs`` (identify, the
    DHT, ``full_addresses``) sees the circuits this way."""
    direct = host.get_addrs
    own = multiaddr.Multiaddr(f"/p2p/{host.get_id()}")

    def get_addrs() -> list[multiaddr.Multiaddr]:
        return with_circuits(direct(), [addr.encapsulate(own) for addr in circuits()])

    setattr(host, "get_addrs", get_addrs)  # noqa: B010 - this one instance, not the class


@asynccontextmanager
async def running_host(
    key_pair: KeyPair,
    listen: Sequence[str] = (LOOPBACK,),
    announce: Sequence[str] = (),
    circuits: Callable[[], Sequence[multiaddr.Multiaddr]] = tuple,
    verified: list[multiaddr.Multiaddr] | None = None,
) -> AsyncIterator[IHost]:
    """A started host listening on ``listen`` (loopback with an ephemeral port by default) and
    advertising ``circuits()`` and ``announce`` first, then ``verified`` (``build_host``)."""
    addrs = [parse_listen(addr) for addr in listen]
    host = build_host(key_pair, announce=announce, circuits=circuits, verified=verified)
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
    first, each time at the cost of a dial's deadline (``gwtf.node.p2p.dialing``), and py-libp2p
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
    own = f"/p2p/{host.get_id()}"
    addrs = [str(addr) for addr in host.get_addrs()]
    return [addr if addr.endswith(own) else f"{addr}{own}" for addr in addrs]


def full_address(host: IHost) -> str:
    """The address of ``host`` that peers dial first, with its peer id."""
    return full_addresses(host)[0]
