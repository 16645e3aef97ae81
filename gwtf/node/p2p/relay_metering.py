"""A relay's bandwidth, metered per peer: one peer's circuits get its rate and its ends' floors.

Each peer has a token bucket of ``burst`` bytes refilled at ``rate`` bytes a second, and every
byte the relay reads from that peer's end of any of its circuits (it opened them, or they were
opened to it) is paid from it before the relay forwards it. A peer over its budget is slowed,
not cut: its next read waits until the debt is paid, so the stream's flow control pushes back on
the sender. Bytes are charged to the peer that sent them and to no one else: a peer that
pushes hard spends its own budget only, never its counterpart's. What a peer sends is not all
its own choice, though: a counterpart that asks it for large replies makes it spend its budget,
and one peer's busy circuits share its one bucket.

So that sharing never breaks a circuit, each circuit end also has a floor: a bucket of its own
refilled at ``floor`` bytes a second, and a read goes as soon as either the peer's bucket or
the end's floor can pay for it. A circuit busy both ways carries its flow-control updates
behind its bytes, and py-libp2p's yamux resets a stream whose send window stays shut for 5 s:
one bucket split too thin (about 50-65 KB/s an end, what 16 busy circuits make of 1 MiB/s)
broke circuits. With the floor, a peer's circuits slow down as they multiply but each keeps
``floor``, whatever its counterparts do, and no circuit needs refusing to protect the others.

A peer's bytes forwarded by any time ``t`` after its first are at most
``burst + rate * t + ends * floor * t``, ``ends`` the most circuit ends it has at the relay at
once (bounded by the relay's circuit caps: ``relay_service.RelayLimits``). A new end's floor
starts empty and earns its bytes while the end lives, so opening and closing circuits fast
gains a peer nothing over keeping them open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

#: What a circuit end's floor holds at most: one read of a leg (``relay_service``'s chunk).
FLOOR_BURST = 64 * 1024

#: Idle peers whose counts are kept for the node status; beyond it the least recent idle ones
#: are forgotten (their buckets are full, so forgetting them grants nothing). Busy peers are
#: never forgotten: the relay's hop stream caps bound how many there are.
MAX_PEERS_KEPT = 1024


@dataclass
class TokenBucket:
    """``burst`` bytes at most, refilled at ``rate`` bytes a second on trio's clock."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst
        self.stamp = trio.current_time()

    def refill(self) -> float:
        now = trio.current_time()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return self.tokens

    def wait_for(self, count: int) -> float:
        """The seconds ``spend(count)`` would wait if called now."""
        return max(0.0, (count - self.refill()) / self.rate)

    async def spend(self, count: int) -> float:
        """Take ``count`` bytes, waiting until they are paid for; the seconds waited.

        Concurrent spenders each wait for their own debt, which includes every earlier one's:
        together they never pass ``burst + rate * t``.
        """
        self.tokens = self.refill() - count
        if self.tokens >= 0:
            return 0.0
        wait = -self.tokens / self.rate
        await trio.sleep(wait)
        return wait

    @property
    def full(self) -> bool:
        return self.refill() >= self.burst


@dataclass
class PeerMeter:
    """One peer's bucket and its counts (``sent``: bytes the relay took from it; ``received``:
    bytes the relay delivered to it; ``floored``: those of ``sent`` its ends' floors paid)."""

    bucket: TokenBucket
    sent: int = 0
    received: int = 0
    floored: int = 0
    throttled_s: float = 0.0
    #: Circuits this peer opened that are open now.
    circuits: int = 0
    #: Circuits opened to this peer that are open now (counted here, not in the library's
    #: reservation, whose count starts again at 0 when a lapsed slot is taken anew).
    circuits_to: int = 0
    #: Circuit ends of this peer's being copied now (it opened the circuit or it is the target).
    ends: int = 0
    last_active: float = 0.0

    def view(self) -> dict[str, float | int]:
        return {
            "sent": self.sent,
            "received": self.received,
            "floored": self.floored,
            "throttled_s": round(self.throttled_s, 3),
            "circuits": self.circuits,
            "circuits_to": self.circuits_to,
        }


@dataclass
class RelayMeter:
    """Every peer's bucket and counts at one relay, and the ``floor`` each circuit end keeps
    (bytes a second; 0 is none, which only the benchmark uses, to show what the floor does)."""

    rate: float
    burst: float
    floor: float = 0.0
    peers: dict[str, PeerMeter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError("a relay meter's rate and burst must be positive")
        if self.floor < 0:
            raise ValueError("a relay meter's floor must not be negative")

    def of(self, peer: str) -> PeerMeter:
        meter = self.peers.get(peer)
        if meter is None:
            self._forget_idle()
            meter = self.peers[peer] = PeerMeter(TokenBucket(self.rate, self.burst))
        meter.last_active = trio.current_time()
        return meter

    def end_floor(self) -> TokenBucket | None:
        """A new circuit end's own floor, empty (None when the meter keeps none): an end
        handed a full floor would let a peer that churns circuits take FLOOR_BURST free each."""
        if not self.floor:
            return None
        floor = TokenBucket(self.floor, FLOOR_BURST)
        floor.tokens = 0.0
        return floor

    async def charge(
        self, sender: str, receiver: str, count: int, floor: TokenBucket | None = None
    ) -> None:
        """Pay for ``count`` bytes read from ``sender``'s end, before they go to ``receiver``:
        from the sender's bucket, or from that end's ``floor`` when it pays sooner. The counts
        move once paid (``delivered`` counts the receiver's once written)."""
        meter = self.of(sender)
        bucket = meter.bucket
        # Chosen and spent with nothing awaited between: the choice is still right when paid.
        if floor is not None and floor.wait_for(count) < bucket.wait_for(count):
            bucket = floor
        meter.throttled_s += await bucket.spend(count)
        meter.sent += count
        meter.floored += count if bucket is floor else 0

    def delivered(self, receiver: str, count: int) -> None:
        """Count ``count`` bytes written to ``receiver``'s end."""
        self.of(receiver).received += count

    def view(self) -> dict[str, dict[str, float | int]]:
        """Per peer: bytes relayed from and to it (and on floors), seconds its reads waited,
        circuits it opened that are open."""
        return {peer: meter.view() for peer, meter in self.peers.items()}

    def _forget_idle(self) -> None:
        if len(self.peers) < MAX_PEERS_KEPT:
            return
        idle = [(m.last_active, p) for p, m in self.peers.items() if _idle(m)]
        for _, peer in sorted(idle)[: max(1, len(self.peers) - MAX_PEERS_KEPT + 1)]:
            del self.peers[peer]


def _idle(meter: PeerMeter) -> bool:
    # A peer with a full bucket and nothing open starts afresh exactly as it stands.
    return not (meter.circuits or meter.circuits_to or meter.ends) and meter.bucket.full
