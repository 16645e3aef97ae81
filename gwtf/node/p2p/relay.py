"""Circuit relay v2 between nodes behind NAT, the client side: slots at relays, and dialing
peers through them (``relay_service`` is the side that relays and takes circuits).

py-libp2p 0.8.1's swarm never uses a relay by itself: it drops every ``/p2p-circuit`` address,
registers no relay transport, and a reservation adds no address to the host's. So:

* ``RelaySlots`` keeps a slot at each of a few relays, more of which may be added while it runs
  (reconnecting and reserving again when the connection drops, refreshing on a period of this
  node's own clock) and says which
  ``/p2p-circuit`` addresses they give this node, for the host to advertise.
* ``CircuitDialer`` connects to a peer through a relay named in one of the peer's circuit
  addresses: first, when the peer's own record names a circuit first (it is not reachable
  directly), or after a direct dial failed. The circuit becomes an ordinary connection of the
  swarm, so every stream to the peer then runs over it. A peer's addresses are untrusted: only
  relays this node trusts are dialled (the run's data nodes, its own relays), at addresses from
  their own record, never at the address a circuit names, and only the first
  ``MAX_CIRCUIT_ADDRESSES`` circuits of a peer are tried. Each circuit it opens is reported
  (``on_circuit``), so that hole punching (``holepunch``) can try to replace it with a direct
  connection.

The client speaks the relay protocol itself (a RESERVE or CONNECT message and its status,
with the library's protobufs) instead of ``CircuitV2Transport``, which makes a reservation at
every relay it dials through and stores every relay address it hears of forever. Every stream
is ended under a shield, so a deadline that expired does not leave it open at the relay.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import multiaddr
import trio
from google.protobuf.message import Message
from libp2p.abc import IHost, INetStream
from libp2p.connection_types import ConnectionType
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.utils.varint import read_varint_prefixed_bytes_limited
from multiaddr.protocols import P_P2P, P_P2P_CIRCUIT

from gwtf.errors import ProtocolError
from gwtf.node.p2p.addresses import MAX_CIRCUIT_ADDRESSES
from gwtf.node.p2p.host import peer_info

log = logging.getLogger(__name__)

#: How long a dialer waits before asking a relay once more for a circuit to a peer it said
#: holds no slot there (the holder's connection to the relay may be coming back).
SLOT_GAP_S = 1.0

#: A hop or stop message is a peer id, a status and limits: a few hundred bytes.
MAX_RELAY_MESSAGE_BYTES = 4096
#: How long ending a stream may take (it runs shielded, after a deadline may have passed).
_END_S = 2.0
_Message = TypeVar("_Message", bound=Message)


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
    """Take (or refresh) a slot at ``relay``; the unix time it expires at (the relay's clock)."""
    stream: INetStream | None = None
    try:
        with trio.fail_after(timeout_s):
            if not host.get_network().connections.get(relay.peer_id):
                await host.connect(relay)
            stream = await host.new_stream(relay.peer_id, [HOP])
            own = CircuitPeer(id=host.get_id().to_bytes())
            await write_delimited_msg(stream, HopMessage(type=HopMessage.RESERVE, peer=own))
            answer = await read_relay_message(stream, HopMessage, timeout_s)
    finally:
        if stream is not None:
            await end_stream(stream, reset=False)
    if answer is None:
        raise ProtocolError(f"relay {relay.peer_id} sent no answer to a reservation")
    if int(answer.status) != StatusCode.OK or not answer.HasField("reservation"):
        raise RelayRefused(relay.peer_id, "reservation", answer.status)
    return float(answer.reservation.expire)


@dataclass
class RelaySlots:
    """Slots at ``relays`` (full addresses of reachable nodes), kept while the node runs.

    Each relay is checked every ``check_s``: a lost connection is dialled and the slot taken
    again at once (a relay counts a slot only while its holder stays connected), and a slot is
    refreshed every ``refresh_s`` of this node's own clock (a relay's expiry time is on its
    clock, which need not agree with this one), well inside the 10 min ``RelayLimits`` grant.
    ``on_change`` runs whenever the set of relays holding a slot changes (the node
    re-publishes its addresses)."""

    host: IHost
    relays: Sequence[str]
    check_s: float = 5.0
    refresh_s: float = 120.0
    timeout_s: float = 10.0
    on_change: Callable[[], None] = lambda: None
    #: relay peer id -> (its full address, when the slot was last taken: ``trio.current_time``)
    held: dict[ID, tuple[multiaddr.Multiaddr, float]] = field(default_factory=dict)
    taken: int = 0  # slots taken or refreshed
    failures: int = 0
    #: Set once every relay has been asked for a slot (whatever each answered).
    asked: trio.Event = field(default_factory=trio.Event)
    _first_answers: int = 0
    _nursery: trio.Nursery | None = None

    def __post_init__(self) -> None:
        # Parsed now: a bad address is a one-line ConfigError here, not a crash in a task.
        self._infos = {address: peer_info(address) for address in self.relays}

    def addresses(self) -> list[multiaddr.Multiaddr]:
        """The circuit addresses this node is reached at (without its own ``/p2p`` part)."""
        live = [address for address, _ in self.held.values()]
        return [circuit_address(addr) for addr in live[:MAX_CIRCUIT_ADDRESSES]]

    def holds_slot_at(self, relay: ID) -> bool:
        return relay in self.held

    def keeps(self, relay: ID) -> bool:
        """Whether ``relay`` is one of the relays this node keeps a slot at (or tries to)."""
        return any(kept.peer_id == relay for kept in self._infos.values())

    async def relay_addresses(self, relay: ID) -> list[multiaddr.Multiaddr]:
        """Where to dial ``relay`` if it is one of this node's relays (else nothing)."""
        return [a for info in self._infos.values() if info.peer_id == relay for a in info.addrs]

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for address, info in self._infos.items():
                nursery.start_soon(self._keep, multiaddr.Multiaddr(address), info)
            await trio.sleep_forever()  # relays may be added while it runs

    def add(self, address: str, most: int) -> bool:
        """Keep a slot at one more relay (a full address), unless this node already keeps one
        there, keeps ``most`` already, or is not running; whether it was added."""
        info = peer_info(address)
        if self.keeps(info.peer_id) or len(self._infos) >= most or self._nursery is None:
            return False
        self._infos[address] = info
        self._nursery.start_soon(self._keep, multiaddr.Multiaddr(address), info)
        return True

    async def _keep(self, address: multiaddr.Multiaddr, relay: PeerInfo) -> None:
        first = True
        while True:
            held = self.held.get(relay.peer_id)
            connected = bool(self.host.get_network().connections.get(relay.peer_id))
            due = held is None or not connected or trio.current_time() - held[1] >= self.refresh_s
            if due:
                await self._take(relay, address)
            if first:
                first = False
                self._first_answers += 1
                if self._first_answers >= len(self._infos):
                    self.asked.set()
            await trio.sleep(self.check_s)

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
        self.held[relay.peer_id] = (address, trio.current_time())
        self.taken += 1
        if not had:
            log.info("holding a slot at relay %s (its clock: until %.0f)", relay.peer_id, expires)
            self.on_change()


# ---- dialing through a relay ------------------------------------------------------------------


async def connect_through(host: IHost, relay: PeerInfo, peer: ID, timeout_s: float) -> None:
    """Open a connection to ``peer`` through ``relay`` (dialled at ``relay.addrs`` unless
    connected); it joins the swarm."""
    stream: INetStream | None = None
    try:
        with trio.fail_after(timeout_s):
            if not host.get_network().connections.get(relay.peer_id):
                await host.connect(relay)
            stream = await host.new_stream(relay.peer_id, [HOP])
            request = HopMessage(type=HopMessage.CONNECT, peer=CircuitPeer(id=peer.to_bytes()))
            await write_delimited_msg(stream, request)
            answer = await read_relay_message(stream, HopMessage, timeout_s)
            if answer is None:
                raise ProtocolError(f"relay {relay.peer_id} sent no answer to a circuit request")
            if int(answer.status) != StatusCode.OK:
                raise RelayRefused(relay.peer_id, f"circuit to {peer}", answer.status)
            relay_address = relay.addrs[0].encapsulate(f"/p2p/{relay.peer_id}")
            raw = RawConnection(stream, initiator=True, connection_type=ConnectionType.RELAYED,
                                addresses=[circuit_address(relay_address, peer)])  # fmt: skip
            await host.upgrade_outbound_connection(raw, peer)
    except BaseException:
        if stream is not None:
            await end_stream(stream, reset=True)
        raise


#: A peer's addresses from its own record, best first (full addresses); empty when unknown.
PeerAddresses = Callable[[ID], Sequence[str]]
#: Where to dial a relay this node trusts (from the relay's own record or this node's
#: settings); empty for any other. Awaited: trust may need the chain's word (admission).
TrustedRelays = Callable[[ID], Awaitable[Sequence[multiaddr.Multiaddr]]]


@dataclass
class CircuitDialer:
    """Connects to peers through the relays their circuit addresses name (``rpc`` calls it)."""

    host: IHost
    addresses: PeerAddresses
    relays: TrustedRelays
    timeout_s: float = 10.0
    #: Told of each circuit this dialer opened (``holepunch.HolePuncher.schedule``). Must not
    #: block or raise.
    on_circuit: Callable[[ID], None] = lambda _peer: None
    relayed: int = 0
    failures: int = 0
    #: Circuits not tried: their relay is not one this node trusts.
    untrusted: int = 0
    _locks: dict[str, trio.Lock] = field(default_factory=dict)

    async def circuits(self, peer: ID) -> list[PeerInfo]:
        """The trusted relays of the peer's first circuit addresses, with where to dial them."""
        found = [address for address in self.addresses(peer) if is_circuit(address)]
        relays = []
        for address in found[:MAX_CIRCUIT_ADDRESSES]:
            try:
                relay = relay_of(multiaddr.Multiaddr(address)).peer_id
            except Exception as exc:  # a record's addresses were checked; this is defensive
                log.debug("bad circuit address %r of %s: %s", address[:80], peer, exc)
                continue
            at = list(await self.relays(relay))
            if at:
                relays.append(PeerInfo(relay, at))
            else:
                self.untrusted += 1
                log.info("not dialling %s through %s: not a relay this node trusts", peer, relay)
        return relays

    def prefers_relay(self, peer: ID) -> bool:
        """The peer's own record names a circuit first: it cannot be dialled directly."""
        first = list(self.addresses(peer))[:1]
        return bool(first) and is_circuit(first[0])

    async def before_stream(self, peer: ID) -> None:
        """Connect through a relay now when the peer asks for it and nothing is open to it."""
        if self._connected(peer) or not self.prefers_relay(peer):
            return
        await self.connect(peer)

    async def after_failure(self, peer: ID) -> bool:
        """A stream could not be opened (a direct dial failed): try the peer's relays, unless
        they were just tried first."""
        if self._connected(peer) or self.prefers_relay(peer):
            return False
        return await self.connect(peer)

    async def connect(self, peer: ID) -> bool:
        """Try each of the peer's trusted relays in turn; True once one connects (or another
        caller's circuit to the peer did, while this one waited for it)."""
        # One circuit per peer: the keep-alive and each protocol's first request ask at once,
        # and each circuit costs the relay a stream pair and both ends a handshake.
        lock = self._locks.setdefault(str(peer), trio.Lock())
        try:
            async with lock:
                return await self._connect(peer)
        finally:
            # The last caller forgets the lock: one per peer being dialled, not per peer ever.
            if self._locks.get(str(peer)) is lock and not lock.statistics().locked:
                del self._locks[str(peer)]

    async def _connect(self, peer: ID) -> bool:
        if self._connected(peer):
            return True
        for relay in await self.circuits(peer):
            began = trio.current_time()
            try:
                await self._through(relay, peer)
            except Exception as exc:  # libp2p's errors share no base (TooSlowError too)
                self.failures += 1
                log.info("no circuit to %s through %s: %s", peer, relay.peer_id, exc)
                continue
            self.relayed += 1
            log.info("connected to %s through relay %s in %.2f s", peer, relay.peer_id,
                     trio.current_time() - began)  # fmt: skip
            self.on_circuit(peer)
            return True
        return False

    async def _through(self, relay: PeerInfo, peer: ID) -> None:
        """A circuit through ``relay``, asked once more after a pause if the relay answers that
        ``peer`` holds no slot: a relay honours a slot only while it holds a connection to its
        holder, and that connection can be down for a moment (seen closing as a circuit to the
        peer ends, the peer dialling it again within a second)."""
        try:
            await connect_through(self.host, relay, peer, self.timeout_s)
        except RelayRefused as exc:
            if exc.status != StatusCode.NO_RESERVATION:
                raise
            log.info("%s; asking once more in %g s", exc, SLOT_GAP_S)
            await trio.sleep(SLOT_GAP_S)
            await connect_through(self.host, relay, peer, self.timeout_s)

    def _connected(self, peer: ID) -> bool:
        return bool(self.host.get_network().connections.get(peer))


def is_relayed(host: IHost, peer: ID) -> bool:
    """Whether every open connection to ``peer`` runs through a relay."""
    connections = host.get_network().connections.get(peer) or []
    return bool(connections) and all(
        any(is_circuit(a) for a in c.get_transport_addresses()) for c in connections
    )


def relay_through(host: IHost, peer: ID) -> ID | None:
    """The relay a relayed connection to ``peer`` runs through (the first circuit address
    that names one), or None."""
    for connection in host.get_network().connections.get(peer) or []:
        for address in connection.get_transport_addresses():
            if not is_circuit(address):
                continue
            relay = address.decapsulate_code(P_P2P_CIRCUIT).get_peer_id()
            if relay is not None:
                return ID.from_base58(relay)
    return None


# ---- streams ------------------------------------------------------------------------------------


async def read_relay_message(
    stream: INetStream, kind: type[_Message], timeout_s: float
) -> _Message | None:
    """One length-prefixed relay message of at most ``MAX_RELAY_MESSAGE_BYTES``, or None if
    none came in ``timeout_s`` (or it was too long, cut short or not a ``kind``)."""
    try:
        with trio.fail_after(timeout_s):
            data = await read_varint_prefixed_bytes_limited(stream, MAX_RELAY_MESSAGE_BYTES)
        message = kind()
        message.ParseFromString(data)
    except Exception as exc:  # libp2p's stream errors, protobuf's DecodeError, TooSlowError
        log.debug("no relay message: %r", exc)
        return None
    return message


async def end_stream(stream: INetStream, reset: bool) -> None:
    """Close (or reset) ``stream`` even inside a cancelled scope, within a short bound."""
    with trio.CancelScope(shield=True), trio.move_on_after(_END_S):
        try:
            await (stream.reset() if reset else stream.close())
        except Exception as exc:  # already gone
            log.debug("ending a relay stream failed: %s", exc)
