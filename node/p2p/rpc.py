"""Request/response over libp2p streams: one framed request, one framed reply, with deadlines.

Everything that must arrive (flow-protocol messages, activations, acknowledgements, weights) goes
through here; pubsub is only for hints. A stream handler never lets an exception escape: in
py-libp2p an escaped exception is swallowed and wedges the whole connection to that peer, so every
failure resets the stream and is charged to the peer's score, and a banned or unadmitted peer is
refused before anything is read.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from node.p2p.framing import FrameError, read_frame, write_frame
from node.p2p.scoring import Offence, PeerScores

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], Awaitable[bytes]]
Admission = Callable[[str], Awaitable[bool]]
#: Seconds a request of ``n`` bytes to ``peer`` waits before it is written (link emulation).
Shaper = Callable[[str, int], float]


class PeerUnavailable(ProtocolError):
    """A request to a peer failed: it is unreachable, reset the stream or sent a bad reply."""


class PeerTimeout(PeerUnavailable):
    """A peer did not answer within the deadline."""


@dataclass(frozen=True)
class RpcLimits:
    """Bounds of one request/response exchange."""

    max_request_bytes: int = 1 << 20
    max_response_bytes: int = 1 << 20
    timeout_s: float = 20.0


async def _admit_everyone(_peer: str) -> bool:
    return True


@dataclass
class RequestResponse:
    """Serves and sends framed request/response exchanges on a libp2p host."""

    host: IHost
    scores: PeerScores = field(default_factory=PeerScores)
    admit: Admission = _admit_everyone
    shaper: Shaper | None = None
    refused: dict[str, int] = field(default_factory=dict)

    def serve(self, protocol: str, handler: Handler, limits: RpcLimits) -> None:
        """Answer requests on ``protocol`` with ``handler(peer_id, request) -> reply``."""

        async def on_stream(stream: INetStream) -> None:
            peer = str(stream.muxed_conn.peer_id)
            try:
                await self._answer(stream, peer, handler, limits)
            except Exception:  # supervision boundary: nothing may escape a libp2p handler
                log.exception("handler for %s failed on a request from %s", protocol, peer)
                self.scores.penalise(peer, Offence.HANDLER_FAILURE, trio.current_time())
                await _reset_quietly(stream)

        self.host.set_stream_handler(TProtocol(protocol), on_stream)

    async def _answer(
        self, stream: INetStream, peer: str, handler: Handler, limits: RpcLimits
    ) -> None:
        now = trio.current_time()
        if self.scores.is_banned(peer, now) or not await self.admit(peer):
            self.refused[peer] = self.refused.get(peer, 0) + 1
            log.warning("refused a stream from %s: banned or not admitted to the run", peer)
            await _reset_quietly(stream)
            return
        try:
            with trio.fail_after(limits.timeout_s):
                request = await read_frame(stream, limits.max_request_bytes)
                reply = await handler(peer, request)
                await write_frame(stream, reply, limits.max_response_bytes)
                await stream.close()
        except FrameError as exc:
            offence = (
                Offence.OVERSIZED_FRAME
                if "over the limit" in str(exc)
                else Offence.MALFORMED_MESSAGE
            )
            self._charge(peer, offence, exc)
            await _reset_quietly(stream)
        except ProtocolError as exc:
            self._charge(peer, Offence.MALFORMED_MESSAGE, exc)
            await _reset_quietly(stream)
        except trio.TooSlowError:
            self._charge(peer, Offence.TIMEOUT, "no complete request before the deadline")
            await _reset_quietly(stream)
        except BaseLibp2pError as exc:
            log.info("stream from %s broke: %s", peer, exc)
            await _reset_quietly(stream)

    def _charge(self, peer: str, offence: Offence, why: object) -> None:
        score = self.scores.penalise(peer, offence, trio.current_time())
        log.warning("peer %s: %s (%s); score now %.0f", peer, offence.name, why, score)

    async def request(self, peer: ID, protocol: str, payload: bytes, limits: RpcLimits) -> bytes:
        """Send one request and return the reply, or raise ``PeerUnavailable``/``PeerTimeout``."""
        try:
            with trio.fail_after(limits.timeout_s):
                if self.shaper is not None:
                    await trio.sleep(self.shaper(str(peer), len(payload)))
                stream = await self.host.new_stream(peer, [TProtocol(protocol)])
                try:
                    await write_frame(stream, payload, limits.max_request_bytes)
                    return await read_frame(stream, limits.max_response_bytes)
                finally:
                    await _close_quietly(stream)
        except trio.TooSlowError as exc:
            raise PeerTimeout(
                f"peer {peer} did not answer {protocol} within {limits.timeout_s:g} s"
            ) from exc
        except FrameError as exc:
            self._charge(str(peer), Offence.MALFORMED_MESSAGE, exc)
            raise PeerUnavailable(f"peer {peer} sent a bad reply on {protocol}: {exc}") from exc
        except (BaseLibp2pError, OSError) as exc:
            raise PeerUnavailable(f"peer {peer} is unreachable on {protocol}: {exc}") from exc


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
