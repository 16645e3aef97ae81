"""Yamux that holds every peer to the receive window it was granted, on every stream.

py-libp2p 0.8.1's yamux counts a stream's receive window but does not enforce it: a data frame
past the window is logged ("peer exceeded receive window") and buffered all the same. A peer
that ignores the window could then grow a node's memory without bound on any stream the node
reads slowly (a relay leg, an RPC stream, a hop stream while compute runs). The yamux spec makes
such a frame a protocol error, and go-yamux closes the session for it; so does this muxer: the
stream is reset, the connection closed with GO_AWAY(protocol error), the peer named in one log
line and handed to the host's hooks (``WindowedMuxers.hooks``: the RPC layer bans it).
Its streams also grow their windows by go-yamux's rule (``WindowedStream``).

It bounds what one connection may hold open as go-yamux does through libp2p's resource
manager: at most ``MAX_INBOUND_STREAMS`` live inbound streams, and a budget of receive windows
(``BUDGET``) that window growth and new inbound streams must fit in; an inbound stream past
either is reset at once (the peer charged once per burst of them), and a connection whose
unread bytes still exceed the budget has the stream that overran it reset and the peer charged.
A data frame longer than ``MAX_FRAME`` closes the connection before its body is read.
All of it belongs in py-libp2p itself; this subclass is the smallest way to have it meanwhile.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import trio
from libp2p.abc import IMuxedConn, ISecureConn
from libp2p.custom_types import TMuxerOptions, TProtocol
from libp2p.peer.id import ID
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream
from libp2p.stream_muxer.yamux.yamux import (
    DEFAULT_WINDOW_SIZE,
    GO_AWAY_PROTOCOL_ERROR,
    MAX_WINDOW_SIZE,
    PROTOCOL_ID,
    TYPE_GO_AWAY,
    YAMUX_HEADER_FORMAT,
    Yamux,
    YamuxStream,
)
from trio import MemorySendChannel

from gwtf.node.p2p.scoring import Offence

log = logging.getLogger(__name__)

#: Bytes a peer may send past the windows it was granted on one stream, in all, before it is
#: cut off. The library's own sender keeps to the window exactly; this only forgives a peer
#: whose counting differs from ours by less than a frame (64 KiB). It is cumulative: the
#: library clamps a stream's overdrawn window back to zero, which must not forgive it again.
SLACK = 64 * 1024
#: Live inbound streams (``WindowedYamux.live``: open to the peer's bytes, or holding some
#: unread) one connection may hold; a SYN past it is reset. A node opens one stream per peer
#: and protocol (``rpc.py``: about 16 protocols), plus relay legs (at most 8 hop streams per
#: peer, 16 circuits to one node), identify, ping, gossip and the DHT: a few tens to a
#: neighbour, so 128 leaves a wide margin.
MAX_INBOUND_STREAMS = 128
#: Receive windows one connection may have granted (the sum of its streams' target windows,
#: each at least the initial 256 KiB, inbound and outbound): a window grows only within
#: ``GROWTH_SHARE``, and an inbound stream whose initial window does not fit is reset. The
#: budget is the initial windows of ``MAX_INBOUND_STREAMS`` streams (32 MiB) plus the growth
#: share (16 MiB: one stream at py-libp2p's largest window, or several at less). Unread bytes
#: past it (and past the target windows) reset the stream they reach; the peer is charged only
#: where it sent past a window, since py-libp2p grants a stream up to a read's worth past its
#: target window (it credits a read twice), so an honest peer can get past the target sum.
BUDGET = 48 * 1024 * 1024
GROWTH_SHARE = 16 * 1024 * 1024
#: The longest data frame a peer may send. py-libp2p and go-yamux send at most 64 KiB
#: (``MAX_MESSAGE_SIZE``), rust-yamux 16 KiB; the library itself reads up to 16 MiB whole
#: before anything is checked.
MAX_FRAME = 1024 * 1024
#: Refused inbound streams are logged and charged once per this many seconds (one burst).
BURST_S = 10.0
#: How long cutting a violating peer off (RST, GO_AWAY, closing the socket) may take.
_CLOSE_S = 2.0

Violation = Callable[[ID, Offence], None]


class FrameTooLarge(trio.TooSlowError):
    """A data frame over ``MAX_FRAME``. A ``TooSlowError`` so that py-libp2p's frame loop
    tears the connection down (its path for a frame body that never came), from any of the
    three places it reads a frame body."""


class _OwnLineOnly(logging.Filter):
    """Drops py-libp2p's "timed out reading DATA frame body" line for a connection closed for
    a frame too large (``FrameTooLarge``): this module's own line says what happened."""

    def __init__(self) -> None:
        super().__init__()
        self.peers: set[str] = set()  # peers whose connection is closing for a frame too large

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if not (isinstance(message, str) and message.startswith("Yamux: timed out reading")):
            return True
        peer = next((p for p in self.peers if p in message), None)
        self.peers.discard(peer or "")
        return peer is None


