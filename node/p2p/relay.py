"""Circuit relay v2 between nodes behind NAT: serving it, reserving a slot, dialing through it.

A thin adapter over py-libp2p 0.8.1's ``CircuitV2Protocol`` (the hop and stop handlers and the
relay's byte pump), which its swarm never uses by itself: it drops every ``/p2p-circuit``
address, registers no relay transport, and a reservation adds no address to the host's. So:

* ``circuit_relay`` runs the protocol on a host. Every node answers *stop* (it accepts
  circuits that a relay opens to it); a node with ``serve=True`` also answers *hop* (it relays),
  behind a guard that admits only peers ``admit`` accepts and caps the hop streams open at once,
  in all and per peer (py-libp2p reads no such limits: its ``HopConfig`` is never used).
* ``RelaySlots`` keeps a slot at each of a few relays (reconnecting and reserving again when
  the connection drops, refreshing before the slot expires) and says which
  ``/p2p-circuit`` addresses they give this node, for the host to advertise.
* ``CircuitDialer`` connects to a peer through a relay named in one of the peer's circuit
  addresses: first, when the peer advertises a circuit address first (it is not reachable
  directly), or after a direct dial failed. The circuit becomes an ordinary connection of the
  swarm, so every stream to the peer then runs over it.

The client side speaks the relay protocol itself (a RESERVE or CONNECT message and its status,
with the library's protobufs) instead of ``CircuitV2Transport``, which makes a reservation at
every relay it dials through and stores every relay address it hears of forever.

Limits (``RelayLimits``) are sized for a run's activation traffic, not py-libp2p's defaults
(4 reservations, 1 h and 1 GiB per circuit, its ``data=0`` resetting a circuit at its first
bytes instead of meaning "unlimited").
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.connection_types import ConnectionType
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2 import resources
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode, to_proto_status
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg
from libp2p.tools.anyio_service import background_trio_service
from multiaddr.protocols import P_P2P, P_P2P_CIRCUIT

from gwtf.errors import ProtocolError
from node.p2p.addresses import MAX_CIRCUIT_ADDRESSES

log = logging.getLogger(__name__)

Admission = Callable[[str], Awaitable[bool]]


async def _admit_everyone(_peer: str) -> bool:
    return True


@dataclass(frozen=True)
class RelayLimits:
    """What a relay grants, sized for activation traffic between a run's stages.

    A circuit carries every stream between two nodes (one connection per peer), so it lives
    as long as they train side by side: 30 min and 4 GiB over both directions (at the ~6 MB/s
    a Python relay moves each way, about 6 min of full-speed transfer) before the relay cuts
    it and the next request dials a fresh one. Slots expire after 10 min unless refreshed, so
    the slots of nodes that left come free soon. Abuse by untrusted peers is bounded by
    ``admit`` (a run's relay serves the run's staked nodes only), by the counts below, and by
    the per-circuit caps; no rate limit exists (py-libp2p meters no bandwidth).
    """

    #: Nodes holding a slot at once (py-libp2p's default: 4; hivemind: 128).
    reservations: int = 128
    reservation_ttl_s: int = 600
    circuit_duration_s: int = 30 * 60
    #: Bytes per circuit, both directions together; never 0 (py-libp2p resets at once).
    circuit_bytes: int = 4 << 30
    #: Circuits open at once to one node holding a slot (its neighbours in the run).
    circuits_per_destination: int = 16
    #: Hop streams (a reservation, or a circuit for its whole life) open at once.
    hop_streams: int = 64
    hop_streams_per_peer: int = 8

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if value <= 0:
                raise ValueError(f"relay limit {name} must be positive")

    def library_limits(self) -> resources.RelayLimits:
        return resources.RelayLimits(
            duration=self.circuit_duration_s,
            data=self.circuit_bytes,
            max_circuit_conns=self.circuits_per_destination,
            max_reservations=self.reservations,
            reservation_ttl=self.reservation_ttl_s,
        )


@dataclass
class HopGuard:
    """The hop handler's gate: who may use this relay, and how many hop streams are open."""

    protocol: CircuitV2Protocol
    limits: RelayLimits
    admit: Admission
    open_by_peer: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    @property
    def open_streams(self) -> int:
        return sum(self.open_by_peer.values())

    async def handle(self, stream: INetStream) -> None:
        peer = str(stream.muxed_conn.peer_id)
        why = await self._refusal(peer)
        if why is not None:
            self.refused += 1
            log.info("relay refused a hop stream of %s: %s", peer, why[1])
            await _refuse(stream, why[0])
            return
        self.open_by_peer[peer] = self.open_by_peer.get(peer, 0) + 1
        try:
            await self.protocol._handle_hop_stream(stream)
        except Exception:  # supervision boundary: nothing may escape a libp2p handler
            log.exception("relay hop stream of %s failed", peer)
            await _reset_quietly(stream)
        finally:
            left = self.open_by_peer[peer] - 1
            if left:
                self.open_by_peer[peer] = left
            else:
                del self.open_by_peer[peer]

    async def _refusal(self, peer: str) -> tuple[StatusCode, str] | None:
        if self.open_streams >= self.limits.hop_streams:
            return StatusCode.RESOURCE_LIMIT_EXCEEDED, f"{self.limits.hop_streams} streams open"
        if self.open_by_peer.get(peer, 0) >= self.limits.hop_streams_per_peer:
            limit = self.limits.hop_streams_per_peer
            return StatusCode.RESOURCE_LIMIT_EXCEEDED, f"{limit} streams of this peer open"
        if not await self.admit(peer):
            return StatusCode.PERMISSION_DENIED, "not admitted to the run"
        return None


