"""How long a message may take over a metered relay, and which messages no relay carries in time.

A relay guarantees each circuit end its floor (``CIRCUIT_FLOOR_BYTES_PER_S``, whatever the
peer's bucket holds: ``relay_metering``), and nothing more: a peer's bucket may be drained by
its other circuits, or by counterparts asking it for state. So on a relayed connection a
message of ``n`` bytes gets its protocol's deadline plus ``n / floor`` (the time it takes at
the floor), on both sides: the sender's wait for the answer and the receiver's wait for the
frame's last byte (which would otherwise charge an honest sender for a slow relay). Whether a
message goes over a relay is decided per stream, from the connection it runs on (a peer may
have a direct connection beside a circuit). Large frames on one relayed connection take turns
(``RelayedLinks.turn``), so each has the circuit end's floor to itself and its stretch holds;
small ones (acks, control) go at once.

Past ``max_transfer_s`` at the floor a message is not sent at all: ``explain`` says why in
one line (its size, the floor, the bound, and what to do), so that a hop or a replica's share
that no relay carries in time fails at once and loudly, never at its deadline and silently.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost, INetStream
from libp2p.connection_types import ConnectionType
from libp2p.peer.id import ID

from gwtf.node.p2p.relay import is_circuit, is_relayed

log = logging.getLogger(__name__)

#: What a relay forwards from each circuit end whatever its peer's bucket holds (bytes/s).
CIRCUIT_FLOOR_BYTES_PER_S = 128 << 10
#: The most a message may add to its deadline over a relay: 15 MiB at the floor. A hop slower
#: than this stalls its pipeline for minutes; a replica's share, the round for every replica.
MAX_RELAYED_TRANSFER_S = 120.0
#: Frames up to this size to a relayed peer go at once; larger ones take turns.
LANE_BYTES = 64 * 1024


@dataclass(frozen=True)
class RelayBudget:
    """The floor a relayed message is sized against, and the most it may add to a deadline."""

    floor_bytes_per_s: float = CIRCUIT_FLOOR_BYTES_PER_S
    max_transfer_s: float = MAX_RELAYED_TRANSFER_S

    def __post_init__(self) -> None:
        if self.floor_bytes_per_s <= 0 or self.max_transfer_s <= 0:
            raise ValueError("a relay budget's floor and bound must be positive")

    @property
    def max_bytes(self) -> int:
        """The largest message (request and reply together) sent over a relay."""
        return int(self.floor_bytes_per_s * self.max_transfer_s)

    def fits(self, size: int) -> bool:
        return size <= self.max_bytes

    def stretch_s(self, size: int) -> float:
        """Seconds a message of ``size`` bytes adds to its deadline over a relay (bounded)."""
        return min(self.max_transfer_s, max(0, size) / self.floor_bytes_per_s)

    def explain(self, what: str, size: int, peer: str, deadline_s: float) -> str:
        """One line: why a message of ``size`` bytes is not sent to ``peer`` over a relay."""
        floor_kib = self.floor_bytes_per_s / 1024
        takes_s = size / self.floor_bytes_per_s
        return (
            f"{what} of {_mib(size)} to {peer} cannot cross a relay in time: at the "
            f"{floor_kib:g} KiB/s a relay guarantees a circuit it takes {takes_s:.0f} s, and a "
            f"relayed message may add at most {self.max_transfer_s:g} s to its {deadline_s:g} s "
            f"deadline ({_mib(self.max_bytes)}); run this node or its peer with a public "
            "address (a forwarded port, --announce) or send less at once (smaller "
            "microbatches, a smaller stage)"
        )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


#: (peer, protocol) pairs told of once (oldest forgotten), so a refusal is logged once each.
_MAX_TOLD = 1024


#: Large frames (over ``LANE_BYTES``) one peer may have this node receive at once with their
#: deadline stretched for a relay: an honest sender writes one at a time per circuit, so this
#: leaves room for a few circuits; past it a frame keeps its protocol's own deadline, so a
#: slow sender cannot hold many streams for minutes each.
MAX_STRETCHED_RECEIVES = 4


def on_circuit(stream: INetStream) -> bool:
    """Whether ``stream`` runs over a relayed connection, as this node set it up: a peer may
    also have a direct connection (after a hole punch), so this is decided per stream, from
    the stream's own connection, never from anything the peer says."""
    muxed = stream.muxed_conn
    if muxed.get_connection_type() == ConnectionType.RELAYED:
        return True
    return any(is_circuit(a) for a in muxed.get_transport_addresses())


