"""Request/response over libp2p: many framed requests on one stream per (peer, protocol).

Everything that must arrive (flow-protocol messages, activations, acknowledgements, weights) goes
through here; pubsub is only for hints. Opening a stream costs a multistream negotiation (several
Noise-encrypted yamux frames each way, ~10 ms of CPU in py-libp2p), so a node opens one stream per
peer and protocol and sends every request on it. Each frame carries a request id:

    request frame: id u32 | request bytes
    reply frame:   id u32 | status u8 (0 ok, 1 refused) | reply bytes, or the reason refused

The serving side answers each request in its own task (so a slow request does not hold back the
ones behind it) and writes replies in any order; the sending side has one reader task per stream
that hands each reply to the request waiting for it, every request has its own deadline, and a
stream that breaks (the peer died, reset it or sent bytes that are not a frame) fails all its
waiting requests at once with ``PeerUnavailable`` and is reopened by the next request.

Handler safety and scoring: a stream handler never lets an exception escape (in py-libp2p an
escaped exception is swallowed and wedges the whole connection to that peer). A banned or
unadmitted peer's stream is reset before anything is read, except that a protocol served in
public (``PublicRate``: an auditor's receipts) answers unadmitted peers within one shared rate,
on a capped number of streams, each closed once idle; those its ``Seats`` hold (a seated juror
of a case about this node, read from the chain) each within a rate and streams of their own.
A frame that is oversized, truncated or stalled is charged to the peer and resets its stream
(nothing after it can be framed); a request the handler rejects as malformed is charged and
refused on its own, as is one on which the handler fails; a request the handler could not answer
in time is refused but not charged (the slowness is this node's). A reply that is not a frame or
too large is charged to the peer that sent it.
"""

from __future__ import annotations

import logging
import math
import struct
from dataclasses import dataclass, field
from typing import Protocol

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.dialing import Dialer, DialFailed
from gwtf.node.p2p.framing import FrameError, FrameReader, encode_frame
from gwtf.node.p2p.host import on_window_violation
from gwtf.node.p2p.relay_budget import RelayBudget, RelayedLinks
from gwtf.node.p2p.scoring import Offence, PeerScores

log = logging.getLogger(__name__)


class Handler(Protocol):
    """Answer a peer's request (its id, the request's bytes) with the reply's bytes, within the
    protocol's deadline (past it the request is refused). Raise ``Decline`` to refuse it
    uncharged, ``ProtocolError`` to refuse it and charge the peer; anything else is a handler
    failure, logged and charged too."""

    async def __call__(self, peer: str, request: bytes, /) -> bytes: ...


class Admission(Protocol):
    """Whether a peer may talk to this node (e.g. ``RunAdmission`` over the chain). Asked
    before a stream of the peer's is read; may wait on a lookup (the chain), and answers False
    when it cannot tell. Does not raise."""

    async def __call__(self, peer: str, /) -> bool: ...


class Shaper(Protocol):
    """Seconds a request of ``size`` bytes to ``peer`` waits before it is written (link
    emulation). Pure; does not block or raise."""

    def __call__(self, peer: str, size: int, /) -> float: ...


class Charge(Protocol):
    """Score a peer down for an offence, with what it did (for the log). Does not block or
    raise."""

    def __call__(self, peer: str, offence: Offence, what: object, /) -> None: ...


class Circuits(Protocol):
    """Connections through relays to peers that cannot be dialled directly
    (``gwtf.node.p2p.relay.CircuitDialer``)."""

    async def before_stream(self, peer: ID) -> None: ...

    async def after_failure(self, peer: ID) -> bool: ...


_REQUEST = struct.Struct(">I")
_REPLY = struct.Struct(">IB")
_OK, _REFUSED = 0, 1
_MAX_REASON_BYTES = 256
#: Requests one peer may have in a handler at once on one stream; more wait to be read.
MAX_REQUESTS_PER_STREAM = 64


class PeerUnavailable(ProtocolError):
    """A request to a peer failed: it is unreachable, reset the stream or sent a bad reply."""