_own_line_only = _OwnLineOnly()
logging.getLogger("libp2p.stream_muxer.yamux.yamux").addFilter(_own_line_only)


class WindowedYamux(Yamux):
    """``Yamux`` whose stream buffers refuse bytes sent past the stream's receive window."""

    def __init__(
        self,
        secured_conn: ISecureConn,
        peer_id: ID,
        is_initiator: bool | None = None,
        on_close: Any = None,
        on_violation: Violation | None = None,
    ) -> None:
        super().__init__(secured_conn, peer_id, is_initiator=is_initiator, on_close=on_close)
        self.on_violation = on_violation
        # stream id -> bytes sent past its window so far (dropped with the stream's buffer)
        self.overrun: dict[int, int] = {}
        self.violated = False
        self.refused = 0  # inbound streams refused since the last burst was reported
        self._burst_at: float | None = None  # when the last burst was reported
        # Every data frame the library takes lands in ``stream_buffers[id].extend`` right
        # before it charges the window (SYN, ACK and plain data frames alike): the one place
        # to check a frame without copying the library's frame loop.
        self.stream_buffers = _Buffers(self)
        # Every inbound stream the library accepts (after its ACK) is handed to this channel:
        # the one place to refuse it before any handler sees it.
        self.new_stream_send_channel = _Admission(self, self.new_stream_send_channel)  # type: ignore[assignment]

    def admit(self, stream_id: int, size: int) -> bool:
        """Whether a data frame of ``size`` bytes on ``stream_id`` keeps to its window and to
        the connection's budget.

        Called by the stream's buffer before the library charges the frame to the window."""
        stream = self.streams.get(stream_id)
        if stream is None:  # the library buffers data only for streams it knows
            return True
        if stream.recv_closed:
            # The stream's reading end is closed: this node reset it (a failed protocol
            # negotiation does) or the peer reset or ended it. Bytes that arrive now are no
            # one's to read (in flight before the peer knew, or sent past its own end), and
            # the library would keep them for a minute's grace. Dropped, not counted.
            stream.recv_window += size
            return False
        if not self.violated:
            past = size - stream.recv_window
            if past > 0:
                self.overrun[stream_id] = self.overrun.get(stream_id, 0) + past
            if self.overrun.get(stream_id, 0) > SLACK:
                self.violated = True
                self._spawn(self._cut_off, stream_id)
            elif self._over_budget(size):
                # Slack taken on many streams at once gets here, and so may an honest peer:
                # py-libp2p grants past a stream's target window (it credits a read twice),
                # so the peer is blamed only for bytes it sent past a window, never for
                # what it was over-granted. The stream is closed for reading at once, so the
                # rest of what the peer sends on it is dropped until the reset lands.
                stream.recv_closed = True
                self._spawn(self._reset_over_budget, stream, sum(self.overrun.values()) > SLACK)
            else:
                return True
        # Dropped: give the frame back to the window the library is about to charge it to,
        # so the library does not log its own warning for each frame until the close lands.
        stream.recv_window += size
        return False

    def granted(self) -> int:
        """The receive windows this connection's live streams were granted (target windows)."""
        return sum(s.target_recv_window for s in self.streams.values() if self.live(s))

    def unread(self) -> int:
        return sum(len(b) for b in self.stream_buffers.values())

    def may_grow(self, growth: int) -> bool:
        """Whether a stream's window may grow by ``growth`` within ``GROWTH_SHARE``."""
        grown = sum(
            s.target_recv_window - DEFAULT_WINDOW_SIZE
            for s in self.streams.values()
            if self.live(s)
        )
        return grown + growth <= GROWTH_SHARE

    def _over_budget(self, size: int) -> bool:
        # ``granted`` only when the cheap sum is over: an honest peer is within what it
        # was granted even where the node's own streams took windows past the budget.
        unread = self.unread() + size
        return unread > BUDGET + SLACK and unread > self.granted() + SLACK

    def live(self, stream: YamuxStream) -> bool:
        """Whether ``stream`` is open to the peer's bytes, holds some unread, or a handler of
        this node still runs on it (what the peer sent is then in the handler's hands)."""
        if self.stream_buffers.get(stream.stream_id) or getattr(stream, "handling", False):
            return True
        return not (stream.closed or stream.recv_closed)

    def refusal(self, stream: YamuxStream) -> tuple[str, bool] | None:
        """Why a new inbound ``stream`` is refused, and whether the peer is to blame for it
        (a full budget may be this node's own outbound streams); None to accept it."""
        if stream.closed:  # opened with RST: the library hands it on as dead already
            return None
        others = [s for s in self.streams.values() if s is not stream]
        live = sum(1 for s in others if not s.is_initiator and self.live(s))
        if live >= MAX_INBOUND_STREAMS:
            return f"{live} live inbound streams (at most {MAX_INBOUND_STREAMS})", True
        granted = sum(s.target_recv_window for s in others if self.live(s))
        if granted + DEFAULT_WINDOW_SIZE > BUDGET:
            return f"windows of {granted >> 20} MiB granted (budget {BUDGET >> 20} MiB)", False
        return None

    def refused_stream(self, why: str, blame: bool) -> None:
        """Report a refused inbound stream: one log line per burst, and the peer charged once
        for it where it is to blame."""
        self.refused += 1
        now = trio.current_time()
        if self._burst_at is not None and now - self._burst_at < BURST_S:
            return
        self._burst_at, earlier, self.refused = now, self.refused - 1, 0
        log.warning(
            "resetting new inbound streams of %s: %s (%d reset since the last such line)",
            self.peer_id,
            why,
            earlier,
        )
        if blame:
            self._charge(Offence.STREAM_FLOOD)

    async def _read_data_body(self, length: int) -> bytes:
        if length <= MAX_FRAME:
            return await super()._read_data_body(length)
        # Checked before the body is read: the library reads up to 16 MiB whole first.
        self.violated = True
        log.warning(
            "closed the connection to %s: it sent a data frame of %d bytes (at most %d; a "
            "yamux protocol error)",
            self.peer_id,
            length,
            MAX_FRAME,
        )
        self._charge(Offence.OVERSIZED_FRAME)
        _own_line_only.peers.add(str(self.peer_id))
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_S), suppress(Exception):
            await self._write_frame(
                struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_GO_AWAY, 0, 0, GO_AWAY_PROTOCOL_ERROR)
            )
        raise FrameTooLarge(f"data frame of {length} bytes")

    def _spawn(self, task: Callable[..., Awaitable[None]], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(task, *args)

    def _charge(self, offence: Offence) -> None:
        if self.on_violation is None:
            return
        try:
            self.on_violation(self.peer_id, offence)
        except Exception as exc:  # a scoring bug must not keep a guard from acting
            log.error("the muxer's violation hook failed: %s", exc)

    async def _reset_over_budget(self, stream: YamuxStream, blame: bool) -> None:
        log.warning(
            "reset stream %d of %s: its unread bytes passed the connection's budget of %d MiB%s",
            stream.stream_id,
            self.peer_id,
            BUDGET >> 20,
            " (it sent past its windows)" if blame else "",
        )
        if blame:
            self._charge(Offence.WINDOW_OVERRUN)
        with trio.move_on_after(_CLOSE_S), suppress(Exception):  # the stream is going anyway
            await stream.reset()

    async def _cut_off(self, stream_id: int) -> None:
        log.warning(
            "closed the connection to %s: it sent past the receive window of stream %d "
            "(a yamux protocol error)",
            self.peer_id,
            stream_id,
        )
        self._charge(Offence.WINDOW_OVERRUN)
        # Shielded: closing the socket ends the frame loop, which cancels this nursery.
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_S):
            stream = self.streams.get(stream_id)
            if stream is not None:
                with suppress(Exception):  # the connection is going anyway
                    await stream.reset()
            await self.close(GO_AWAY_PROTOCOL_ERROR)


