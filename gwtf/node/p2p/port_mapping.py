"""Opening a port on a home router through UPnP IGD (``miniupnpc``, which py-libp2p requires).

A node behind a router that speaks UPnP asks it for any free external port forwarded to its
listen port (``addanyportmapping``: the router picks when the same port is taken). The mapping
is not announced as it is: ``live_node`` has peers dial it back first
(``gwtf.node.p2p.reachability``) and advertises it only if they reach the node there. A router
without UPnP, or one that refuses, costs a few seconds of discovery at start and one line in the
log; ``p2p.upnp = false`` (or ``start --no-upnp``) skips it. Every call into miniupnpc blocks, so
each runs in a thread.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import trio

log = logging.getLogger(__name__)

#: How long routers are given to answer each discovery broadcast (miniupnpc sends several: on
#: a network without UPnP, discovery takes about four times this).
DISCOVER_MS = 500
DESCRIPTION = "gwtf node"
_T = TypeVar("_T")


@dataclass(frozen=True)
class PortMapping:
    external_ip: str
    external_port: int
    internal_port: int

    @property
    def address(self) -> str:
        return f"/ip4/{self.external_ip}/tcp/{self.external_port}"


async def map_port(port: int, discover_ms: int = DISCOVER_MS) -> PortMapping | None:
    """Forward an external TCP port of the router to ``port`` of this machine; None (and a
    line in the log saying why) where there is no UPnP router or it refuses."""
    try:
        # A node stopped during discovery leaves the thread behind rather than wait for it.
        return await _in_thread(partial(_map, port, discover_ms))
    except Exception as exc:  # miniupnpc raises bare Exception for every failure
        log.info("UPnP: no port mapping (%s); peers reach this node only as it is", exc)
        return None


async def unmap_port(mapping: PortMapping) -> None:
    try:
        await _in_thread(partial(_unmap, mapping))
    except Exception as exc:  # the router may be gone; its mapping then lapses with it
        log.info("UPnP: could not remove the mapping of port %s: %s", mapping.external_port, exc)


async def _in_thread(call: Callable[[], _T]) -> _T:
    run: Any = trio.to_thread.run_sync  # mypy's view of trio lacks abandon_on_cancel
    result: _T = await run(call, abandon_on_cancel=True)
    return result


def _client(discover_ms: int) -> Any:
    import miniupnpc

    client = miniupnpc.UPnP()
    client.discoverdelay = discover_ms
    try:
        found = client.discover()
    except Exception as exc:  # raised (with the text "Success") where no device answers
        raise RuntimeError("no UPnP device answered on this network") from exc
    if found == 0:
        raise RuntimeError("no UPnP device answered on this network")
    try:
        client.selectigd()
    except Exception as exc:  # miniupnpc's message is its error string, e.g. "Success"
        raise RuntimeError("no UPnP internet gateway among the devices that answered") from exc
    return client


def _map(port: int, discover_ms: int) -> PortMapping | None:
    client = _client(discover_ms)
    external_ip = client.externalipaddress()
    if not external_ip or not ipaddress.ip_address(external_ip).is_global:
        # A router behind another NAT (carrier-grade) has no public address to offer.
        raise RuntimeError(f"the router's external address {external_ip!r} is not public")
    external = client.addanyportmapping(port, "TCP", client.lanaddr, port, DESCRIPTION, "")
    mapping = PortMapping(external_ip, int(external), port)
    log.info("UPnP: the router forwards %s to port %s", mapping.address, port)
    return mapping


def _unmap(mapping: PortMapping) -> None:
    _client(DISCOVER_MS).deleteportmapping(mapping.external_port, "TCP")