class RequestDeclined(PeerUnavailable):
    """The peer understood the request and will not serve it now (a copy of work already done,
    a hop of an iteration it has left): it is alive, and nobody is at fault."""


class RequestRefused(PeerUnavailable):
    """The peer answered the request, with a refusal that is not a decline (its handler failed
    or refused it) or a reply out of bounds: it is up, and will not or cannot serve it."""


class Decline(ProtocolError):
    """Raised by a handler to refuse a well-formed request without charging its sender."""


class NotHere(Decline):
    """Raised by a handler to refuse a request for a part this peer no longer plays (a hop for
    a stage it moved from): its sender acted on stale knowledge, is not at fault, and should
    forget this peer in that part (``RequestMisdirected``)."""


class RequestMisdirected(RequestDeclined):
    """The peer declined a request for a part it does not play (``NotHere``): it is alive, but
    not where the sender thought."""


#: A refusal's reason starts with this when the handler declined (``RequestDeclined``), and
#: goes on with the second when the peer does not play the part asked of it.
_DECLINED = "declined: "
_NOT_HERE = "not here: "


class PeerTimeout(PeerUnavailable):
    """A peer did not answer within the deadline."""


class TooLargeForRelay(RequestDeclined):
    """A request (with its expected reply) is larger than a relay carries in time to the peer,
    which this node reaches only through one: not sent (``relay_budget``). The peer is alive
    and at no fault; the reason says what to do."""


@dataclass(frozen=True)
class RpcLimits:
    """Bounds of one request/response exchange."""

    max_request_bytes: int = 1 << 20
    max_response_bytes: int = 1 << 20
    timeout_s: float = 20.0
    #: The reply's expected size where it is large (a gatherer's combined share): over a
    #: relay the request's deadline stretches for it too (``relay_budget``).
    reply_bytes: int = 0
    #: More time a handler may take on a request that came over a relay (a gatherer waiting
    #: for relayed shares); a request on a direct connection keeps ``timeout_s``.
    relayed_answer_s: float = 0.0
    #: Over a relay, send a request past the budget anyway (with the most stretch) instead of
    #: refusing it: for a message whose refusal is worse than its loss. A replica's share is
    #: one: a follower refused turns to the next gatherer, possibly itself, and would apply a
    #: result of its own beside the live leader's; sent, it may still cross (relays are most
    #: often faster than their floor), and if it does not, it fails as a missed deadline.
    send_past_budget: bool = False


async def admit_everyone(_peer: str) -> bool:
    return True


class Seats(Protocol):
    """Outsiders this node has a reason of its own to answer beyond the shared rate (the
    seated jurors of a case about it): what it holds it reads itself (from the chain), never
    from the peer's request, and it bounds its own cost whoever asks."""

    async def holds(self, peer: str, /) -> bool: ...


#: Budgets of seats kept at once: past it they start afresh (seats of cases long over).
MAX_SEATS = 1024