class WindowedStream(YamuxStream):
    """A stream whose receive window grows only once half of it was read (go-yamux's rule).

    py-libp2p 0.8.1 doubles a stream's window at any read that sends a window update within
    4 round trips of the last, so the few small reads of negotiating a protocol already grow
    it to megabytes on a fast link. A relay that reads a leg slowly then holds megabytes ahead
    of the flow-control updates of the connection carried over it, and that connection's
    writers give up after 5 s without one. Here a window doubles only when half of it was
    read since it last could (and within 4 round trips, as before)."""

    _read_since_growth: int = 0

    async def reset(self) -> None:
        # The library keeps a reset stream's unread bytes for a minute's grace (for a reader
        # that would never come): a peer opening streams of junk that negotiation resets
        # could hold a node's memory that way. Nothing reads a stream this node reset.
        buffer = self.conn.stream_buffers.get(self.stream_id)
        if buffer is not None:
            buffer.clear()
        await super().reset()

    async def _auto_tune_and_send_window_update(self, *, bytes_read: int = 0) -> None:
        self._read_since_growth += bytes_read
        await super()._auto_tune_and_send_window_update(bytes_read=bytes_read)

    def _apply_autotune_epoch(self, buffered: int) -> int:
        if self._read_since_growth < self.target_recv_window // 2:
            return 0
        growth = min(self.target_recv_window * 2, MAX_WINDOW_SIZE) - self.target_recv_window
        conn = self.conn
        if isinstance(conn, WindowedYamux) and not conn.may_grow(growth):
            return 0  # the connection's budget is spent: the window stays as it is
        self._read_since_growth = 0
        return super()._apply_autotune_epoch(buffered)


