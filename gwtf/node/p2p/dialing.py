"""Dialing a peer at every address it has, each within a deadline, and keeping neighbours near.

py-libp2p 0.8.1 dials one TCP address per peer (the first in its peerstore) and puts no deadline
on a TCP connect: a router that drops unsolicited SYNs holds a dial for the kernel's ~127 s of
SYN retries. It also keeps two 60 s waits that strand a peer whose link came back: the swarm
refuses to dial a peer whose last dial failed (its negative cache), and the auto-connector holds
back after a disconnect. ``Dialer.connect`` tries each known address in turn, each under
``per_address_s``, and lifts both waits for the peer it dials; every dial of the node goes
through it (``RequestResponse`` dials with it before opening a stream).

``gwtf.node.p2p.keepalive`` keeps the connections to a node's neighbours up on top of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError

from gwtf.errors import ProtocolError

log = logging.getLogger(__name__)

#: How long one address may take to answer a TCP connect and the handshakes on top of it.
PER_ADDRESS_S = 3.0


class DialFailed(ProtocolError):
    """No address of a peer answered in time."""


@dataclass
class Dialer:
    """Dials a peer's addresses one by one, each within ``per_address_s``."""

    host: IHost
    per_address_s: float = PER_ADDRESS_S
    #: Connections made, for tests and status.
    dials: int = 0
    _locks: dict[str, trio.Lock] = field(default_factory=dict)

    def connected(self, peer: ID) -> bool:
        conns = self.host.get_network().get_connections(peer)
        return any(not conn.is_closed for conn in conns)

    def forgive(self, peer: ID) -> None:
        """Lift py-libp2p's waits on ``peer``: its failed-dial cache (60 s) and the
        auto-connector's cooldown after a disconnect or failed dial."""
        network = self.host.get_network()
        if isinstance(network, Swarm):
            network.unblock_peer(peer)
            network.auto_connector.clear_cooldown(peer)

    async def connect(self, peer: ID, addrs: Sequence[multiaddr.Multiaddr] = ()) -> None:
        """Be connected to ``peer``: at once if it is, else dial ``addrs`` (its peerstore
        addresses when none are given) in order until one answers; ``DialFailed`` if none."""
        lock = self._locks.setdefault(str(peer), trio.Lock())
        async with lock:
            if self.connected(peer):
                return
            candidates = list(addrs) or self._known_addrs(peer)
            if not candidates:
                raise DialFailed(f"no known address of peer {peer}")
            self.forgive(peer)
            network = self.host.get_network()
            errors: list[str] = []
            for addr in dialable(candidates):
                try:
                    with trio.fail_after(self.per_address_s):
                        await network.dial_addr(_without_peer(addr), peer)
                except trio.TooSlowError:
                    errors.append(f"{addr}: no answer in {self.per_address_s:g} s")
                    continue
                except Exception as exc:  # libp2p's dial errors have no common base
                    errors.append(f"{addr}: {_reason(exc)}")
                    continue
                self.dials += 1
                self.forgive(peer)
                if len(errors):
                    log.info("reached %s at %s after: %s", peer, addr, "; ".join(errors))
                return
            raise DialFailed(f"peer {peer} answered at no address: {'; '.join(errors)}")

    def _known_addrs(self, peer: ID) -> list[multiaddr.Multiaddr]:
        try:
            return list(self.host.get_peerstore().addrs(peer))
        except PeerStoreError:
            return []


def dialable(addrs: Iterable[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """The TCP addresses among ``addrs``, in order, without duplicates (a relay's circuit
    address is dialed by the relay transport, not here)."""
    seen: dict[str, multiaddr.Multiaddr] = {}
    for addr in addrs:
        names = [p.name for p in addr.protocols()]
        if "tcp" in names and "p2p-circuit" not in names:
            seen.setdefault(str(_without_peer(addr)), addr)
    return list(seen.values())


def _without_peer(addr: multiaddr.Multiaddr) -> multiaddr.Multiaddr:
    text = str(addr)
    return multiaddr.Multiaddr(text.split("/p2p/")[0]) if "/p2p/" in text else addr


def _reason(exc: BaseException) -> str:
    """The innermost cause of a libp2p dial error (its own message says only 'failed')."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"[:160]
