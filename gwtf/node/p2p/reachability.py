"""Whether peers can dial this node: a dial-back check, asked of peers it is connected to.

py-libp2p's AutoNAT v1 answers over the connection the request came on, so it calls every node
public. Here a node asks up to ``WITNESSES`` (3) peers it is connected to, on
``/gwtf/dialback/1.0.0``, to dial it back at the addresses it advertises. Each witness dials
from a fresh host that listens nowhere and has a new identity (so no connection it already has
can carry the answer), tries the addresses one at a time, each within ``PER_ADDRESS_S``, and
on reaching the node sends it the request's 16-byte nonce on ``/gwtf/dialback-nonce/1.0.0``.
A witness's vote counts as *reached* only if that nonce arrived: a peer cannot make a node
believe it is reachable without actually reaching it, only withhold a dial (a *not reached*
vote), and a witness that refuses or does not answer abstains.

The verdict (``verdict``, pure) is the majority of the votes cast: reachable when more
witnesses reached the node than did not, a tie or worse is not reachable (the safe side: such
a node keeps its connections up itself), and with no vote at all it is unknown. With fewer
than ``WITNESSES`` connected peers (a tiny swarm) the check asks those it has and says so; as a
*reached* vote cannot be forged, a small check can only err towards not reachable.

The witness side must not become a reflector: it serves the run's admitted peers only, dials
only addresses that name the requester's peer id and that the requester claimed for itself (in
its own record, ``claimed``) or that share the IP its connection comes from, one address at a
time, at most ``at_once`` checks together, within ``DialbackRate`` (a few per minute for all
requesters together, one per requester per ``per_peer_s``). The nodes of a swarm that starts
together all ask the same few peers (the data node first) at once: a witness that took one
check at a time declined all but one of them, and they all came out "unknown".
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.addresses import MAX_ADDRESSES, check_peer_addresses
from gwtf.node.p2p.dialing import Dialer, DialFailed
from gwtf.node.p2p.host import build_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse, RpcLimits

log = logging.getLogger(__name__)

PROTOCOL_ID = "/gwtf/dialback/1.0.0"
NONCE_PROTOCOL = "/gwtf/dialback-nonce/1.0.0"
WITNESSES = 3
NONCE_BYTES = 16
PER_ADDRESS_S = 3.0
#: A witness answers within this: every address's dial, then the nonce.
DEADLINE_S = PER_ADDRESS_S * MAX_ADDRESSES + 3.0
LIMITS = RpcLimits(max_request_bytes=1024, max_response_bytes=64, timeout_s=DEADLINE_S)
#: How long the nonce may trail the witness's answer.
NONCE_GRACE_S = 1.0


class Outcome(Enum):
    REACHED = "reached"
    NOT_REACHED = "not reached"
    ABSTAINED = "abstained"


@dataclass(frozen=True)
class Vote:
    peer: str
    outcome: Outcome
    #: The address the witness reached the node at.
    address: str | None = None


@dataclass(frozen=True)
class Reachability:
    """A check's result: ``reachable`` is None when no witness voted."""

    reachable: bool | None
    reached: int
    not_reached: int
    asked: int
    checked_ms: int
    #: The address most witnesses reached (None unless reachable).
    address: str | None = None

    @property
    def weak(self) -> bool:
        """Fewer witnesses voted than a check wants (a tiny swarm)."""
        return self.reached + self.not_reached < WITNESSES

    def describe(self) -> str:
        votes = f"{self.reached} of {self.reached + self.not_reached} peers dialled it back"
        weak = f"; only {self.reached + self.not_reached} could check" if self.weak else ""
        if self.reachable:
            return f"reachable at {self.address} ({votes}{weak})"
        if self.reachable is None:
            return (
                f"reachability unknown (none of {self.asked} peers asked could check): "
                "running outbound-only"
            )
        return f"behind NAT: running outbound-only ({votes}{weak})"


def verdict(votes: Sequence[Vote], checked_ms: int) -> Reachability:
    """The majority of the votes cast (abstentions do not count); a tie is not reachable."""
    reached = [v for v in votes if v.outcome is Outcome.REACHED]
    not_reached = sum(1 for v in votes if v.outcome is Outcome.NOT_REACHED)
    if not reached and not not_reached:
        return Reachability(None, 0, 0, len(votes), checked_ms)
    if len(reached) <= not_reached:
        return Reachability(False, len(reached), not_reached, len(votes), checked_ms)
    addresses = [v.address for v in reached if v.address is not None]
    best = max(addresses, key=addresses.count) if addresses else None
    return Reachability(True, len(reached), not_reached, len(votes), checked_ms, best)


def encode_request(nonce: bytes, addresses: Sequence[str]) -> bytes:
    return json.dumps({"nonce": nonce.hex(), "addrs": list(addresses)}).encode()


