"""Hole punching (DCUtR): two nodes behind NAT that met over a relay's circuit open a direct TCP
connection, and the circuit is closed once the direct one carries the peer's streams.

The wire protocol is libp2p's DCUtR (``/libp2p/dcutr``, the library's ``HolePunch``
protobuf): one of the two (the lower peer id) sends CONNECT with its public addresses, the
other answers CONNECT with its own, the first sends SYNC and dials half the measured round
trip later, as the other dials on reading SYNC: both dial from their listening port at once,
so each router sees its own home's packet go out before the other's comes in (TCP
simultaneous open). Which side sent SYNC decides the security handshake's roles on the one
connection both dials become: the SYNC receiver is Noise's initiator, the SYNC sender dials
"as responder" (py-libp2p's swarm supports both).

py-libp2p's ``DCUtRProtocol`` is not used: it dials every address a peer names and every
address of the peer in the peerstore (its LAN ones too), and its own loop punches every relayed
peer, at most three times for the life of the connection. Here:

* a peer's addresses are untrusted: at most ``MAX_ADDRESSES`` in a message of at most 4 KiB,
  only ``/ip4|ip6/HOST/tcp/PORT`` with a public unicast host (``punchable``): never loopback,
  a private LAN, carrier-grade NAT, link-local, multicast or reserved space, which a peer could
  name to make this node dial something on its own network;
* a node's own public address is its IP as the relay of the circuit observes it (identify's
  ``observed_addr``, asked of that relay only: a relay this node trusts already) with the port
  it listens on: a router that keeps source ports (plain MASQUERADE, most home routers) maps
  the punch's packets there; a symmetric NAT does not, and the punch fails. The IP is looked
  up ahead at each relay the node is reached through (again after ``own_ttl_s`` or on a new
  connection to the relay), so that the answer to CONNECT, whose round trip times the
  starting side's dial, waits for nothing. The punch leaves from a listener off loopback (the
  wildcard or an interface's address); a node that listens on loopback only does not punch;
* requests in flight on the circuit are not cut: each end stops opening requests on it and
  closes its streams there as their replies arrive, and the circuit is closed when none is
  left (after ``drain_s`` or the longest deadline of a request that may be on it, at most);
* of two nodes the lower peer id starts the attempt, as soon as it dials the circuit or,
  within ``check_s``, notices one the other dialled; one attempt per peer at a time, at most
  ``MAX_SESSIONS`` at once, and after a failure the next attempt to that peer waits
  ``backoff_s``, doubled on each failure up to ``max_backoff_s`` (after a success,
  ``backoff_s``: a peer that drops each punched connection is not punched every round trip):
  a punch that cannot work (a symmetric NAT, routers that answer the early SYN with a reset)
  costs a few seconds every few minutes, never a stall: the circuit stays in use throughout.
  Backoffs are kept for ``MAX_REMEMBERED`` peers at most, each until ``max_backoff_s`` after
  it ended.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, INetConn, INetStream
from libp2p.custom_types import TProtocol
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify.pb.identify_pb2 import Identify
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

from gwtf.node.p2p.addresses import MAX_ADDRESSES
from gwtf.node.p2p.relay import end_stream, is_circuit, relay_of, relay_through
from gwtf.node.p2p.rpc import Admission, admit_everyone

log = logging.getLogger(__name__)

PROTOCOL_ID = TProtocol("/libp2p/dcutr")
#: The spec's bound on one DCUtR message.
MAX_MESSAGE_BYTES = 4096
#: An identify message: keys, a few addresses and protocols.
MAX_IDENTIFY_BYTES = 8192
#: Sessions (either side) this node runs at once.
MAX_SESSIONS = 4
#: Peers whose backoff (and failures in a row) a node keeps, the least recently settled
#: forgotten first.
MAX_REMEMBERED = 1024
#: Networks no peer may send this node to (``ipaddress``'s ``is_private`` would also refuse
#: documentation and benchmarking ranges, which go nowhere on the internet and are the test
#: bed's public space).
_LOCAL_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.0.0.0/24",  # protocol assignments: DS-Lite's B4, NAT64 discovery
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
        "fec0::/10",  # site-local, deprecated but still routed on some LANs
    )
)


def punchable(addr: multiaddr.Multiaddr) -> bool:
    """Whether ``addr`` is one this node would dial for a hole punch: a TCP address of a
    public unicast IP (see the module)."""
    names = [p.name for p in addr.protocols()]
    if names not in (["ip4", "tcp"], ["ip6", "tcp"]):
        return False
    try:
        ip = ipaddress.ip_address(addr.value_for_protocol(names[0]))
        port = int(addr.value_for_protocol("tcp"))
    except ValueError:
        return False
    if not 0 < port < 65536:
        return False
    if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return False
    if ip.is_reserved or any(ip in net for net in _LOCAL_NETWORKS):
        return False
    return not (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None)


def peer_addresses(raw: list[bytes]) -> list[multiaddr.Multiaddr]:
    """The punchable addresses among a peer's ``ObsAddrs``, at most ``MAX_ADDRESSES``;
    anything else is dropped (said once, at debug: a peer behind NAT may well name its LAN)."""
    found: list[multiaddr.Multiaddr] = []
    for data in raw[: MAX_ADDRESSES * 4]:
        try:
            addr = multiaddr.Multiaddr(data)
            usable = punchable(addr)  # bytes are parsed here, lazily
        except Exception:  # multiaddr raises several unrelated types for bad bytes
            continue
        if usable and str(addr) not in {str(a) for a in found}:
            found.append(addr)
    if len(found) < len(raw):
        log.debug("dropped %d of %d hole-punch addresses", len(raw) - len(found), len(raw))
    return found[:MAX_ADDRESSES]


async def observed_ip(host: IHost, relay: ID, timeout_s: float) -> str | None:
    """This node's IP as ``relay`` sees its connection (identify's ``observed_addr``), or None."""
    stream: INetStream | None = None
    try:
        with trio.fail_after(timeout_s):
            stream = await host.new_stream(relay, [IDENTIFY])
            data = await read_varint_prefixed_bytes_limited(stream, MAX_IDENTIFY_BYTES)
        message = Identify()
        message.ParseFromString(data)
        seen = multiaddr.Multiaddr(message.observed_addr)
        names = [p.name for p in seen.protocols()]
        return str(seen.value_for_protocol(names[0])) if names[0] in ("ip4", "ip6") else None
    except Exception as exc:  # stream errors, DecodeError, a bad address, TooSlowError
        log.debug("relay %s did not say where it sees this node: %r", relay, exc)
        return None
    finally:
        if stream is not None:
            await end_stream(stream, reset=False)


def listen_ports(host: IHost) -> list[tuple[str, int]]:
    """The (IP, TCP port) pairs ``host`` listens on that a punch may dial from, IPv4 first:
    not loopback, whose packets never reach the router (a node that also listens there would
    otherwise bind its punch to 127.0.0.1). None: this node does not punch."""
    found = []
    for listener in host.get_network().listeners.values():
        for addr in listener.get_addrs():
            names = [p.name for p in addr.protocols()]
            if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
                continue
            ip = addr.value_for_protocol(names[0])
            try:
                if ipaddress.ip_address(ip).is_loopback:
                    continue
            except ValueError:
                continue
            found.append((ip, int(addr.value_for_protocol("tcp"))))
    return sorted(found, key=lambda pair: ":" in pair[0])


def direct_connections(host: IHost, peer: ID) -> list[INetConn]:
    return [
        c
        for c in host.get_network().connections.get(peer) or []
        if not any(is_circuit(a) for a in c.get_transport_addresses())
    ]


@dataclass
class HolePuncher:
    """Upgrades circuits to direct connections (``attempt``, by the lower peer id of the two)
    and answers the peer's attempts (``serve``)."""

    host: IHost
    admit: Admission = admit_everyone
    #: Told of each peer a punch connected directly, before its circuit is closed: moves the
    #: node's open streams to the peer off the circuit (``RequestResponse.retire``), and says
    #: how long a request in flight on it may still take (the circuit is kept that long).
    on_direct: Callable[[ID], Awaitable[float]] | None = None
    #: Each message's wait and each dial's deadline.
    timeout_s: float = 5.0
    #: How often peers connected through a relay only are looked for.
    check_s: float = 2.0
    backoff_s: float = 30.0
    max_backoff_s: float = 600.0
    #: How long the circuit may still carry streams begun before the upgrade, at least (a
    #: request in flight on it is waited for up to its deadline, as ``on_direct`` says;
    #: streams nobody closes, gossip's, are cut then).
    drain_s: float = 30.0
    #: How often the relays this node is reached through are checked for a public IP to
    #: look up again (none yet, ``own_ttl_s`` passed, or a new connection to the relay: a new
    #: public IP drops the old ones).
    refresh_s: float = 2.0
    own_ttl_s: float = 300.0
    attempts: int = 0
    punched: int = 0
    failures: int = 0
    refused: int = 0
    _busy: set[ID] = field(default_factory=set)
    #: Peers a punch connected directly, whether still so or not: the least recently punched
    #: forgotten first, beyond ``MAX_REMEMBERED``.
    _punched: dict[ID, None] = field(default_factory=dict)
    #: peer -> (failures in a row, ``trio.current_time`` before which no attempt starts), the
    #: least recently settled first; at most ``MAX_REMEMBERED``.
    _after: dict[ID, tuple[int, float]] = field(default_factory=dict)
    #: relay -> (this node's IP as the relay sees it, the connection it saw, when): looked up
    #: ahead, so that an answer to a peer's CONNECT waits for nothing (the peer times its dial
    #: by that round trip).
    _own: dict[ID, tuple[str, INetConn, float]] = field(default_factory=dict)
    _looking: dict[ID, trio.Event] = field(default_factory=dict)
    _nursery: trio.Nursery | None = None

    def serve(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.host.set_stream_handler(PROTOCOL_ID, self._answer)
        nursery.start_soon(self._watch)
        nursery.start_soon(self._keep_own_addresses)

    def schedule(self, peer: ID) -> None:
        """Start an attempt to ``peer`` in the background, if this node is the one of the two
        that starts (the lower peer id: two attempts that cross refuse each other, as each end
        is busy) and none is running or due later. Either way, look up this node's public IP
        at the circuit's relay if not known, for the punch to come. Never raises."""
        if self._nursery is None:
            return
        relay = relay_through(self.host, peer)
        if relay is not None and not self._fresh(relay) and listen_ports(self.host):
            self._spawn(self._refresh, relay)
        if str(peer) > str(self.host.get_id()) and self._may_start(peer):
            self._spawn(self.attempt, peer)

    def _spawn(self, task: Callable[[ID], Awaitable[object]], peer: ID) -> None:
        """Run ``task(peer)`` in the node's nursery; nothing once the node is stopping (its
        nursery cancelled or closed): ``CircuitDialer.on_circuit`` must not raise."""
        nursery = self._nursery
        if nursery is None or nursery.cancel_scope.cancel_called:
            log.debug("hole punching has stopped: no %s for %s", task.__name__, peer)
            return
        try:
            nursery.start_soon(task, peer)
        except RuntimeError as exc:  # trio: the nursery is closed to new arrivals
            log.debug("hole punching has stopped: no %s for %s: %s", task.__name__, peer, exc)

    async def _watch(self) -> None:
        """Every ``check_s``, schedule an attempt to each peer connected through a relay only
        (a circuit the peer dialled, or one whose last punch failed and whose backoff ended)."""
        while True:
            await trio.sleep(self.check_s)
            for peer in list(self.host.get_network().connections):
                self.schedule(peer)

    async def _keep_own_addresses(self) -> None:
        """Every ``refresh_s``, look up this node's public IP at each relay it is reached
        through that has none fresh, and forget the relays it is no longer connected to."""
        while True:
            for relay in [r for r, seen in self._own.items() if not self._open(r, seen[1])]:
                del self._own[relay]
            async with trio.open_nursery() as lookups:
                for relay in self._relays() if listen_ports(self.host) else ():
                    if not self._fresh(relay):
                        lookups.start_soon(self._refresh, relay)
            await trio.sleep(self.refresh_s)

    def _relays(self) -> set[ID]:
        """The relays this node is connected to and reached through: those of its own
        circuit addresses (the slots it holds) and of its circuits to peers."""
        network = self.host.get_network()
        found = set()
        for addr in self.host.get_addrs():
            if is_circuit(addr):
                try:
                    found.add(relay_of(addr).peer_id)
                except Exception as exc:  # its own addresses; defensive
                    log.debug("no relay in own address %s: %s", addr, exc)
        for peer in list(network.connections):
            relay = relay_through(self.host, peer)
            if relay is not None:
                found.add(relay)
        return {relay for relay in found if network.connections.get(relay)}

    def _open(self, relay: ID, connection: INetConn) -> bool:
        return connection in (self.host.get_network().connections.get(relay) or [])

    def _fresh(self, relay: ID) -> bool:
        seen = self._own.get(relay)
        return (
            seen is not None
            and self._open(relay, seen[1])
            and trio.current_time() < seen[2] + self.own_ttl_s
        )

    async def _refresh(self, relay: ID) -> None:
        """Look up this node's IP as ``relay`` sees it (one lookup per relay at a time)."""
        pending = self._looking.get(relay)
        if pending is not None:
            await pending.wait()
            return
        done = self._looking[relay] = trio.Event()
        try:
            connections = list(self.host.get_network().connections.get(relay) or [])
            ip = await observed_ip(self.host, relay, self.timeout_s)
            if ip is not None and connections:
                self._own[relay] = (ip, connections[0], trio.current_time())
        finally:
            del self._looking[relay]
            done.set()

    def punched_peers(self) -> list[str]:
        """The peers a punch connected directly (a connection that dropped since included)."""
        return sorted(str(p) for p in self._punched)

    def direct_peers(self) -> list[str]:
        """The peers a punch connected directly that are still connected so."""
        return sorted(str(p) for p in self._punched if direct_connections(self.host, p))

    def running(self, peer: ID) -> bool:
        """Whether an attempt with ``peer`` is under way (either side)."""
        return peer in self._busy

    def _may_start(self, peer: ID) -> bool:
        if peer in self._busy or len(self._busy) >= MAX_SESSIONS or not listen_ports(self.host):
            return False
        if direct_connections(self.host, peer) or relay_through(self.host, peer) is None:
            return False
        return trio.current_time() >= self._after.get(peer, (0, 0.0))[1]

    async def attempt(self, peer: ID) -> bool:
        """Punch a direct connection to ``peer``, connected through a relay; whether one opened."""
        if not self._may_start(peer):
            return bool(direct_connections(self.host, peer))
        self._busy.add(peer)
        stream: INetStream | None = None
        try:
            # Anyone may reach this node through its relay, with any number of peer ids.
            if not await self.admit(str(peer)):
                self.refused += 1
                log.info("no hole punch to %s: not admitted", peer)
                return False
            self.attempts += 1
            relay = relay_through(self.host, peer)
            assert relay is not None
            ours = await self._own_addresses(relay)
            with trio.fail_after(self.timeout_s * 2):
                stream = await self.host.new_stream(peer, [PROTOCOL_ID])
                began = trio.current_time()
                await write_delimited_msg(stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=ours))
                answer = await _read(stream)
                rtt = trio.current_time() - began
                if answer is None or answer.type != HolePunch.CONNECT:
                    raise ValueError("no CONNECT answer")
                theirs = peer_addresses(list(answer.ObsAddrs))
                await write_delimited_msg(stream, HolePunch(type=HolePunch.SYNC))
            await trio.sleep(min(rtt / 2, 2.0))
            ok = await self._dial(peer, theirs, as_responder=True)
        except Exception as exc:  # stream errors share no base; TooSlowError, a bad answer
            log.info("hole punch to %s failed: %s", peer, exc)
            ok = False
        finally:
            if stream is not None:
                await end_stream(stream, reset=False)
            self._busy.discard(peer)
        return self._settle(peer, ok)

    async def _answer(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        free = (
            peer not in self._busy
            and len(self._busy) < MAX_SESSIONS
            and relay_through(self.host, peer) is not None
            and bool(listen_ports(self.host))
            and trio.current_time() >= self._after.get(peer, (0, 0.0))[1]
        )
        # The session is held across admission (a chain lookup may wait): the peer's other
        # streams opened meanwhile meet it, not an empty ``_busy``.
        admitted = False
        if free:
            self._busy.add(peer)
            try:
                admitted = await self.admit(str(peer))
            finally:
                if not admitted:
                    self._busy.discard(peer)
        if not admitted:
            self.refused += 1
            log.info("refused a hole punch from %s: busy, too soon, not relayed or not admitted",
                     peer)  # fmt: skip
            await end_stream(stream, reset=True)
            return
        self.attempts += 1
        ok = False
        try:
            relay = relay_through(self.host, peer)
            assert relay is not None
            with trio.fail_after(self.timeout_s * 2):
                offer = await _read(stream)
                if offer is None or offer.type != HolePunch.CONNECT:
                    raise ValueError("no CONNECT")
                theirs = peer_addresses(list(offer.ObsAddrs))
                ours = await self._own_addresses(relay)
                await write_delimited_msg(stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=ours))
                sync = await _read(stream)
                if sync is None or sync.type != HolePunch.SYNC:
                    raise ValueError("no SYNC")
            ok = await self._dial(peer, theirs, as_responder=False)
        except Exception as exc:  # as in ``attempt``
            log.info("hole punch from %s failed: %s", peer, exc)
        finally:
            await end_stream(stream, reset=False)
            self._busy.discard(peer)
        self._settle(peer, ok)

    async def _own_addresses(self, relay: ID) -> list[bytes]:
        if not self._fresh(relay):  # not looked up ahead (the circuit opened just now)
            await self._refresh(relay)
            if not self._fresh(relay):
                return []
        ip = self._own[relay][0]
        family = "ip6" if ":" in ip else "ip4"
        ports = [port for at, port in listen_ports(self.host) if (":" in at) == (family == "ip6")]
        return [multiaddr.Multiaddr(f"/{family}/{ip}/tcp/{p}").to_bytes() for p in ports[:2]]

    async def _dial(self, peer: ID, addrs: list[multiaddr.Multiaddr], as_responder: bool) -> bool:
        """Dial ``addrs`` at once from this node's listening port; whether a direct connection
        to ``peer`` is up when they end (the first one up cancels the rest)."""
        network = self.host.get_network()
        sources = listen_ports(self.host)
        if not addrs or not sources or not isinstance(network, Swarm):
            return False
        dial = network.dial_addr_as_responder if as_responder else network.dial_addr

        async def one(addr: multiaddr.Multiaddr, done: trio.CancelScope) -> None:
            source = next((s for s in sources if (":" in s[0]) == ("ip6" in str(addr))), None)
            try:
                with trio.fail_after(self.timeout_s):
                    await dial(addr, peer, source)
                done.cancel()
            except Exception as exc:  # libp2p's dial errors share no base; TooSlowError
                log.debug("hole-punch dial of %s at %s: %r", peer, addr, exc)

        async with trio.open_nursery() as nursery:
            for addr in addrs:
                nursery.start_soon(one, addr, nursery.cancel_scope)
        return bool(direct_connections(self.host, peer))

    def _settle(self, peer: ID, ok: bool) -> bool:
        if ok:
            self.punched += 1
            self._punched.pop(peer, None)
            while len(self._punched) >= MAX_REMEMBERED:
                del self._punched[next(iter(self._punched))]
            self._punched[peer] = None
            # The failure count starts over, but not at once: a peer that drops each direct
            # connection it gets could otherwise have this node dial every round trip.
            self._remember(peer, 0, trio.current_time() + self.backoff_s)
            log.info("direct connection to %s: hole punch succeeded", peer)
            self._spawn(self._drop_circuit, peer)
            return True
        self.failures += 1
        failed, _ = self._after.get(peer, (0, 0.0))
        wait = min(self.backoff_s * 2**failed, self.max_backoff_s)
        self._remember(peer, failed + 1, trio.current_time() + wait)
        log.info("no direct connection to %s: staying on the relay, next punch in %.0f s",
                 peer, wait)  # fmt: skip
        return False

    def _remember(self, peer: ID, failed: int, until: float) -> None:
        """Keep ``peer``'s backoff; forget peers whose backoff ended ``max_backoff_s`` ago (a
        peer still on a circuit would have been tried since: it is gone), and the least
        recently settled beyond ``MAX_REMEMBERED``."""
        now = trio.current_time()
        self._after.pop(peer, None)
        for old in [p for p, (_, ends) in self._after.items() if ends + self.max_backoff_s < now]:
            del self._after[old]
        while len(self._after) >= MAX_REMEMBERED:
            del self._after[next(iter(self._after))]
        self._after[peer] = (failed, until)

    async def _drop_circuit(self, peer: ID) -> None:
        """Close the circuits to ``peer`` once their streams ended (or ``drain_s`` passed).
        New streams take the direct connection meanwhile (py-libp2p prefers a direct one), and
        both ends retire their request streams on the circuit as their requests are answered."""
        drain_s = self.drain_s
        if self.on_direct is not None:
            drain_s = max(drain_s, await self.on_direct(peer))
        circuits = [
            c
            for c in self.host.get_network().connections.get(peer) or []
            if any(is_circuit(a) for a in c.get_transport_addresses())
        ]
        with trio.move_on_after(drain_s):
            while any(c.get_streams() for c in circuits):
                await trio.sleep(0.1)
        for circuit in circuits:
            if direct_connections(self.host, peer):
                try:
                    await circuit.close()
                except Exception as exc:  # already gone
                    log.debug("closing the circuit to %s: %s", peer, exc)


async def _read(stream: INetStream) -> HolePunch | None:
    try:
        data = await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE_BYTES)
        message = HolePunch()
        message.ParseFromString(data)
    except Exception as exc:  # stream errors, a message too long, DecodeError
        log.info("a bad hole-punch message: %r", exc)
        return None
    return message
