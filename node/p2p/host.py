"""Building a libp2p host the way GWTF needs it: Noise + yamux, one connection per peer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import multiaddr
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from gwtf.errors import ConfigError


def build_host(key_pair: KeyPair, dial_timeout_s: float = 10.0) -> IHost:
    # One connection per peer: py-libp2p otherwise dials three and waits ~250 ms on each connect.
    config = ConnectionConfig(max_connections_per_peer=1, dial_timeout=dial_timeout_s)
    return new_host(key_pair=key_pair, connection_config=config, muxer_preference="YAMUX")


@asynccontextmanager
async def running_host(
    key_pair: KeyPair, listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",)
) -> AsyncIterator[IHost]:
    """A started host listening on ``listen`` (loopback with an ephemeral port by default)."""
    host = build_host(key_pair)
    try:
        addrs = [multiaddr.Multiaddr(addr) for addr in listen]
    except ValueError as exc:
        raise ConfigError(f"bad listen address in {list(listen)}: {exc}") from exc
    async with host.run(listen_addrs=addrs):
        yield host


def peer_info(address: str) -> PeerInfo:
    """Parse a full ``/ip4/.../tcp/.../p2p/<id>`` address of a bootstrap peer."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(address))
    except Exception as exc:  # multiaddr raises several unrelated types for bad text
        raise ConfigError(
            f"bad peer address {address!r}: {exc}; expected /ip4/HOST/tcp/PORT/p2p/PEER_ID"
        ) from exc


def full_address(host: IHost) -> str:
    """The first listen address of ``host`` with its peer id, as other nodes dial it."""
    addr = str(host.get_addrs()[0])
    return addr if "/p2p/" in addr else f"{addr}/p2p/{host.get_id()}"