@dataclass
class RelayedLinks:
    """A host's relayed connections as its request/response layer sees them: how much a
    message's deadline stretches (``stretch_s``), whether it is sent at all (``refusal``), and
    the lanes large frames take turns on. Each is decided per stream (``on_circuit``).

    Per relayed connection, large frames are written one at a time, in the order they came: a
    circuit end's floor is shared by every stream on it, so concurrent large frames would each
    get a fraction of it and miss a deadline stretched for the whole floor."""

    host: IHost
    budget: RelayBudget = field(default_factory=RelayBudget)
    _lanes: dict[object, trio.Lock] = field(default_factory=dict)
    _told: dict[tuple[str, str], None] = field(default_factory=dict)
    _receiving: dict[str, int] = field(default_factory=dict)

    def on_circuit(self, stream: INetStream) -> bool:
        return on_circuit(stream)

    def reached_by_relay_only(self, peer: str) -> bool:
        """Whether every connection to ``peer`` is relayed: for a wait that has no stream yet
        (a gatherer's for its followers' shares)."""
        return is_relayed(self.host, ID.from_base58(peer))

    def stretch_s(self, stream: INetStream, size: int) -> float:
        """Seconds ``size`` bytes on ``stream`` add to a deadline (0 on a direct connection)."""
        return self.budget.stretch_s(size) if size and self.on_circuit(stream) else 0.0

    def refusal(
        self, stream: INetStream, peer: str, protocol: str, size: int, deadline_s: float
    ) -> str | None:
        """Why a request of ``size`` bytes (with its reply) is not to be sent on ``stream``,
        which runs through a relay, or None; logged once per peer and protocol."""
        if self.budget.fits(size) or not self.on_circuit(stream):
            return None
        why = self.budget.explain(f"a {protocol} message", size, peer, deadline_s)
        if (peer, protocol) not in self._told:
            log.error("%s", why)
            self._told[(peer, protocol)] = None
            while len(self._told) > _MAX_TOLD:
                del self._told[next(iter(self._told))]
        return why

    @contextmanager
    def receiving(self, stream: INetStream, peer: str, size: int) -> Iterator[float]:
        """The seconds a frame of ``size`` bytes from ``peer`` on ``stream`` adds to its wait
        while it is received: its relay time if it is large and relayed, and ``peer`` has
        fewer than ``MAX_STRETCHED_RECEIVES`` such frames under way; else 0."""
        held = self._receiving.get(peer, 0)
        if size <= LANE_BYTES or held >= MAX_STRETCHED_RECEIVES or not self.on_circuit(stream):
            yield 0.0
            return
        self._receiving[peer] = held + 1
        try:
            yield self.budget.stretch_s(size)
        finally:
            self._receiving[peer] -= 1
            if not self._receiving[peer]:
                del self._receiving[peer]

    @asynccontextmanager
    async def turn(self, stream: INetStream, size: int) -> AsyncIterator[float]:
        """Hold the lane of ``stream``'s connection for a frame of ``size`` bytes if it is
        large and relayed; yields the seconds waited for it."""
        if size <= LANE_BYTES or not self.on_circuit(stream):
            yield 0.0
            return
        key = stream.muxed_conn
        lock = self._lanes.setdefault(key, trio.Lock())
        started = trio.current_time()
        try:
            async with lock:
                yield trio.current_time() - started
        finally:
            idle = not lock.locked() and not lock.statistics().tasks_waiting
            if idle and self._lanes.get(key) is lock:
                del self._lanes[key]  # only connections with large frames in flight are kept

    @property
    def lanes(self) -> int:
        return len(self._lanes)
