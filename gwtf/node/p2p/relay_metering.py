"""A relay's bandwidth, metered per peer: one peer's circuits cannot take the relay's uplink.

Each peer has a token bucket of ``burst`` bytes refilled at ``rate`` bytes a second, and every
byte the relay reads from that peer's end of any of its circuits (it opened them, or they were
opened to it) is paid from it before the relay forwards it. A peer over its budget is slowed,
not cut: its next read waits until the debt is paid, so the stream's flow control pushes back on
the sender. Bytes are charged to the peer that sent them and to no one else: a peer that
pushes hard spends its own budget only, never its counterpart's. What a peer sends is not all
its own choice, though: a counterpart that asks it for large replies makes it spend its budget
(and slows its other circuits through this relay), and one peer's busy circuits share its one
bucket, each getting about ``rate / busy circuits``.

A peer's bytes forwarded by any time ``t`` after its first are at most ``burst + rate * t``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

#: The least rate each of a peer's circuits gets while the peer sends over its rate: a new
#: circuit that would split it below this is refused. Slower, a circuit busy both ways fails
#: instead of being slowed (on loopback: 333 KB/s lost streams within 12-30 s, 700 KB/s held),
#: since its flow-control updates queue behind the bytes the relay holds back.
MIN_CIRCUIT_SHARE = 700_000

#: Idle peers whose counts are kept for the node status; beyond it the least recent idle ones
#: are forgotten (their buckets are full, so forgetting them grants nothing).
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
    bytes the relay delivered to it)."""

    bucket: TokenBucket
    sent: int = 0
    received: int = 0
    throttled_s: float = 0.0
    #: Circuits this peer opened that are open now.
    circuits: int = 0
    #: Circuit ends of this peer's being copied now (it opened the circuit or it is the target).
    ends: int = 0
    #: Circuits ended because this peer sent past its receive window.
    window_overruns: int = 0
    last_active: float = 0.0

    def view(self) -> dict[str, float | int]:
        return {
            "sent": self.sent,
            "received": self.received,
            "throttled_s": round(self.throttled_s, 3),
            "circuits": self.circuits,
        }


@dataclass
class RelayMeter:
    """Every peer's bucket and counts at one relay."""

    rate: float
    burst: float
    peers: dict[str, PeerMeter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError("a relay meter's rate and burst must be positive")

    def of(self, peer: str) -> PeerMeter:
        meter = self.peers.get(peer)
        if meter is None:
            self._forget_idle()
            meter = self.peers[peer] = PeerMeter(TokenBucket(self.rate, self.burst))
        meter.last_active = trio.current_time()
        return meter

    async def charge(self, sender: str, receiver: str, count: int) -> None:
        """Pay for ``count`` bytes read from ``sender``'s end, before they go to ``receiver``."""
        meter = self.of(sender)
        meter.sent += count
        meter.throttled_s += await meter.bucket.spend(count)
        self.of(receiver).received += count

    def room_for_circuit(self, peer: str) -> bool:
        """Whether ``peer`` may take part in one more circuit: yes while it sends within its
        rate (its bucket full), else only if each of its circuits keeps ``MIN_CIRCUIT_SHARE``."""
        meter = self.peers.get(peer)
        if meter is None or meter.bucket.full:
            return True
        return self.rate / (meter.ends + 1) >= MIN_CIRCUIT_SHARE

    def view(self) -> dict[str, dict[str, float | int]]:
        """Per peer: bytes relayed from and to it, seconds its reads waited, circuits open."""
        return {peer: meter.view() for peer, meter in self.peers.items()}

    def _forget_idle(self) -> None:
        if len(self.peers) < MAX_PEERS_KEPT:
            return
        idle = [(m.last_active, p) for p, m in self.peers.items() if _idle(m)]
        for _, peer in sorted(idle)[: max(1, len(self.peers) - MAX_PEERS_KEPT + 1)]:
            del self.peers[peer]


def _idle(meter: PeerMeter) -> bool:
    # A peer with a full bucket and nothing open starts afresh exactly as it stands.
    return not meter.circuits and not meter.ends and meter.bucket.full