def decode_request(request: bytes, requester: str) -> tuple[bytes, list[str]]:
    """The nonce and addresses of a dial-back request, checked: every address must be a
    bounded TCP address naming ``requester``."""
    try:
        fields = json.loads(request)
        nonce = bytes.fromhex(fields["nonce"])
        addresses = fields["addrs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"bad dial-back request: {exc}") from exc
    if len(nonce) != NONCE_BYTES:
        raise ProtocolError(f"dial-back nonce of {len(nonce)} bytes, expected {NONCE_BYTES}")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise ProtocolError("dial-back addresses must be a list of strings")
    check_peer_addresses(addresses, requester)
    return nonce, addresses


@dataclass
class DialbackRate:
    """How often this node dials others back: ``per_minute`` for all requesters together (a
    fresh peer id costs nothing), one per requester every ``per_peer_s``, at most ``at_once``
    together (each is a fresh host and its dials)."""

    per_minute: float = 6.0
    burst: float = 3.0
    per_peer_s: float = 60.0
    max_tracked: int = 1024
    at_once: int = 3
    running: int = 0
    _tokens: float = -1.0
    _at: float = 0.0
    _last: dict[str, float] = field(default_factory=dict)

    def take(self, peer: str, now: float) -> str | None:
        """Why a dial-back for ``peer`` is refused now, or None (and it is counted)."""
        if self.running >= self.at_once:
            return f"busy with {self.running} other dial-backs"
        last = self._last.get(peer)
        if last is not None and now - last < self.per_peer_s:
            return f"one dial-back per peer every {self.per_peer_s:g} s"
        if self._tokens < 0:
            self._tokens, self._at = self.burst, now
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_minute / 60)
        self._at = now
        if self._tokens < 1.0:
            return f"at most {self.per_minute:g} dial-backs a minute"
        self._tokens -= 1.0
        if len(self._last) >= self.max_tracked:
            self._last = {p: t for p, t in self._last.items() if now - t < self.per_peer_s}
        if len(self._last) < self.max_tracked:
            self._last[peer] = now
        return None


@dataclass
class DialbackService:
    """The witness side: dials a requester back from a fresh host (see the module)."""

    rpc: RequestResponse
    #: The addresses a peer claimed for itself (its own record), by peer id.
    claimed: Callable[[str], Collection[str]] = lambda _peer: ()
    rate: DialbackRate = field(default_factory=DialbackRate)
    per_address_s: float = PER_ADDRESS_S

    def serve(self) -> None:
        self.rpc.serve(PROTOCOL_ID, self._handle, LIMITS)

    async def _handle(self, peer: str, request: bytes) -> bytes:
        nonce, addresses = decode_request(request, peer)
        observed = _observed_ip(self.rpc.host, peer)
        allowed = set(self.claimed(peer))
        strangers = [a for a in addresses if a not in allowed and _ip_of(a) != observed]
        if strangers:
            # Declined, not charged: this node's copy of the requester's record may lag (a
            # hint names one address; a node behind NAT puts its circuits first).
            raise Decline(f"asked to dial {strangers[0][:80]!r}, not an address it claimed")
        refused = self.rate.take(peer, trio.current_time())
        if refused is not None:
            raise Decline(refused)
        self.rate.running += 1
        try:
            index = await dial_back(ID.from_base58(peer), addresses, nonce, self.per_address_s)
        finally:
            self.rate.running -= 1
        return b"failed" if index is None else f"reached {index}".encode()


async def dial_back(
    peer: ID, addresses: Sequence[str], nonce: bytes, per_address_s: float
) -> int | None:
    """Dial ``peer`` from a fresh host at each address in turn; on the first that answers,
    send it ``nonce``. The index of that address, or None."""
    host = build_host(new_identity())  # the asker is untrusted: its windows are enforced too
    async with host.run(listen_addrs=[]):
        try:
            dialer = Dialer(host, per_address_s=per_address_s)
            for index, address in enumerate(addresses):
                try:
                    await dialer.connect(peer, [multiaddr.Multiaddr(address)])
                except DialFailed as exc:
                    log.debug("dial-back to %s failed: %s", address, exc)
                    continue
                with trio.move_on_after(per_address_s):
                    stream = await host.new_stream(peer, [TProtocol(NONCE_PROTOCOL)])
                    await stream.write(nonce)
                    await stream.close()
                    return index
                return None
            return None
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await host.get_network().close_peer(peer)