@dataclass
class CircuitRelay:
    """The relay protocol running on a host; ``guard`` is None unless it serves as a relay."""

    protocol: CircuitV2Protocol
    guard: HopGuard | None


@asynccontextmanager
async def circuit_relay(
    host: IHost,
    serve: bool = False,
    limits: RelayLimits | None = None,
    admit: Admission = _admit_everyone,
) -> AsyncIterator[CircuitRelay]:
    """Accept circuits to ``host`` and, with ``serve``, relay for others within ``limits``."""
    limits = limits or RelayLimits()
    protocol = CircuitV2Protocol(host, limits=limits.library_limits(), allow_hop=False)
    guard = HopGuard(protocol, limits, admit) if serve else None
    async with background_trio_service(protocol):
        await protocol.event_started.wait()
        if guard is not None:
            host.set_stream_handler(HOP, guard.handle)
        try:
            yield CircuitRelay(protocol, guard)
        finally:
            if guard is not None:
                host.remove_stream_handler(HOP)


# ---- addresses ---------------------------------------------------------------------------------


def is_circuit(addr: multiaddr.Multiaddr | str) -> bool:
    addr = addr if isinstance(addr, multiaddr.Multiaddr) else multiaddr.Multiaddr(addr)
    return any(p.code == P_P2P_CIRCUIT for p in addr.protocols())


def circuit_address(relay: multiaddr.Multiaddr, peer: ID | None = None) -> multiaddr.Multiaddr:
    """``relay`` (``/ip4/H/tcp/P/p2p/RELAY``) + ``/p2p-circuit`` (+ ``/p2p/PEER``)."""
    tail = "/p2p-circuit" + (f"/p2p/{peer}" if peer is not None else "")
    return multiaddr.Multiaddr(f"{relay}{tail}")


def relay_of(circuit: multiaddr.Multiaddr) -> PeerInfo:
    """The relay a circuit address goes through: ``…/p2p/RELAY/p2p-circuit[/p2p/PEER]``."""
    relay = circuit.decapsulate_code(P_P2P_CIRCUIT)
    relay_id = relay.get_peer_id()
    if relay_id is None:
        raise ProtocolError(f"circuit address {str(circuit)[:80]!r} names no relay")
    return PeerInfo(ID.from_base58(relay_id), [relay.decapsulate_code(P_P2P)])


# ---- reserving a slot --------------------------------------------------------------------------