class _Buffer(bytearray):
    """One stream's unread bytes, that takes a frame only if the muxer admits it."""

    def __init__(self, muxer: WindowedYamux, stream_id: int, data: bytes = b"") -> None:
        super().__init__(data)
        self._muxer = muxer
        self._stream_id = stream_id

    def extend(self, data: Any) -> None:
        if self._muxer.admit(self._stream_id, len(data)):
            super().extend(data)


class _Buffers(dict[int, bytearray]):
    """The muxer's ``stream_buffers``: each buffer the library creates becomes a ``_Buffer``."""

    def __init__(self, muxer: WindowedYamux) -> None:
        super().__init__()
        self._muxer = muxer

    def __setitem__(self, stream_id: int, buffer: bytearray) -> None:
        if not isinstance(buffer, _Buffer):
            buffer = _Buffer(self._muxer, stream_id, bytes(buffer))
        # The library creates a stream, then its buffer, before any of its bytes are read:
        # the one moment to give the stream its growth rule (it builds ``YamuxStream`` itself).
        stream = self._muxer.streams.get(stream_id)
        if type(stream) is YamuxStream:
            stream.__class__ = WindowedStream
        super().__setitem__(stream_id, buffer)

    # The library drops a stream's buffer when it drops the stream: its overrun goes with it.
    def __delitem__(self, stream_id: int) -> None:
        super().__delitem__(stream_id)
        self._muxer.overrun.pop(stream_id, None)

    def pop(self, stream_id: int, *default: Any) -> Any:
        self._muxer.overrun.pop(stream_id, None)
        return super().pop(stream_id, *default)


class _Admission:
    """The muxer's channel of accepted inbound streams, that resets those it refuses.

    py-libp2p has ACKed the stream when it hands it here, so a refused stream is ACKed and
    reset at once, before the frame loop reads another frame (go-yamux resets the SYN)."""

    def __init__(self, muxer: WindowedYamux, channel: MemorySendChannel[YamuxStream]) -> None:
        self._muxer = muxer
        self._channel = channel

    async def send(self, stream: YamuxStream) -> None:
        refused = self._muxer.refusal(stream)
        if refused is None:
            await self._channel.send(stream)
            return
        with suppress(Exception):  # the connection is closing: the stream is gone anyway
            await stream.reset()
        self._muxer.refused_stream(*refused)

    def close(self) -> None:
        self._channel.close()


class WindowedMuxers(MuxerMultistream):
    """Muxer negotiation that builds the muxer class registered for yamux.

    py-libp2p 0.8.1's ``MuxerMultistream.new_conn`` builds its own ``Yamux`` whenever yamux is
    negotiated, whatever class ``new_host``'s muxer options registered; this one honours the
    registered class and hands a ``WindowedYamux`` the host's violation hook."""

    def __init__(self, options: TMuxerOptions, negotiate_timeout: int) -> None:
        super().__init__(options, negotiate_timeout)
        self.hooks: list[Violation] = []

    async def new_conn(self, conn: ISecureConn, peer_id: ID) -> IMuxedConn:
        protocol, transport = await self._selector.select(
            conn, conn.is_initiator, self.negotiate_timeout
        )
        muxed: IMuxedConn
        if isinstance(transport, type) and issubclass(transport, WindowedYamux):
            muxed = transport(
                conn, peer_id, is_initiator=conn.is_initiator, on_violation=self._violated
            )
        else:
            muxed = transport(conn, peer_id)
        return self._annotate_connection(muxed, conn, protocol)

    def _violated(self, peer: ID, offence: Offence) -> None:
        for hook in self.hooks:
            hook(peer, offence)


#: ``new_host``'s muxer options: yamux only (mplex has no flow control at all to enforce).
MUXER_OPTIONS: TMuxerOptions = {TProtocol(PROTOCOL_ID): WindowedYamux}


def count_handlers(swarm: Any) -> None:
    """Mark each inbound stream while this node's handler runs on it (``WindowedYamux.live``):
    a peer that ends its side after a request still has the handler's work counted."""
    inner = swarm.common_stream_handler

    async def handle(net_stream: Any) -> None:
        muxed = getattr(net_stream, "muxed_stream", None)
        if muxed is not None:
            muxed.handling = True
        try:
            await inner(net_stream)
        finally:
            if muxed is not None:
                muxed.handling = False

    swarm.common_stream_handler = handle