@dataclass
class _Bucket:
    per_s: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class PublicRate:
    """The rate at which a protocol answers peers outside the run: one budget for all of them
    (a fresh peer id costs nothing, so a budget per peer would bound nothing), refilled at
    ``per_s`` up to ``burst``. A request over it is declined, not charged.

    With ``seats``, an outsider those hold (a seated juror, whose peer id is its node key and
    whose seat the chain says) is answered outside that budget and its stream cap, within a
    budget of its own (``seat_per_s`` up to ``seat_burst``) on at most ``streams_per_seat``
    streams: whoever floods the shared budget cannot starve it, and it cannot flood either."""

    per_s: float = 10.0
    burst: float = 20.0
    #: Streams of outsiders open at once, and how long one may wait idle for its next request:
    #: an outsider's open stream holds a task and buffers, and costs it nothing to keep.
    max_streams: int = 32
    idle_s: float = 30.0
    streams: int = 0
    seats: Seats | None = None
    seat_per_s: float = 10.0
    seat_burst: float = 20.0
    streams_per_seat: int = 4
    _shared: _Bucket | None = None
    #: One budget and stream count per seat held now (bounded by the seats the chain gives).
    _per_seat: dict[str, _Bucket] = field(default_factory=dict)
    _seat_streams: dict[str, int] = field(default_factory=dict)

    def take(self, now: float) -> bool:
        if self._shared is None:
            self._shared = _Bucket(self.per_s, self.burst)
        return self._shared.take(now)

    async def seated(self, peer: str) -> bool:
        if self.seats is None or not await self.seats.holds(peer):
            self._per_seat.pop(peer, None)
            return False
        return True

    def take_seat(self, peer: str, now: float) -> bool:
        if peer not in self._per_seat and len(self._per_seat) >= MAX_SEATS:
            self._per_seat.clear()  # seats long over: a fresh budget costs a seat nothing
        bucket = self._per_seat.setdefault(peer, _Bucket(self.seat_per_s, self.seat_burst))
        return bucket.take(now)

    def open_seat_stream(self, peer: str) -> bool:
        held = self._seat_streams.get(peer, 0)
        if held >= self.streams_per_seat:
            return False
        self._seat_streams[peer] = held + 1
        return True

    def close_seat_stream(self, peer: str) -> None:
        self._seat_streams[peer] -= 1
        if self._seat_streams[peer] == 0:
            del self._seat_streams[peer]

    def limiting(self, handler: Handler) -> Handler:
        async def limited(peer: str, request: bytes) -> bytes:
            now = trio.current_time()
            if await self.seated(peer):
                if not self.take_seat(peer, now):
                    raise Decline(f"busy: a seated juror gets {self.seat_per_s:g} requests/s here")
            elif not self.take(now):
                raise Decline(f"busy: peers outside the run get {self.per_s:g} requests/s here")
            return await handler(peer, request)

        return limited