class RelayRefused(ProtocolError):
    """A relay answered a reservation or a circuit with a refusal."""

    def __init__(self, relay: ID, what: str, status: int) -> None:
        try:
            name = StatusCode(status).name
        except ValueError:
            name = str(status)
        super().__init__(f"relay {relay} refused the {what}: {name}")
        self.status = status


async def reserve(host: IHost, relay: PeerInfo, timeout_s: float) -> float:
    """Take (or refresh) a slot at ``relay``; the unix time it expires at."""
    with trio.fail_after(timeout_s):
        if not host.get_network().connections.get(relay.peer_id):
            await host.connect(relay)
        stream = await host.new_stream(relay.peer_id, [HOP])
        try:
            own = CircuitPeer(id=host.get_id().to_bytes())
            request = HopMessage(type=HopMessage.RESERVE, peer=own)
            await write_delimited_msg(stream, request)
            answer = await read_delimited_msg(stream, HopMessage)
        finally:
            await _close_quietly(stream)
    if int(answer.status) != StatusCode.OK or not answer.HasField("reservation"):
        raise RelayRefused(relay.peer_id, "reservation", answer.status)
    return float(answer.reservation.expire)


@dataclass
class RelaySlots:
    """Slots at ``relays`` (full addresses of reachable nodes), kept while the node runs.

    Each relay is checked every ``check_s``: a lost connection is dialled and the slot taken
    again at once (a relay counts a slot only while its holder stays connected), and a slot is
    refreshed once half its time has passed. ``on_change`` runs whenever the set of relays
    holding a slot changes (the node re-publishes its addresses)."""

    host: IHost
    relays: Sequence[str]
    check_s: float = 5.0
    timeout_s: float = 10.0
    on_change: Callable[[], None] = lambda: None
    #: relay peer id -> (its address, when the slot expires, unix time)
    held: dict[ID, tuple[multiaddr.Multiaddr, float]] = field(default_factory=dict)
    taken: int = 0  # slots taken or refreshed
    failures: int = 0
    #: Set once every relay has been asked for a slot (whatever each answered).
    asked: trio.Event = field(default_factory=trio.Event)
    _first_answers: int = 0

    def addresses(self) -> list[multiaddr.Multiaddr]:
        """The circuit addresses this node is reached at (without its own ``/p2p`` part)."""
        now = time.time()
        live = [addr for addr, expires in self.held.values() if expires > now]
        return [circuit_address(addr) for addr in live[:MAX_CIRCUIT_ADDRESSES]]

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for address in self.relays:
                nursery.start_soon(self._keep, multiaddr.Multiaddr(address))

    async def _keep(self, address: multiaddr.Multiaddr) -> None:
        relay_id = address.get_peer_id()
        if relay_id is None:
            raise ProtocolError(f"relay address {address} names no peer: add /p2p/PEER_ID")
        relay = PeerInfo(ID.from_base58(relay_id), [address.decapsulate_code(P_P2P)])
        first = True
        while True:
            held = self.held.get(relay.peer_id)
            connected = bool(self.host.get_network().connections.get(relay.peer_id))
            due = held is None or not connected or held[1] - time.time() < self._refresh_margin_s()
            if due:
                await self._take(relay, address)
            if first:
                first = False
                self._first_answers += 1
                if self._first_answers == len(self.relays):
                    self.asked.set()
            await trio.sleep(self.check_s)

    def _refresh_margin_s(self) -> float:
        return max(2 * self.check_s, 60.0)

    async def _take(self, relay: PeerInfo, address: multiaddr.Multiaddr) -> None:
        had = relay.peer_id in self.held
        try:
            expires = await reserve(self.host, relay, self.timeout_s)
        except Exception as exc:  # libp2p's dial errors share no base (TooSlowError too)
            self.failures += 1
            log.info("no slot at relay %s: %s", relay.peer_id, exc)
            if self.held.pop(relay.peer_id, None) is not None:
                self.on_change()
            return
        self.held[relay.peer_id] = (address, expires)
        self.taken += 1
        if not had:
            log.info("holding a slot at relay %s until %s", relay.peer_id, time.ctime(expires))
            self.on_change()


# ---- dialing through a relay ------------------------------------------------------------------


