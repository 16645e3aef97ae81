"""Circuit relay v2, the serving side: relaying for others (*hop*), and taking circuits (*stop*).

A thin adapter over py-libp2p 0.8.1's relay: of its ``CircuitV2Protocol`` only the reservation
book (``RelayResourceManager``) and the RESERVE answer are used; the service itself is never
run, because its handlers are unsafe on a network of untrusted peers:

* its *stop* handler takes a circuit from any connected peer, under any identity, with no cap:
  one stranger could open any number of connections to a node over a single TCP connection.
  Here a node takes circuits only from the relays it holds a slot at (``StopGuard``), at most
  ``max_circuits`` at once; a reachable node answers no *stop* at all.
* its *hop* handler reserves the peer a RESERVE names, not the stream's peer: one admitted peer
  could fill every slot with made-up ids. It reads messages in a loop, so a peer could keep hop
  streams idle. ``HopGuard`` reads the one message a hop stream carries itself (bounded in size
  and time) and refuses a RESERVE for anyone but the stream's own peer.
* it files each circuit under its destination (``_active_relays``), and a circuit's end closes
  whatever is filed there: ending one circuit to a node cut every other circuit to it. Here each
  circuit moves its own bytes and closes its own two streams (``_Circuit``).
* it reads no ``HopConfig``; the counts of ``RelayLimits`` below are enforced here.
* it meters no bandwidth. Here each peer's sent bytes, over all its circuits, are paid from a
  token bucket before they are forwarded, each circuit end keeping a floor of its own
  (``relay_metering``), and a peer opens at most ``circuits_per_peer`` circuits at once.

Who may use a relay is ``admit``'s decision: ``RunAdmission`` over the chain where
``chain.admission`` is on (``gwtf-node start`` always turns it on), everyone elsewhere (the local
swarm without a chain, tests).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, IMuxedConn, INetStream
from libp2p.connection_types import ConnectionType
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.network.connection.swarm_connection import SwarmConn
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2 import resources
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, Limit, StopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID as STOP
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode, to_proto_status
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.stream_muxer.yamux.yamux import DEFAULT_WINDOW_SIZE, YamuxStream

from gwtf.node.p2p.relay import end_stream, is_circuit, read_relay_message
from gwtf.node.p2p.relay_budget import CIRCUIT_FLOOR_BYTES_PER_S
from gwtf.node.p2p.relay_metering import FLOOR_BURST, RelayMeter
from gwtf.node.p2p.rpc import Admission, admit_everyone

log = logging.getLogger(__name__)

#: How long a peer may take to send a hop or stop message, and a circuit to be set up.
HANDSHAKE_S = 10.0
#: The most a relay reads of a leg at once: what an end's floor holds at most.
_CHUNK = FLOOR_BURST

#: A relay leg's yamux receive window, kept at py-libp2p's initial size: what a leg may hold
#: unread at the relay. Enough for 2 MiB/s at 100 ms of round trip; grown (up to 16 MiB, when
#: half a window is read within 4 round trips, and a peer answering pings late sets the round
#: trip) it let one peer park MiBs on every leg, and a window update on the circuit wait behind
#: them longer than yamux's 5 s.
LEG_WINDOW = DEFAULT_WINDOW_SIZE


def _pin_window(stream: INetStream) -> None:
    """Keep a leg's receive window at its initial ``LEG_WINDOW``: its autotune never grows it."""
    muxed = getattr(stream, "muxed_stream", None)
    if isinstance(muxed, YamuxStream):
        muxed._apply_autotune_epoch = _no_growth  # type: ignore[method-assign]


def _no_growth(buffered: int) -> int:
    return 0