@dataclass
class RequestResponse:
    """Serves and sends framed request/response exchanges on a libp2p host."""

    host: IHost
    scores: PeerScores = field(default_factory=PeerScores)
    #: Every dial of a request goes through it (each address in turn, with a deadline).
    dialer: Dialer = field(default=None)  # type: ignore[assignment]
    admit: Admission = admit_everyone
    shaper: Shaper | None = None
    #: Dials through a relay a peer that advertises only circuits or whose direct dial failed.
    circuits: Circuits | None = None
    refused: dict[str, int] = field(default_factory=dict)
    streams_opened: int = 0
    #: What a message's size adds to its deadline over a relay, and what is too large for one.
    relay_budget: RelayBudget = field(default_factory=RelayBudget)
    relayed: RelayedLinks = field(init=False)
    _channels: dict[tuple[str, str], _Channel] = field(default_factory=dict)
    #: The longest deadline of a served protocol: how long a peer's request may be in flight.
    _longest_served_s: float = 0.0
    _opening: dict[tuple[str, str], trio.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dialer is None:
            self.dialer = Dialer(self.host)
        self.relayed = RelayedLinks(self.host, self.relay_budget)
        # A host not built by ``build_host`` (a test's fake) has no window guard to hook.
        on_window_violation(self.host, self._muxer_offence)

    def _muxer_offence(self, peer: ID, offence: Offence) -> None:
        """A peer broke a limit of its yamux connection (the muxer already acted on it)."""
        self.scores.penalise(str(peer), offence, trio.current_time())

    # ---- serving ------------------------------------------------------------------------------

    def serve(
        self,
        protocol: str,
        handler: Handler,
        limits: RpcLimits,
        public: PublicRate | None = None,
        outsiders: Handler | None = None,
    ) -> None:
        """Answer requests on ``protocol`` with ``handler(peer_id, request) -> reply``; with
        ``public``, peers the run does not admit are answered too, within its rate, by
        ``outsiders`` when given (what a protocol serves anyone may be less than it serves the
        run's nodes)."""

        self._longest_served_s = max(self._longest_served_s, limits.timeout_s)

        async def on_stream(stream: INetStream) -> None:
            peer = str(stream.muxed_conn.peer_id)
            try:
                await self._serve_stream(stream, peer, handler, limits, public, outsiders)
            except Exception:  # supervision boundary: nothing may escape a libp2p handler
                log.exception("stream of %s from %s failed", protocol, peer)
                self.scores.penalise(peer, Offence.HANDLER_FAILURE, trio.current_time())
                await _reset_quietly(stream)

        self.host.set_stream_handler(TProtocol(protocol), on_stream)

    def _refuse(self, peer: str, why: str) -> None:
        self.refused[peer] = self.refused.get(peer, 0) + 1
        log.warning("refused a stream from %s: %s", peer, why)

    async def _serve_stream(
        self,
        stream: INetStream,
        peer: str,
        handler: Handler,
        limits: RpcLimits,
        public: PublicRate | None = None,
        outsiders: Handler | None = None,
    ) -> None:
        banned = self.scores.is_banned(peer, trio.current_time())
        admitted = not banned and await self.admit(peer)
        if not admitted and (banned or public is None):
            self._refuse(peer, "banned or not admitted to the run")
            await _reset_quietly(stream)
            return
        if admitted:
            await self._serve_frames(stream, peer, handler, limits, None)
            return
        assert public is not None
        limited = public.limiting(outsiders or handler)
        if await public.seated(peer):
            # Its own streams, not the outsiders': a flood of those must not shut it out.
            if not public.open_seat_stream(peer):
                self._refuse(peer, f"{public.streams_per_seat} streams of this juror are open")
                await _reset_quietly(stream)
                return
            try:
                await self._serve_frames(stream, peer, limited, limits, public.idle_s)
            finally:
                public.close_seat_stream(peer)
            return
        if public.streams >= public.max_streams:
            self._refuse(peer, f"{public.max_streams} streams of peers outside the run are open")
            await _reset_quietly(stream)
            return
        public.streams += 1
        try:
            await self._serve_frames(stream, peer, limited, limits, public.idle_s)
        finally:
            public.streams -= 1

    async def _serve_frames(
        self,
        stream: INetStream,
        peer: str,
        handler: Handler,
        limits: RpcLimits,
        idle_s: float | None,
    ) -> None:
        """Answer the stream's requests until it closes; with ``idle_s``, close it too once it
        has waited that long for a request."""
        reader = FrameReader(stream)
        replies = _ReplyWriter(stream, limits, peer, self.relayed)
        slots = trio.Semaphore(MAX_REQUESTS_PER_STREAM)
        async with trio.open_nursery() as nursery:
            try:
                while True:
                    await slots.acquire()
                    if idle_s is not None:
                        with trio.move_on_after(idle_s):
                            await reader.wait_for_data()
                        if not reader.has_data():
                            break  # idle (or closed): an outsider's stream is not kept
                    body = await reader.next_frame(
                        limits.max_request_bytes + _REQUEST.size,
                        limits.timeout_s,
                        lambda size: self.relayed.receiving(stream, peer, size),
                    )
                    if body is None:
                        break  # the peer closed its side between requests; answer what is open
                    if len(body) < _REQUEST.size:
                        raise FrameError("request frame shorter than its request id")
                    if self.scores.is_banned(peer, trio.current_time()):
                        self._refuse(peer, "banned while its stream was open")
                        replies.broken = True
                        break
                    (request_id,) = _REQUEST.unpack_from(body)
                    request = body[_REQUEST.size :]
                    answer = self._answer
                    nursery.start_soon(answer, replies, peer, request_id, request, handler, slots)
            except FrameError as exc:
                self._charge(peer, _offence_of(exc), exc)
                replies.broken = True
            except trio.TooSlowError:
                self._charge(peer, Offence.TIMEOUT, "a frame begun but not finished in time")
                replies.broken = True
            except BaseLibp2pError as exc:
                log.info("stream from %s broke: %s", peer, exc)
                replies.broken = True
            if replies.broken:
                nursery.cancel_scope.cancel()
        if replies.broken:
            await _reset_quietly(stream)
        else:
            await _close_quietly(stream)

    async def _answer(
        self,
        replies: _ReplyWriter,
        peer: str,
        request_id: int,
        request: bytes,
        handler: Handler,
        slots: trio.Semaphore,
    ) -> None:
        try:
            status, reply = _OK, b""
            try:
                answer_s = replies.limits.timeout_s
                if replies.limits.relayed_answer_s and replies.relayed.on_circuit(replies.stream):
                    answer_s += replies.limits.relayed_answer_s
                with trio.fail_after(answer_s):
                    reply = await handler(peer, request)
            except trio.TooSlowError:
                log.warning("a request from %s was not answered in time", peer)
                status, reply = _REFUSED, b"not answered in time"
            except Decline as exc:
                reason = f"{_DECLINED}{_NOT_HERE if isinstance(exc, NotHere) else ''}{exc}"
                status, reply = _REFUSED, reason.encode()[:_MAX_REASON_BYTES]
            except ProtocolError as exc:
                self._charge(peer, Offence.MALFORMED_MESSAGE, exc)
                status, reply = _REFUSED, str(exc).encode()[:_MAX_REASON_BYTES]
            except Exception:  # a handler bug must not take the stream down with it
                log.exception("handler failed on a request from %s", peer)
                self.scores.penalise(peer, Offence.HANDLER_FAILURE, trio.current_time())
                status, reply = _REFUSED, b"handler failed"
            if status == _OK and len(reply) > replies.limits.max_response_bytes:
                log.error("reply of %s bytes to %s is over the protocol's limit", len(reply), peer)
                status, reply = _REFUSED, b"reply too large"
            if not await replies.write(request_id, status, reply):
                self._charge(peer, Offence.TIMEOUT, "did not read its reply in time")
        finally:
            slots.release()

    def _charge(self, peer: str, offence: Offence, why: object) -> None:
        score = self.scores.penalise(peer, offence, trio.current_time())
        log.warning("peer %s: %s (%s); score now %.0f", peer, offence.name, why, score)

    # ---- sending ------------------------------------------------------------------------------

    async def request(
        self, peer: ID, protocol: str, payload: bytes, limits: RpcLimits, dial: bool = True
    ) -> bytes:
        """Send one request and return the reply, or raise ``PeerUnavailable``/``PeerTimeout``;
        ``dial=False``: over a connection there is, never a new one (``PeerUnavailable``)."""
        if len(payload) > limits.max_request_bytes:
            raise FrameError(
                f"request of {len(payload)} bytes exceeds the limit of {limits.max_request_bytes}"
            )
        stretch_s = 0.0
        try:
            with trio.move_on_after(limits.timeout_s) as scope:
                if self.shaper is not None:
                    await trio.sleep(self.shaper(str(peer), len(payload)))
                channel = await self._channel(peer, protocol, dial)
                # Over a relay the deadline stretches with the bytes both ways, at the floor a
                # relay guarantees; past its bound the request is not sent (``relay_budget``).
                # Decided on the stream's own connection: a peer may have a direct one too.
                size = len(payload) + limits.reply_bytes
                why = self.relayed.refusal(
                    channel.stream, str(peer), protocol, size, limits.timeout_s
                )
                if why is not None and not limits.send_past_budget:
                    raise TooLargeForRelay(why)
                stretch_s = self.relayed.stretch_s(channel.stream, size)
                scope.deadline += stretch_s
                return await channel.call(payload, limits, scope)
        except trio.TooSlowError as exc:  # a dial's own deadline
            raise PeerTimeout(f"peer {peer} did not open {protocol} in time: {exc}") from exc
        except (BaseLibp2pError, OSError, DialFailed) as exc:
            raise PeerUnavailable(f"peer {peer} is unreachable on {protocol}: {exc}") from exc
        relayed = f" (+{stretch_s:.0f} s for its size over a relay)" if stretch_s >= 1 else ""
        raise PeerTimeout(
            f"peer {peer} did not answer {protocol} within {limits.timeout_s:g} s{relayed}"
        )

    async def open(self, peer: ID, protocol: str, timeout_s: float) -> None:
        """Have the stream to ``peer`` for ``protocol`` open within ``timeout_s``, dialling the
        peer first if need be, so that a request's own deadline then covers the request alone
        (over a circuit, a dial and a stream's negotiation take several round trips through the
        relay). ``PeerUnavailable`` or ``PeerTimeout`` as ``request`` raises them."""
        try:
            with trio.fail_after(timeout_s):
                await self._channel(peer, protocol)
        except trio.TooSlowError as exc:
            raise PeerTimeout(
                f"peer {peer} did not open {protocol} within {timeout_s:g} s"
            ) from exc
        except (BaseLibp2pError, OSError, DialFailed) as exc:
            raise PeerUnavailable(f"peer {peer} is unreachable on {protocol}: {exc}") from exc

    async def drop_peer(self, peer: ID) -> None:
        """Close every stream and connection to ``peer``; the next request dials it anew.

        For a peer known to have restarted: what was open to it belongs to its old process,
        and py-libp2p may not have noticed that it is gone. Dials that failed meanwhile (to the
        old process's address) are forgotten too: py-libp2p refuses for a minute to dial a
        peer whose dial failed, and that would refuse the new process as well."""
        for key, channel in list(self._channels.items()):
            # Another drop of the same peer (the neighbour keeper's, a probe's) may have taken
            # this channel while the reset below waited.
            if key[0] == str(peer) and self._channels.get(key) is channel:
                channel.fail("the peer restarted")
                del self._channels[key]
                await _reset_quietly(channel.stream)
        await self.host.get_network().close_peer(peer)
        self.dialer.forgive(peer)

    async def retire(self, peer: ID) -> float:
        """Send no new request on the streams open to ``peer`` (a direct connection replaced
        the circuit they run on): the next request opens a new stream, which py-libp2p puts on
        the direct connection, and each old stream is closed once its requests are answered,
        so none of them fails for the switch. Returns how long a request on the old streams,
        either way, may still take (their deadlines, this node's handlers')."""
        longest = self._longest_served_s
        for key, lock in list(self._opening.items()):
            if key[0] != str(peer):
                continue
            # A stream being opened now may have been put on the circuit: wait for it.
            async with lock:
                channel = self._channels.pop(key, None)
                if channel is None:
                    continue
                channel.retiring = True
                if channel.waiters:
                    longest = max(longest, channel.timeout_s)
                else:  # a request adds its waiter before any checkpoint
                    await _close_quietly(channel.stream)
        return longest

    async def _channel(self, peer: ID, protocol: str, dial: bool = True) -> _Channel:
        """The open stream to ``peer`` for ``protocol``, opened now if there is none (on the
        connection there is, without ``dial``)."""
        key = (str(peer), protocol)
        lock = self._opening.setdefault(key, trio.Lock())
        async with lock:
            channel = self._channels.get(key)
            if channel is None or channel.broken:
                if not dial and not self.dialer.connected(peer):
                    raise DialFailed(f"not connected to {peer}, and not to be dialled")
                stream = await self._open_stream(peer, protocol)
                self.streams_opened += 1
                channel = _Channel(stream, key[0], protocol, self._charge, self.relayed)
                self._channels[key] = channel
                trio.lowlevel.spawn_system_task(channel.read_replies, name=f"replies {key}")
            return channel

    async def connect(self, peer: ID) -> None:
        """Be connected to ``peer``: through a relay first when its record asks for one,
        directly, or through a relay when the direct dial fails; ``DialFailed`` if nothing
        answered."""
        if self.circuits is not None:
            await self.circuits.before_stream(peer)
        try:
            await self.dialer.connect(peer)
        except DialFailed:
            if self.circuits is None or not await self.circuits.after_failure(peer):
                raise

    async def _open_stream(self, peer: ID, protocol: str) -> INetStream:
        if self.circuits is not None:
            await self.circuits.before_stream(peer)
        try:
            # py-libp2p would dial one address, with no connect deadline.
            await self.dialer.connect(peer)
            return await self.host.new_stream(peer, [TProtocol(protocol)])
        except (DialFailed, BaseLibp2pError, OSError):
            if self.circuits is None or not await self.circuits.after_failure(peer):
                raise
        return await self.host.new_stream(peer, [TProtocol(protocol)])


@dataclass
class _ReplyWriter:
    """The serving side's writes on one stream, one frame at a time."""

    stream: INetStream
    limits: RpcLimits
    peer: str
    relayed: RelayedLinks
    lock: trio.Lock = field(default_factory=trio.Lock)
    broken: bool = False

    async def write(self, request_id: int, status: int, reply: bytes) -> bool:
        """Write one reply; False if the peer did not take it in time (the stream is reset)."""
        frame = encode_frame(
            _REPLY.pack(request_id, status) + reply, _reply_bound(self.limits.max_response_bytes)
        )
        # A reply waits its turn on a relayed lane at most as long as its asker waits for it
        # (its deadline and the most a relay adds); past that nobody reads it, and the wait is
        # this node's queue, not the peer's fault: dropped uncharged.
        wait_s = self.limits.timeout_s + self.relayed.budget.max_transfer_s
        with trio.move_on_after(wait_s) as waiting:
            async with self.relayed.turn(self.stream, len(frame)):
                waiting.deadline = math.inf  # the write below has its own deadline
                return await self._write_turn(frame)
        log.info("a reply to %s waited %g s for its relayed lane: dropped", self.peer, wait_s)
        return True

    async def _write_turn(self, frame: bytes) -> bool:
        async with self.lock:
            if self.broken:
                return True  # the stream is gone for a reason already dealt with
            try:
                # Over a relay the peer's reading takes the relay's time for the reply.
                stretch_s = self.relayed.stretch_s(self.stream, len(frame))
                with trio.fail_after(self.limits.timeout_s + stretch_s):
                    await self.stream.write(frame)
                return True
            except trio.TooSlowError:
                self.broken = True
                await _reset_quietly(self.stream)
                return False
            except BaseLibp2pError as exc:
                log.info("reply could not be written: %s", exc)
                self.broken = True
                return True


@dataclass
class _Waiter:
    max_response_bytes: int
    done: trio.Event = field(default_factory=trio.Event)
    reply: bytes = b""
    error: PeerUnavailable | None = None

    def finish(self, reply: bytes = b"", error: PeerUnavailable | None = None) -> None:
        if not self.done.is_set():
            self.reply, self.error = reply, error
            self.done.set()


class _Channel:
    """The sending side of one stream: numbered requests out, replies to their waiters."""

    def __init__(
        self,
        stream: INetStream,
        peer: str,
        protocol: str,
        charge: Charge,
        relayed: RelayedLinks,
    ) -> None:
        self.stream, self.peer, self.protocol, self._charge = stream, peer, protocol, charge
        self.relayed = relayed
        self.reader = FrameReader(stream)
        self.write_lock = trio.Lock()
        self.waiters: dict[int, _Waiter] = {}
        self.next_id = 0
        self.broken = False
        #: Replaced (``RequestResponse.retire``): closed once its last reply is in.
        self.retiring = False
        # Bounds for replies: the largest any request on this stream allowed, and its deadline.
        self.max_response_bytes = 0
        self.timeout_s = 1.0

    async def call(self, payload: bytes, limits: RpcLimits, scope: trio.CancelScope) -> bytes:
        """Send one request and wait for its reply within ``scope``'s deadline, which a turn
        waited for on a relayed link's lane (``RelayedLinks.turn``) pushes back."""
        request_id = self.next_id
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF
        waiter = self.waiters[request_id] = _Waiter(limits.max_response_bytes)
        self.max_response_bytes = max(self.max_response_bytes, limits.max_response_bytes)
        self.timeout_s = max(self.timeout_s, limits.timeout_s)
        try:
            frame = encode_frame(_REQUEST.pack(request_id) + payload, len(payload) + _REQUEST.size)
            # The deadline stops while the request waits its turn on a relayed lane: each
            # frame ahead takes its own stretch, and a wait that ran the deadline out would
            # read as the peer missing it (a hop's peer would then count dead).
            deadline, scope.deadline = scope.deadline, math.inf
            async with self.relayed.turn(self.stream, len(frame)) as waited_s:
                scope.deadline = deadline + waited_s
                await self._write(frame)
            await waiter.done.wait()
        finally:
            self.waiters.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.reply

    async def _write(self, frame: bytes) -> None:
        async with self.write_lock:
            if self.broken:
                raise PeerUnavailable(f"stream to {self.peer} on {self.protocol} broke")
            try:
                await self.stream.write(frame)
            except BaseException as exc:
                # Cancelled or failed mid-write: the peer may hold half a frame, so nothing
                # after it could be framed. Break the stream; the next request opens another.
                self.fail(f"the stream broke while writing: {exc!r}")
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    await _reset_quietly(self.stream)
                if isinstance(exc, BaseLibp2pError):
                    raise PeerUnavailable(f"peer {self.peer} is unreachable: {exc}") from exc
                raise

    def fail(self, why: str) -> None:
        """Break the stream and fail every request waiting on it."""
        self.broken = True
        error = PeerUnavailable(f"peer {self.peer} on {self.protocol}: {why}")
        for waiter in self.waiters.values():
            waiter.finish(error=error)

    async def read_replies(self) -> None:
        """Hand each reply to its waiter until the stream ends (a system task: never raises)."""
        try:
            while not self.broken:
                # Bounds are read once a reply begins: requests sent meanwhile may raise them.
                body = None
                if await self.reader.wait_for_data():
                    bound = _reply_bound(self.max_response_bytes)
                    body = await self.reader.next_frame(
                        bound,
                        self.timeout_s,
                        lambda size: self.relayed.receiving(self.stream, self.peer, size),
                    )
                if body is None:
                    self.fail("the peer closed the stream")
                    break
                self._deliver(body)
                if self.retiring and not self.waiters:
                    await _close_quietly(self.stream)
                    break
        except FrameError as exc:
            self._charge(self.peer, _offence_of(exc), exc)
            self.fail(f"sent a bad reply: {exc}")
        except trio.TooSlowError:
            self.fail("a reply stalled mid-frame")
        except (BaseLibp2pError, OSError) as exc:
            self.fail(f"the stream broke: {exc}")
        except Exception as exc:  # supervision boundary: a system task must never raise
            log.exception("reader of the stream to %s failed", self.peer)
            self.fail(f"the reader failed: {exc!r}")
        if self.broken:
            await _reset_quietly(self.stream)

    def _deliver(self, body: bytes) -> None:
        if len(body) < _REPLY.size:
            raise FrameError("reply frame shorter than its header")
        request_id, status = _REPLY.unpack_from(body)
        reply = body[_REPLY.size :]
        if status not in (_OK, _REFUSED):
            raise FrameError(f"reply with unknown status {status}")
        waiter = self.waiters.get(request_id)
        if waiter is None:
            log.debug("late reply %s from %s on %s dropped", request_id, self.peer, self.protocol)
            return
        if status == _REFUSED:
            reason = reply[:_MAX_REASON_BYTES].decode(errors="replace")
            refusal: type[PeerUnavailable] = RequestRefused
            if reason.startswith(_DECLINED):
                misdirected = reason.startswith(_DECLINED + _NOT_HERE)
                refusal = RequestMisdirected if misdirected else RequestDeclined
            waiter.finish(error=refusal(f"peer {self.peer} refused the request: {reason}"))
        elif len(reply) > waiter.max_response_bytes:
            self._charge(self.peer, Offence.OVERSIZED_FRAME, f"reply of {len(reply)} bytes")
            waiter.finish(error=RequestRefused(f"peer {self.peer} sent an oversized reply"))
        else:
            waiter.finish(reply)


def _reply_bound(max_response_bytes: int) -> int:
    """The largest reply frame: an answer within the protocol's limit, or a refusal's reason.

    A protocol whose answers are tiny (a 16-byte verdict) must still carry a refusal's reason.
    """
    return max(max_response_bytes, _MAX_REASON_BYTES) + _REPLY.size


def _offence_of(exc: FrameError) -> Offence:
    return Offence.OVERSIZED_FRAME if "over the limit" in str(exc) else Offence.MALFORMED_MESSAGE


async def _reset_quietly(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception as exc:  # the stream may already be gone; a reset is best effort
        log.debug("reset of a broken stream failed: %s", exc)


async def _close_quietly(stream: INetStream) -> None:
    try:
        await stream.close()
    except Exception as exc:  # closing a reset stream fails; nothing is lost
        log.debug("close of a stream failed: %s", exc)
