"""Keeping the connections to a node's neighbours up.

``NeighbourKeeper`` asks each connected neighbour ``/gwtf/alive/1.0.0`` every ``period_s`` on the
framed stream the node keeps to it, closes a connection that has not answered for
``dead_after_s`` (a cut link that TCP would take minutes to give up on), and dials a missing
neighbour again (``Dialer.connect``, which lifts py-libp2p's 60 s waits) with ``Backoff``: at
once, then up to ``max_s`` apart, and ``max_long_s`` apart once it has been gone for
``long_gone_s``, through a relay where the neighbour's record asks for one or the direct dial
fails (``RequestResponse.connect``). A node nobody can dial (behind a NAT) relies on this: its
neighbours cannot reach it, so it must reach them; they leave the dialing to it
(``waits_for``) instead of dialing an address that cannot answer, for ``wait_grace_s``: a
neighbour that has not dialled by then is dialled anyway (through its relay), since it may be
unable or unwilling to, or its card stale.

A connection that runs through a relay is cut only after ``relayed_dead_after_s`` of silence:
it rides on the connections to the relay, which the relay's own keep-alives and slot checks
watch, and a cut of one of those ends it at once. A silent circuit most often means a busy
relay (one Python process pumping every circuit of the run); cutting it made both ends dial
new circuits through that same relay at once, which loaded it more, until every circuit of
the run was being cut and dialled again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.dialing import DialFailed
from gwtf.node.p2p.relay import is_relayed
from gwtf.node.p2p.rpc import PeerTimeout, PeerUnavailable, RequestResponse, RpcLimits

log = logging.getLogger(__name__)

ALIVE_PROTOCOL = "/gwtf/alive/1.0.0"


@dataclass(frozen=True)
class Backoff:
    """When to dial a missing neighbour again, after ``failures`` failed dials."""

    first_s: float = 0.25
    max_s: float = 2.0
    max_long_s: float = 30.0
    long_gone_s: float = 60.0

    def delay(self, failures: int, gone_s: float) -> float:
        cap = self.max_long_s if gone_s >= self.long_gone_s else self.max_s
        return 0.0 if failures == 0 else min(cap, self.first_s * 2 ** (failures - 1))


@dataclass
class _Neighbour:
    failures: int = 0
    gone_since: float | None = None
    next_dial: float = 0.0
    last_alive: float = 0.0
    busy: bool = False
    #: Was connected once: a dial that succeeds after this is a reconnection.
    met: bool = False
    #: Since when this node has been waiting, unconnected, to be dialled by the neighbour.
    waiting_since: float | None = None


@dataclass
class NeighbourKeeper:
    """Keeps the connections to ``neighbours()`` up (see the module's docstring)."""

    rpc: RequestResponse
    neighbours: Callable[[], Iterable[str]]
    period_s: float = 1.0
    dead_after_s: float = 5.0
    #: The same for a connection that runs through a relay (see the module).
    relayed_dead_after_s: float = 30.0
    backoff: Backoff = field(default_factory=Backoff)
    #: Neighbours this node does not dial but waits to be dialled by (a reachable node, of a
    #: neighbour whose card says peers cannot dial it); their connections are still probed.
    waits_for: Callable[[str], bool] = lambda _peer: False
    #: How long it waits, unconnected, for such a neighbour before dialling it anyway (through
    #: a circuit if need be): the neighbour may never dial (it cannot reach the relay, does not
    #: trust it, or will not), or its card may be stale.
    wait_grace_s: float = 10.0
    #: Dials that brought back a neighbour this node had been connected to.
    reconnects: int = 0
    _state: dict[str, _Neighbour] = field(default_factory=dict)

    def serve(self) -> None:
        """Answer neighbours' keep-alives (every node does: any node may be someone's
        neighbour)."""

        async def alive(_peer: str, _request: bytes) -> bytes:
            return b""

        self.rpc.serve(ALIVE_PROTOCOL, alive, RpcLimits(0, 0, self.dead_after_s))

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                self.tick(nursery, trio.current_time())
                await trio.sleep(self.period_s)

    def tick(self, nursery: trio.Nursery, now: float) -> None:
        wanted = {peer for peer in self.neighbours() if peer != str(self.rpc.host.get_id())}
        for gone in set(self._state) - wanted:
            del self._state[gone]
        for peer in wanted:
            state = self._state.setdefault(peer, _Neighbour(last_alive=now))
            if state.busy:
                continue
            peer_id = ID.from_base58(peer)
            if self.rpc.dialer.connected(peer_id):
                state.met, state.waiting_since = True, None
                state.busy = True
                nursery.start_soon(self._probe, peer_id, state)
            elif now >= state.next_dial and not self._still_waiting(peer, state, now):
                state.busy = True
                nursery.start_soon(self._redial, peer_id, state)

    def _still_waiting(self, peer: str, state: _Neighbour, now: float) -> bool:
        """Whether to leave the dialing to ``peer`` a while longer (``waits_for``, within
        ``wait_grace_s`` of the first tick it was missing)."""
        if not self.waits_for(peer):
            state.waiting_since = None
            return False
        if state.waiting_since is None:
            state.waiting_since = now
        return now - state.waiting_since < self.wait_grace_s

    async def _probe(self, peer: ID, state: _Neighbour) -> None:
        try:
            limits = RpcLimits(0, 0, self.dead_after_s / 2)
            # A probe asks over the connection there is: one gone meanwhile is the tick's to
            # redial, or not (a neighbour this node waits for is left to dial in).
            await self.rpc.request(peer, ALIVE_PROTOCOL, b"", limits, dial=False)
            state.last_alive = trio.current_time()
        except PeerTimeout as exc:
            silent_s = trio.current_time() - state.last_alive
            relayed = is_relayed(self.rpc.host, peer)
            if silent_s >= (self.relayed_dead_after_s if relayed else self.dead_after_s):
                log.info("neighbour %s silent for %.1f s (%s): dialing again", peer, silent_s, exc)
                # The connection is dead however long TCP would hold it: close it, so the
                # next dial opens a fresh one (through the router's new mapping).
                await self.rpc.drop_peer(peer)
                state.gone_since = trio.current_time()
        except PeerUnavailable:
            # A refusal (an older peer without the protocol, one that declines) is an answer;
            # a broken connection is redialled at the next tick.
            if self.rpc.dialer.connected(peer):
                state.last_alive = trio.current_time()
        finally:
            state.busy = False

    async def _redial(self, peer: ID, state: _Neighbour) -> None:
        if state.gone_since is None:
            state.gone_since = trio.current_time()
        try:
            await self.rpc.connect(peer)
        except DialFailed as exc:
            state.failures += 1
            gone_s = trio.current_time() - state.gone_since
            delay = self.backoff.delay(state.failures, gone_s)
            state.next_dial = trio.current_time() + delay
            log.debug("neighbour %s unreachable (%s); next dial in %.2f s", peer, exc, delay)
        else:
            if state.met:
                log.info("neighbour %s reconnected", peer)
                self.reconnects += 1
            state.met = True
            state.failures, state.gone_since = 0, None
            state.last_alive = trio.current_time()
        finally:
            state.busy = False
