"""The addresses a node listens on, the ones it advertises, and the checks on a peer's list.

Pure apart from reading the machine's interfaces (injected, so tests pass their own). A node
listens on one or more TCP multiaddrs (``p2p.listen``; ``/ip4/0.0.0.0/tcp/P`` is every IPv4
interface) and may name public addresses it is reached at (``p2p.announce``: a port forwarded
on its router, a DNS name). It advertises the announced ones first, then each listen address
with a wildcard replaced by the interfaces' addresses; a peer dials the first one it can use,
so the order is the node's preference. Loopback addresses are advertised only by a node that
listens on nothing else: from another machine they name the dialer itself.

A node that cannot be dialled directly holds slots at relays (``gwtf.node.p2p.relay``) and
advertises their ``/p2p-circuit`` addresses first, at most ``MAX_CIRCUIT_ADDRESSES`` of them: peers
then dial it through a relay straight away, and a peer on its own network may still use the direct
ones after them.

A peer's addresses are untrusted: at most ``MAX_ADDRESSES``, each bounded in length, a TCP
address of an IP or DNS host, or a circuit through one (``HOST/tcp/PORT/p2p/RELAY/p2p-circuit``),
and each naming that peer's id last.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence

import multiaddr
from multiaddr.utils import get_network_addrs

from gwtf.errors import ConfigError, ProtocolError

#: Addresses one peer may advertise; more are cut (ours) or refused (a peer's).
MAX_ADDRESSES = 4
#: Of those, circuit addresses (one per relay holding a slot for the node).
MAX_CIRCUIT_ADDRESSES = 2
#: The longest full address (with its ``/p2p/<id>``) taken from a peer.
MAX_ADDRESS_CHARS = 200
#: Every interface: the default of ``gwtf-node start``.
ALL_INTERFACES = "/ip4/0.0.0.0/tcp/0"
#: This machine only: the local swarm, the demo and tests.
LOOPBACK = "/ip4/127.0.0.1/tcp/0"

_IP_HOSTS = ("ip4", "ip6")
_DNS_HOSTS = ("dns", "dns4", "dns6")
_TCP_P2P = ["tcp", "p2p"]
_CIRCUIT = ["p2p-circuit", "p2p"]


def parse_listen(text: str) -> multiaddr.Multiaddr:
    """A listen address: ``/ip4/HOST/tcp/PORT`` or ``/ip6/HOST/tcp/PORT``."""
    addr = _two_parts(text, _IP_HOSTS, "listen address", "/ip4/0.0.0.0/tcp/4001")
    return addr


def parse_announce(text: str) -> multiaddr.Multiaddr:
    """An announced address: an IP or DNS host and a TCP port (no ``/p2p/``: the node adds it)."""
    addr = _two_parts(
        text, _IP_HOSTS + _DNS_HOSTS, "announced address", "/ip4/203.0.113.7/tcp/4001"
    )
    host = addr.value_for_protocol(_protocols(addr)[0])
    if _is_ip(addr) and ipaddress.ip_address(host).is_unspecified:
        raise ConfigError(f"announced address {text!r} names no host; give the public IP")
    if int(addr.value_for_protocol("tcp")) == 0:
        raise ConfigError(f"announced address {text!r} has port 0; give the port peers dial")
    return addr


def check_listen(values: Sequence[str]) -> str | None:
    """Why ``p2p.listen`` is unusable, or None (for the settings' validators)."""
    return _check_list(values, parse_listen, allow_empty=False)


def check_announce(values: Sequence[str]) -> str | None:
    """Why ``p2p.announce`` is unusable, or None."""
    return _check_list(values, parse_announce, allow_empty=True)


def advertised(
    listening: Iterable[multiaddr.Multiaddr],
    announce: Iterable[multiaddr.Multiaddr],
    interfaces: Callable[[int], list[str]] = get_network_addrs,
) -> list[multiaddr.Multiaddr]:
    """What a node tells peers, best first: ``announce``, then ``listening`` (the bound
    addresses, real ports) with wildcards expanded over ``interfaces(4 or 6)``, loopback kept
    only when nothing else is left; no duplicates, at most ``MAX_ADDRESSES``."""
    routable: list[multiaddr.Multiaddr] = list(announce)
    loopback: list[multiaddr.Multiaddr] = []
    for addr in listening:
        for concrete in _expand(addr, interfaces):
            (loopback if _is_loopback(concrete) else routable).append(concrete)
    chosen = routable or loopback
    unique = list({str(a): a for a in chosen}.values())
    return unique[:MAX_ADDRESSES]


def with_circuits(
    direct: Sequence[multiaddr.Multiaddr], circuits: Sequence[multiaddr.Multiaddr]
) -> list[multiaddr.Multiaddr]:
    """A node's advertised addresses once it holds relay slots: the first
    ``MAX_CIRCUIT_ADDRESSES`` circuits, then ``direct`` ones, at most ``MAX_ADDRESSES``."""
    relayed = list(circuits[:MAX_CIRCUIT_ADDRESSES])
    return (relayed + list(direct))[:MAX_ADDRESSES]


def parse_relay(text: str) -> multiaddr.Multiaddr:
    """A relay's full address: an IP or DNS host, a TCP port and the relay's ``/p2p/`` id."""
    example = "/ip4/203.0.113.7/tcp/4001/p2p/16Uiu2HAm..."
    try:
        addr = multiaddr.Multiaddr(text)
        names = _protocols(addr)
        owner = addr.get_peer_id()
    except Exception as exc:  # multiaddr raises several unrelated types for bad text
        raise ConfigError(f"bad relay address {text!r} ({exc}); write it like {example}") from exc
    if len(names) != 3 or names[0] not in _IP_HOSTS + _DNS_HOSTS or names[1:] != _TCP_P2P:
        raise ConfigError(f"relay address {text!r} is not HOST/tcp/PORT/p2p/ID, like {example}")
    if owner is None:
        raise ConfigError(f"relay address {text!r} names no peer id; write it like {example}")
    return addr


def check_relays(values: Sequence[str]) -> str | None:
    """Why ``p2p.relays`` is unusable, or None."""
    return _check_list(values, parse_relay, allow_empty=True)


def check_peer_addresses(addresses: Sequence[str], peer_id: str) -> None:
    """Refuse a peer's list of full addresses unless each is a bounded TCP address of it."""
    if not 1 <= len(addresses) <= MAX_ADDRESSES:
        raise ProtocolError(f"{len(addresses)} addresses, expected 1..{MAX_ADDRESSES}")
    for address in addresses:
        if len(address) > MAX_ADDRESS_CHARS:
            raise ProtocolError(f"address of {len(address)} characters, over {MAX_ADDRESS_CHARS}")
        try:
            addr = multiaddr.Multiaddr(address)
            owner = addr.get_peer_id()
            names = _protocols(addr)
        except Exception as exc:  # multiaddr raises several unrelated types for bad text
            raise ProtocolError(f"bad peer address {address[:80]!r}: {exc}") from exc
        if owner != peer_id:
            raise ProtocolError(f"address {address[:80]!r} names another peer")
        direct = names[:3] if names[3:] in ([], _CIRCUIT) else []
        if len(direct) != 3 or direct[0] not in _IP_HOSTS + _DNS_HOSTS or direct[1:] != _TCP_P2P:
            raise ProtocolError(
                f"address {address[:80]!r} is neither HOST/tcp/PORT/p2p/ID nor "
                "HOST/tcp/PORT/p2p/RELAY/p2p-circuit/p2p/ID"
            )
        if names[3:] and addr.value_for_protocol("p2p") == peer_id:
            raise ProtocolError(f"address {address[:80]!r} relays the peer through itself")


def _two_parts(text: str, hosts: tuple[str, ...], what: str, example: str) -> multiaddr.Multiaddr:
    try:
        addr = multiaddr.Multiaddr(text)
        names = _protocols(addr)
    except Exception as exc:  # multiaddr raises several unrelated types for bad text
        raise ConfigError(f"bad {what} {text!r} ({exc}); write it like {example}") from exc
    if len(names) != 2 or names[0] not in hosts or names[1] != "tcp":
        raise ConfigError(f"{what} {text!r} is not a TCP address; write it like {example}")
    return addr


def _check_list(
    values: Sequence[str], parse: Callable[[str], object], allow_empty: bool
) -> str | None:
    if not values and not allow_empty:
        return "must name at least one address, e.g. /ip4/0.0.0.0/tcp/4001"
    if len(values) > MAX_ADDRESSES:
        return f"may name at most {MAX_ADDRESSES} addresses"
    for value in values:
        try:
            parse(value)
        except ConfigError as exc:
            return f"has a {exc}"
    return None


def _protocols(addr: multiaddr.Multiaddr) -> list[str]:
    return [p.name for p in addr.protocols()]


def _is_ip(addr: multiaddr.Multiaddr) -> bool:
    return _protocols(addr)[0] in _IP_HOSTS


def _is_loopback(addr: multiaddr.Multiaddr) -> bool:
    if not _is_ip(addr):
        return False
    return ipaddress.ip_address(addr.value_for_protocol(_protocols(addr)[0])).is_loopback


def _expand(
    addr: multiaddr.Multiaddr, interfaces: Callable[[int], list[str]]
) -> list[multiaddr.Multiaddr]:
    """``addr`` itself, or for a wildcard host every interface address of its family."""
    names = _protocols(addr)
    if names[0] not in _IP_HOSTS:
        return [addr]
    host, port = addr.value_for_protocol(names[0]), addr.value_for_protocol("tcp")
    if not ipaddress.ip_address(host).is_unspecified:
        return [addr]
    family = 4 if names[0] == "ip4" else 6
    found = [ip for ip in interfaces(family) if not ipaddress.ip_address(ip).is_link_local]
    found = found or (["127.0.0.1"] if family == 4 else ["::1"])
    return [multiaddr.Multiaddr(f"/{names[0]}/{ip}/tcp/{port}") for ip in found]