@dataclass
class ReachabilityCheck:
    """The asking side: asks witnesses and collects their nonces."""

    rpc: RequestResponse
    _pending: dict[bytes, trio.Event] = field(default_factory=dict)

    def serve(self) -> None:
        """Take nonces from witnesses' fresh hosts (anyone may open this stream: it reads 16
        bytes within a deadline and only matches nonces this node is waiting for)."""

        async def on_stream(stream: INetStream) -> None:
            try:
                with trio.move_on_after(NONCE_GRACE_S + PER_ADDRESS_S):
                    nonce = b""
                    while len(nonce) < NONCE_BYTES:
                        chunk = await stream.read(NONCE_BYTES - len(nonce))
                        if not chunk:
                            break
                        nonce += chunk
                    event = self._pending.get(nonce)
                    if event is not None:
                        event.set()
                await stream.close()
            except Exception as exc:  # supervision boundary: nothing may escape a handler
                log.debug("dial-back nonce stream failed: %s", exc)
                try:
                    await stream.reset()
                except Exception as reset_exc:  # already gone
                    log.debug("reset failed: %s", reset_exc)

        self.rpc.host.set_stream_handler(TProtocol(NONCE_PROTOCOL), on_stream)

    async def ask(self, witness: ID, addresses: Sequence[str]) -> Vote:
        nonce = secrets.token_bytes(NONCE_BYTES)
        arrived = self._pending[nonce] = trio.Event()
        try:
            try:
                reply = await self.rpc.request(
                    witness, PROTOCOL_ID, encode_request(nonce, addresses), LIMITS
                )
            except PeerUnavailable as exc:
                log.info("peer %s did not check this node's reachability: %s", witness, exc)
                return Vote(str(witness), Outcome.ABSTAINED)
            with trio.move_on_after(NONCE_GRACE_S):
                await arrived.wait()
            words = reply.decode(errors="replace").split()
            if arrived.is_set() and len(words) == 2 and words[0] == "reached":
                index = int(words[1]) if words[1].isdigit() else -1
                address = addresses[index] if 0 <= index < len(addresses) else None
                return Vote(str(witness), Outcome.REACHED, address)
            return Vote(str(witness), Outcome.NOT_REACHED)
        finally:
            del self._pending[nonce]

    async def check(
        self, witnesses: Sequence[ID], addresses: Sequence[str], now_ms: int
    ) -> Reachability:
        """Ask ``witnesses`` (at most ``WITNESSES``) at once; their verdict."""
        votes: list[Vote] = []

        async def ask_one(witness: ID) -> None:
            votes.append(await self.ask(witness, addresses))

        async with trio.open_nursery() as nursery:
            for witness in witnesses[:WITNESSES]:
                nursery.start_soon(ask_one, witness)
        return verdict(votes, now_ms)


def _ip_of(address: str) -> str | None:
    try:
        addr = multiaddr.Multiaddr(address)
        for name in ("ip4", "ip6"):
            if name in [p.name for p in addr.protocols()]:
                return str(ipaddress.ip_address(addr.value_for_protocol(name)))
    except Exception:  # a DNS address, or one the checks above let through: no IP to match
        return None
    return None


def _observed_ip(host: IHost, peer: str) -> str | None:
    """The IP the peer's connection to this node comes from."""
    for conn in host.get_network().get_connections(ID.from_base58(peer)):
        for addr in conn.get_transport_addresses():
            ip = _ip_of(str(addr))
            if ip is not None:
                return ip
    return None


@dataclass
class ReachabilityMonitor:
    """Checks this node's reachability at start (once it has a peer to ask), whenever the
    addresses it advertises change, and every ``period_s``; ``on_verdict`` hears each result
    that says something. A check nobody could answer (witnesses busy, or not yet holding this
    node's record) never replaces a known verdict, and is tried again ``retry_s`` later, then
    twice as long each time up to ``poll_s`` (every ``first_poll_s`` while the node is
    connected to no peer to ask)."""

    check: ReachabilityCheck
    addresses: Callable[[], list[str]]
    witnesses: Callable[[], list[ID]]
    on_verdict: Callable[[Reachability], None]
    wall_ms: Callable[[], int]
    period_s: float = 600.0
    poll_s: float = 10.0
    #: How soon it looks again for a peer to ask while it has none.
    first_poll_s: float = 1.0
    #: How soon a check nobody answered is tried again (doubling up to ``poll_s``).
    retry_s: float = 2.0
    current: Reachability | None = None

    async def run(self) -> None:
        checked_addresses: set[str] | None = None
        checked_at = -math.inf
        unanswered = 0  # checks in a row that nobody could answer
        while True:
            addresses, witnesses = self.addresses(), self.witnesses()
            known = self.current is not None and self.current.reachable is not None
            due = (
                not known
                or set(addresses) != checked_addresses
                or trio.current_time() - checked_at >= self.period_s
            )
            if due and witnesses and addresses:
                result = await self.check.check(witnesses, addresses, self.wall_ms())
                unanswered = 0 if result.reachable is not None else unanswered + 1
                if result.reachable is not None:
                    checked_addresses, checked_at = set(addresses), trio.current_time()
                if result.reachable is not None or not known:
                    self.current = result
                    self.on_verdict(result)
            if not witnesses:  # waiting for a first peer to ask costs nothing: look again soon
                await trio.sleep(min(self.poll_s, self.first_poll_s))
            elif unanswered:
                await trio.sleep(min(self.poll_s, self.retry_s * 2 ** (unanswered - 1)))
            else:
                await trio.sleep(self.poll_s)