async def connect_through(
    host: IHost, circuit: multiaddr.Multiaddr, peer: ID, timeout_s: float
) -> None:
    """Open a connection to ``peer`` through the relay of ``circuit``; it joins the swarm."""
    relay = relay_of(circuit)
    with trio.fail_after(timeout_s):
        if not host.get_network().connections.get(relay.peer_id):
            await host.connect(relay)
        stream = await host.new_stream(relay.peer_id, [HOP])
        try:
            request = HopMessage(type=HopMessage.CONNECT, peer=CircuitPeer(id=peer.to_bytes()))
            await write_delimited_msg(stream, request)
            answer = await read_delimited_msg(stream, HopMessage)
            if int(answer.status) != StatusCode.OK:
                raise RelayRefused(relay.peer_id, f"circuit to {peer}", answer.status)
            where = circuit_address(relay.addrs[0].encapsulate(f"/p2p/{relay.peer_id}"), peer)
            raw = RawConnection(stream, initiator=True, connection_type=ConnectionType.RELAYED,
                                addresses=[where])  # fmt: skip
            await host.upgrade_outbound_connection(raw, peer)
        except BaseException:
            await _reset_quietly(stream)
            raise


@dataclass
class CircuitDialer:
    """Connects to peers through the relays their circuit addresses name (``rpc`` calls it)."""

    host: IHost
    timeout_s: float = 10.0
    relayed: int = 0
    failures: int = 0

    def circuits(self, peer: ID) -> list[multiaddr.Multiaddr]:
        try:
            addrs = self.host.get_peerstore().addrs(peer)
        except Exception:  # py-libp2p raises for a peer it has no record of
            return []
        return [a for a in addrs if is_circuit(a)]

    def prefers_relay(self, peer: ID) -> bool:
        """The peer advertises a circuit address first: it cannot be dialled directly."""
        try:
            addrs = self.host.get_peerstore().addrs(peer)
        except Exception:  # no record of the peer
            return False
        return bool(addrs) and is_circuit(addrs[0])

    async def before_stream(self, peer: ID) -> None:
        """Connect through a relay now when the peer asks for it and nothing is open to it."""
        if self._connected(peer) or not self.prefers_relay(peer):
            return
        await self.connect(peer)

    async def after_failure(self, peer: ID) -> bool:
        """A stream could not be opened (a direct dial failed): try the peer's relays."""
        if self._connected(peer) or not self.circuits(peer):
            return False
        return await self.connect(peer)

    async def connect(self, peer: ID) -> bool:
        """Try each of the peer's circuit addresses in turn; True once one connects."""
        for circuit in self.circuits(peer):
            try:
                await connect_through(self.host, circuit, peer, self.timeout_s)
            except Exception as exc:  # libp2p's errors share no base (TooSlowError too)
                self.failures += 1
                log.info("no circuit to %s through %s: %s", peer, circuit, exc)
                continue
            self.relayed += 1
            return True
        return False

    def _connected(self, peer: ID) -> bool:
        return bool(self.host.get_network().connections.get(peer))


def is_relayed(host: IHost, peer: ID) -> bool:
    """Whether every open connection to ``peer`` runs through a relay."""
    connections = host.get_network().connections.get(peer) or []
    return bool(connections) and all(
        any(is_circuit(a) for a in c.get_transport_addresses()) for c in connections
    )


async def _refuse(stream: INetStream, status: StatusCode) -> None:
    try:
        with trio.move_on_after(2.0):
            answer = HopMessage(type=HopMessage.STATUS, status=to_proto_status(status))
            await write_delimited_msg(stream, answer)
            await stream.close()
            return
    except Exception as exc:  # the dialer may already be gone; the refusal is best effort
        log.debug("a relay refusal was not delivered: %s", exc)
    await _reset_quietly(stream)


async def _reset_quietly(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception as exc:  # already gone
        log.debug("reset of a relay stream failed: %s", exc)


async def _close_quietly(stream: INetStream) -> None:
    try:
        await stream.close()
    except Exception as exc:  # already gone
        log.debug("close of a relay stream failed: %s", exc)