@dataclass(frozen=True)
class RelayLimits:
    """What a relay grants, sized for activation traffic between a run's stages.

    A circuit carries every stream between two nodes (one connection per peer), so it lives
    as long as they train side by side: 30 min and 4 GiB over both directions (at the ~6 MB/s
    a Python relay moves each way, about 6 min of full-speed transfer) before the relay cuts
    it and the next request dials a fresh one. Slots expire after 10 min unless refreshed, so
    the slots of nodes that left come free soon. Abuse by untrusted peers is bounded by
    ``admit``, by the counts below, by the per-circuit caps, and by a per-peer rate
    (``relay_metering``; py-libp2p meters no bandwidth).

    The rate: 2 MiB/s for each peer's sent bytes over all its circuits, a third of what a
    Python relay moves each way. With its ends' floors (below) one peer can get more: up to
    2 + 24 x 128 KiB/s = 5 MiB/s when two colluders open the 16 circuits to it and it pushes on
    all 24 ends, about all a Python relay moves; a peer alone on its own 8 circuits gets
    3 MiB/s. It carries, sustained, one activation or gradient a
    second of gpt-small at batch 8 x 128 tokens in float32 (1 MiB), or of gpt-125m at batch
    8 x 128 in bfloat16 (1.5 MiB); routing already counts a relayed link at a fifth of its
    bandwidth, so a relayed peer is not meant to carry a stage's bulk. The burst, 16 MiB,
    passes one gpt-125m or gpt-350m microbatch of 8 x 1024 tokens in bfloat16 (12.6 and
    16.8 MB) unslowed. Within a hop's ack deadline (20 s) a peer with one busy circuit moves
    burst + 20 s x rate = 56 MiB: a 1b model's microbatch of 8 x 2048 tokens in bfloat16
    (64 MiB) does not fit, one of 6 x 2048 does; a peer with several busy circuits through
    the relay splits that between them, and counterparts that ask it for state (a run member
    may, at every step) spend the same bucket, leaving each circuit as little as its floor,
    2.5 MiB in 20 s. So the nodes at a circuit's ends size their messages against the floor
    alone (``relay_budget``): a message's deadline stretches by its size at the floor, and one
    that the floor does not carry within 2 min more is not sent, with a line saying why.

    The floor: each circuit end forwards 128 KiB/s even when its peer's bucket is empty, so a
    circuit busy both ways keeps its flow-control updates moving however many circuits share
    the peer's rate (``relay_metering``). What it can cost is bounded by a peer's ends: at most
    ``circuits_per_peer`` it opened and ``circuits_per_destination`` opened to it (counted by
    the relay per peer), 8 + 16 = 24, so 24 x 128 KiB/s = 3 MiB/s over the rate at most (a
    peer alone, whose 8 circuits go to others who send nothing, gets 1 MiB/s over it).

    A leg's unread bytes at the relay are bounded by the leg's yamux receive window, kept at
    ``LEG_WINDOW`` (256 KiB), which the host's muxer enforces (``yamux_window``: a peer
    sending more than 64 KiB past it is cut off): 320 KiB a leg, 7.5 MiB for one peer's 24
    ends, 64 circuits x 2 legs = 40 MiB at the relay.
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
    #: A peer's circuits and its reservation's refresh beside them.
    hop_streams_per_peer: int = 10
    #: Circuits one peer opens through this relay at once (one per neighbour behind NAT).
    circuits_per_peer: int = 8
    #: Bytes a second each peer may send through this relay over all its circuits (either
    #: end), and how many it may send at once above that rate; over it, its reads wait.
    peer_bytes_per_s: int = 2 << 20
    peer_burst_bytes: int = 16 << 20
    #: Bytes a second each circuit end forwards whatever its peer's bucket holds.
    circuit_floor_bytes_per_s: int = CIRCUIT_FLOOR_BYTES_PER_S

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

    def meter(self) -> RelayMeter:
        return RelayMeter(self.peer_bytes_per_s, self.peer_burst_bytes,
                          self.circuit_floor_bytes_per_s)  # fmt: skip

    @property
    def ends_per_peer(self) -> int:
        """The most circuit ends one peer has at the relay: those it opened, those to it."""
        return self.circuits_per_peer + self.circuits_per_destination

    def circuit_limit(self) -> Limit:
        return Limit(duration=self.circuit_duration_s, data=self.circuit_bytes)


@dataclass
class HopGuard:
    """The hop handler: who may use this relay, how many hop streams are open, one request each."""

    protocol: CircuitV2Protocol
    limits: RelayLimits
    admit: Admission
    #: Whether the node relays at the moment: one that peers cannot dial (its own check said
    #: so) stops taking reservations and circuits until it is reachable again.
    serving: Callable[[], bool] = lambda: True
    open_by_peer: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    #: Each peer's bandwidth budget and relayed bytes (``meter.view()`` for the node status).
    meter: RelayMeter = field(init=False)

    def __post_init__(self) -> None:
        self.meter = self.limits.meter()

    @property
    def open_streams(self) -> int:
        return sum(self.open_by_peer.values())

    async def handle(self, stream: INetStream) -> None:
        source = stream.muxed_conn.peer_id
        peer = str(source)
        # Counted before anything is awaited: a burst of streams cannot pass the caps together.
        self.open_by_peer[peer] = self.open_by_peer.get(peer, 0) + 1
        try:
            why = await self._refusal(stream, peer)
            if why is not None:
                await self._refuse(stream, peer, *why)
                return
            request = await read_relay_message(stream, HopMessage, HANDSHAKE_S)
            if request is None:
                await self._refuse(stream, peer, StatusCode.MALFORMED_MESSAGE, "no request")
            elif request.type == HopMessage.RESERVE:
                await self._reserve(stream, source, request)
            elif request.type == HopMessage.CONNECT and request.HasField("peer"):
                await self._connect(stream, source, request.peer.id)
            else:
                await self._refuse(stream, peer, StatusCode.MALFORMED_MESSAGE, "bad request")
        except Exception:  # supervision boundary: nothing may escape a libp2p handler
            log.exception("relay hop stream of %s failed", peer)
            await end_stream(stream, reset=True)
        finally:
            left = self.open_by_peer[peer] - 1
            if left:
                self.open_by_peer[peer] = left
            else:
                del self.open_by_peer[peer]

    async def _refusal(self, stream: INetStream, peer: str) -> tuple[StatusCode, str] | None:
        if not self.serving():
            return StatusCode.PERMISSION_DENIED, "not relaying: peers cannot dial this node"
        if self.open_streams > self.limits.hop_streams:
            return StatusCode.RESOURCE_LIMIT_EXCEEDED, f"{self.limits.hop_streams} streams open"
        if self.open_by_peer[peer] > self.limits.hop_streams_per_peer:
            limit = self.limits.hop_streams_per_peer
            return StatusCode.RESOURCE_LIMIT_EXCEEDED, f"{limit} streams of this peer open"
        if _over_circuit(self.protocol.host, stream):
            return StatusCode.PERMISSION_DENIED, "asked over a relayed connection"
        if not await self.admit(peer):
            return StatusCode.PERMISSION_DENIED, "not admitted to the run"
        return None

    async def _reserve(self, stream: INetStream, source: ID, request: HopMessage) -> None:
        named = request.peer.id if request.HasField("peer") else b""
        if named and named != source.to_bytes():
            # py-libp2p would reserve the named peer: a slot for someone else, or nobody.
            await self._refuse(stream, str(source), StatusCode.PERMISSION_DENIED, "not its own")
            return
        request = HopMessage(type=HopMessage.RESERVE, peer=CircuitPeer(id=source.to_bytes()))
        await self.protocol._handle_reserve(stream, request)  # the reservation book and answer
        await end_stream(stream, reset=False)

    async def _connect(self, stream: INetStream, source: ID, target: bytes) -> None:
        peer = self.meter.of(str(source))
        if peer.circuits >= self.limits.circuits_per_peer:
            why = f"{self.limits.circuits_per_peer} circuits of this peer open"
            await self._refuse(stream, str(source), StatusCode.RESOURCE_LIMIT_EXCEEDED, why)
            return
        peer.circuits += 1  # checked and counted with nothing awaited between
        try:
            await _Circuit(self.protocol, self.limits, self.meter, stream, source).run(target)
        finally:
            peer.circuits -= 1

    async def _refuse(self, stream: INetStream, peer: str, status: StatusCode, why: str) -> None:
        self.refused += 1
        log.info("relay refused a hop stream of %s: %s", peer, why)
        answer = HopMessage(type=HopMessage.STATUS, status=to_proto_status(status))
        await _answer_and_close(stream, answer)


@dataclass
class _Circuit:
    """One circuit from ``source`` through this relay: its two streams, and the bytes between."""

    protocol: CircuitV2Protocol
    limits: RelayLimits
    meter: RelayMeter
    source_stream: INetStream
    source: ID
    target_stream: INetStream | None = None
    target: ID | None = None

    async def run(self, target_bytes: bytes) -> None:
        target = self.target = ID(target_bytes)
        book = self.protocol.resource_manager
        reservation = None if target == self.source else book.get_reservation(target)
        if reservation is None or reservation.is_expired():
            await self._answer(StatusCode.NO_RESERVATION)
            return
        # Counted per peer here, not by the library's reservation: a lapsed slot taken anew
        # is a new reservation whose count starts at 0 beside the circuits still open.
        to = self.meter.of(str(target))
        if to.circuits_to >= self.limits.circuits_per_destination:
            await self._answer(StatusCode.RESOURCE_LIMIT_EXCEEDED)
            return
        to.circuits_to += 1  # checked and counted with nothing awaited between
        _pin_window(self.source_stream)
        try:
            if await self._open_to(target):
                await self._answer(StatusCode.OK, keep_open=True)
                await self._pump()
            else:
                await self._answer(StatusCode.CONNECTION_FAILED)
        finally:
            to.circuits_to -= 1
            await end_stream(self.source_stream, reset=True)
            if self.target_stream is not None:
                await end_stream(self.target_stream, reset=True)

    async def _open_to(self, target: ID) -> bool:
        """Ask ``target`` over *stop* to take the circuit; whether it did."""
        try:
            with trio.fail_after(HANDSHAKE_S):
                stream = await self.protocol.host.new_stream(target, [STOP])
                self.target_stream = stream
                _pin_window(stream)
                offer = StopMessage(type=StopMessage.CONNECT,
                                    peer=CircuitPeer(id=self.source.to_bytes()),
                                    limit=self.limits.circuit_limit())  # fmt: skip
                await write_delimited_msg(stream, offer)
            answer = await read_relay_message(stream, StopMessage, HANDSHAKE_S)
        except Exception as exc:  # libp2p's dial and stream errors share no base
            log.info("relay could not reach %s: %s", target, exc)
            return False
        return answer is not None and int(answer.status) == StatusCode.OK

    async def _answer(self, status: StatusCode, keep_open: bool = False) -> None:
        answer = HopMessage(type=HopMessage.STATUS, status=to_proto_status(status))
        if status == StatusCode.OK:
            answer.limit.CopyFrom(self.limits.circuit_limit())
        if keep_open:
            with trio.fail_after(HANDSHAKE_S):
                await write_delimited_msg(self.source_stream, answer)
        else:
            await _answer_and_close(self.source_stream, answer)

    async def _pump(self) -> None:
        """Move bytes both ways until either side ends, the time is up or the bytes are spent."""
        assert self.target_stream is not None and self.target is not None
        source, target = str(self.source), str(self.target)
        budget = [self.limits.circuit_bytes]  # both directions draw on one budget
        with trio.move_on_after(self.limits.circuit_duration_s):
            async with trio.open_nursery() as nursery:
                ends = (self.source_stream, source), (self.target_stream, target)
                for (src, sender), (dst, receiver) in (ends, ends[::-1]):
                    copy = _Copy(src, dst, sender, receiver, self.meter, budget)
                    nursery.start_soon(copy.run, nursery.cancel_scope)


@dataclass
class _Copy:
    """One direction of a circuit: reads from ``sender``'s stream are paid from its bucket, or
    this end's floor, before they are written to ``receiver``'s (a peer over its budget waits,
    its stream's flow control holding its further bytes back)."""

    src: INetStream
    dst: INetStream
    sender: str
    receiver: str
    meter: RelayMeter
    budget: list[int]

    async def run(self, done: trio.CancelScope) -> None:
        peer = self.meter.of(self.sender)
        peer.ends += 1  # kept while it relays (an idle peer's counts may be forgotten)
        # A read takes at most what the end's floor pays at once (and never more than the
        # burst or a second's rate), so a slowed sender's window opens again within half a
        # second: py-libp2p's yamux fails a write whose window stays shut for 5 s, which would
        # cut the circuit instead of slowing it.
        chunk = max(1, int(min(_CHUNK, self.meter.burst, self.meter.rate)))
        floor = self.meter.end_floor()
        try:
            while True:
                data = await self.src.read(chunk)
                if not data:
                    break
                self.budget[0] -= len(data)
                if self.budget[0] < 0:
                    log.info("a circuit spent its bytes: the relay ends it")
                    break
                await self.meter.charge(self.sender, self.receiver, len(data), floor)
                await self.dst.write(data)
                self.meter.delivered(self.receiver, len(data))
        except Exception as exc:  # a side reset or closed: the circuit is over either way
            log.debug("a relayed stream ended: %s", exc)
        finally:
            peer.ends -= 1
            done.cancel()


@dataclass
class StopGuard:
    """The stop handler: circuits are taken only from ``relays`` this node holds a slot at,
    at most ``max_circuits`` open at once (each is a connection, which costs a handshake and
    buffers)."""

    host: IHost
    relays: Callable[[ID], bool]
    max_circuits: int
    refused: int = 0
    _open: list[IMuxedConn] = field(default_factory=list)
    _starting: int = 0

    @property
    def open_circuits(self) -> int:
        network = self.host.get_network()
        live = [c.muxed_conn for conns in network.connections.values() for c in conns]
        self._open = [m for m in self._open if any(m is c for c in live)]
        return len(self._open) + self._starting

    async def handle(self, stream: INetStream) -> None:
        relay = stream.muxed_conn.peer_id
        try:
            if not self.relays(relay):
                await self._refuse(stream, relay, StatusCode.PERMISSION_DENIED, "holds no slot")
            elif self.open_circuits >= self.max_circuits:
                why = f"{self.max_circuits} circuits open"
                await self._refuse(stream, relay, StatusCode.RESOURCE_LIMIT_EXCEEDED, why)
            else:
                self._starting += 1
                try:
                    await self._take(stream, relay)
                finally:
                    self._starting -= 1
        except Exception:  # supervision boundary: nothing may escape a libp2p handler
            log.exception("circuit from relay %s failed", relay)
            await end_stream(stream, reset=True)

    async def _take(self, stream: INetStream, relay: ID) -> None:
        offer = await read_relay_message(stream, StopMessage, HANDSHAKE_S)
        if offer is None or offer.type != StopMessage.CONNECT or not offer.HasField("peer"):
            await self._refuse(stream, relay, StatusCode.MALFORMED_MESSAGE, "bad offer")
            return
        with trio.fail_after(HANDSHAKE_S):
            ok = StopMessage(type=StopMessage.STATUS, status=to_proto_status(StatusCode.OK))
            await write_delimited_msg(stream, ok)
            where = multiaddr.Multiaddr(f"/p2p/{relay}/p2p-circuit")
            raw = RawConnection(stream, initiator=False, connection_type=ConnectionType.RELAYED,
                                addresses=[where])  # fmt: skip
            muxed = await self.host.upgrade_inbound_connection(raw, where)
        self._open.append(muxed)
        # The swarm cannot tell a relayed inbound connection's address by itself: name it, so
        # ``is_relayed`` and the flow core see the circuit (its peer is the authenticated one).
        named = where.encapsulate(f"/p2p/{muxed.peer_id}")
        for conn in self.host.get_network().connections.get(muxed.peer_id) or []:
            if conn.muxed_conn is muxed and isinstance(conn, SwarmConn):
                conn.set_transport_info([named], ConnectionType.RELAYED)

    async def _refuse(self, stream: INetStream, relay: ID, status: StatusCode, why: str) -> None:
        self.refused += 1
        log.info("refused a circuit from %s: %s", relay, why)
        answer = StopMessage(type=StopMessage.STATUS, status=to_proto_status(status))
        await _answer_and_close(stream, answer)


@dataclass
class CircuitRelay:
    """The relay protocol on a host: ``hop`` when it relays, ``stop`` when it takes circuits."""

    protocol: CircuitV2Protocol
    hop: HopGuard | None
    stop: StopGuard | None


#: Circuits a node behind NAT takes at once: its neighbours in the run, with room to spare.
MAX_INBOUND_CIRCUITS = 32


@asynccontextmanager
async def circuit_relay(
    host: IHost,
    serve: bool = False,
    limits: RelayLimits | None = None,
    admit: Admission = admit_everyone,
    circuits_from: Callable[[ID], bool] | None = None,
    max_inbound_circuits: int = MAX_INBOUND_CIRCUITS,
    serving: Callable[[], bool] = lambda: True,
) -> AsyncIterator[CircuitRelay]:
    """Relay for admitted peers within ``limits`` (``serve``) while ``serving()`` says so, and
    take circuits that relays for which ``circuits_from`` says yes open to ``host`` (None: take
    none, a reachable node)."""
    limits = limits or RelayLimits()
    protocol = CircuitV2Protocol(host, limits=limits.library_limits(), allow_hop=False)
    hop = HopGuard(protocol, limits, admit, serving) if serve else None
    stop = StopGuard(host, circuits_from, max_inbound_circuits) if circuits_from else None
    if hop is not None:
        host.set_stream_handler(HOP, hop.handle)
    if stop is not None:
        host.set_stream_handler(STOP, stop.handle)
    try:
        yield CircuitRelay(protocol, hop, stop)
    finally:
        if hop is not None:
            host.remove_stream_handler(HOP)
        if stop is not None:
            host.remove_stream_handler(STOP)


def _over_circuit(host: IHost, stream: INetStream) -> bool:
    """Whether ``stream`` came over a relayed connection (the spec forbids hop requests there)."""
    conns = host.get_network().connections.get(stream.muxed_conn.peer_id) or []
    return any(
        c.muxed_conn is stream.muxed_conn
        and any(is_circuit(a) for a in c.get_transport_addresses())
        for c in conns
    )


async def _answer_and_close(stream: INetStream, answer: HopMessage | StopMessage) -> None:
    try:
        with trio.move_on_after(2.0):
            await write_delimited_msg(stream, answer)
            await end_stream(stream, reset=False)
            return
    except Exception as exc:  # the dialer may already be gone; an answer is best effort
        log.debug("a relay answer was not delivered: %s", exc)
    await end_stream(stream, reset=True)
