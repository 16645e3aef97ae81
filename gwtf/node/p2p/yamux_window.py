"""Yamux that holds every peer to the receive window it was granted, on every stream.

py-libp2p 0.8.1's yamux counts a stream's receive window but does not enforce it: a data frame
past the window is logged ("peer exceeded receive window") and buffered all the same. A peer
that ignores the window could then grow a node's memory without bound on any stream the node
reads slowly (a relay leg, an RPC stream, a hop stream while compute runs). The yamux spec makes
such a frame a protocol error, and go-yamux closes the session for it; so does this muxer: the
stream is reset, the connection closed with GO_AWAY(protocol error), the peer named in one log
line and handed to the host's hooks (``WindowedMuxers.hooks``: the RPC layer bans it).
Its streams also grow their windows by go-yamux's rule (``WindowedStream``). Both belong in
py-libp2p itself; this subclass is the smallest way to have them meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import trio
from libp2p.abc import IMuxedConn, ISecureConn
from libp2p.custom_types import TMuxerOptions, TProtocol
from libp2p.peer.id import ID
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream
from libp2p.stream_muxer.yamux.yamux import (
    GO_AWAY_PROTOCOL_ERROR,
    PROTOCOL_ID,
    Yamux,
    YamuxStream,
)

log = logging.getLogger(__name__)

#: Bytes a peer may send past the windows it was granted on one stream, in all, before it is
#: cut off. The library's own sender keeps to the window exactly; this only forgives a peer
#: whose counting differs from ours by less than a frame (64 KiB). It is cumulative: the
#: library clamps a stream's overdrawn window back to zero, which must not forgive it again.
SLACK = 64 * 1024
#: How long cutting a violating peer off (RST, GO_AWAY, closing the socket) may take.
_CLOSE_S = 2.0

Violation = Callable[[ID], None]


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
        self.overrun: dict[int, int] = {}  # stream id -> bytes sent past its window so far
        self.violated = False
        # Every data frame the library takes lands in ``stream_buffers[id].extend`` right
        # before it charges the window (SYN, ACK and plain data frames alike): the one place
        # to check a frame without copying the library's frame loop.
        self.stream_buffers = _Buffers(self)

    def admit(self, stream_id: int, size: int) -> bool:
        """Whether a data frame of ``size`` bytes on ``stream_id`` keeps to its window.

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
            if past <= 0:
                return True
            self.overrun[stream_id] = self.overrun.get(stream_id, 0) + past
            if self.overrun[stream_id] <= SLACK:
                return True
            self.violated = True
            if self._nursery is not None:
                self._nursery.start_soon(self._cut_off, stream_id)
        # Dropped: give the frame back to the window the library is about to charge it to,
        # so the library does not log its own warning for each frame until the close lands.
        stream.recv_window += size
        return False

    async def _cut_off(self, stream_id: int) -> None:
        log.warning(
            "closed the connection to %s: it sent past the receive window of stream %d "
            "(a yamux protocol error)",
            self.peer_id,
            stream_id,
        )
        if self.on_violation is not None:
            try:
                self.on_violation(self.peer_id)
            except Exception as exc:  # a scoring bug must not keep the connection open
                log.error("the window violation hook failed: %s", exc)
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

    def _violated(self, peer: ID) -> None:
        for hook in self.hooks:
            hook(peer)


#: ``new_host``'s muxer options: yamux only (mplex has no flow control at all to enforce).
MUXER_OPTIONS: TMuxerOptions = {TProtocol(PROTOCOL_ID): WindowedYamux}
