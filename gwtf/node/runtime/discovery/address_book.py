"""The address book of known peers, and peer discovery by exchange (the DHT's fallback).

The book is the one place discovery feeds: the DHT (``run_discovery``), hints on the run's
topic, and the exchange below all ``learn`` peers into it.

Each node starts from bootstrap addresses, asks them for their address books and introduces
itself with its own address and region, so a joiner becomes known to the swarm through whichever
node it asked first. Nothing here is trusted: lines are parsed strictly, the book is bounded, and
a peer's claimed region only affects link emulation (a test-bench feature).

Protocol ``/gwtf/peers/3.0.0``: request = ``ADDRESS REGION [ADDRESS ...]``; reply = up to
``MAX_ENTRIES`` such lines, all UTF-8. A line holds every address the peer advertises, the one to
dial first leading, at most ``MAX_ADDRESSES`` (``gwtf.node.p2p.addresses``); each must name the
peer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Protocol

import trio
from libp2p.peer.id import ID

from gwtf.errors import ConfigError, ProtocolError
from gwtf.node.p2p.addresses import MAX_ADDRESSES, check_peer_addresses
from gwtf.node.p2p.dialing import DialFailed
from gwtf.node.p2p.host import ADDRESS_TTL_S, full_addresses, peer_info, point_at
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits

log = logging.getLogger(__name__)

PROTOCOL_ID = "/gwtf/peers/3.0.0"
MAX_ENTRIES = 256
MAX_LINE_BYTES = 1024
LIMITS = RpcLimits(MAX_LINE_BYTES, MAX_ENTRIES * (MAX_LINE_BYTES + 1), 5.0)


@dataclass(frozen=True)
class PeerRecord:
    peer_id: str
    address: str
    region: str
    #: The stage the peer serves (0 = data node), when a card or hint said so.
    stage: int | None = None
    #: More addresses the peer advertises, tried after ``address``.
    other_addresses: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.address, *self.other_addresses)


def format_record(record: PeerRecord) -> str:
    return " ".join([record.address, record.region, *record.other_addresses])


def parse_record(line: str) -> PeerRecord:
    parts = line.split(" ")
    if not 2 <= len(parts) <= MAX_ADDRESSES + 1 or len(line.encode()) > MAX_LINE_BYTES:
        raise ProtocolError(
            f"peer record must be 'ADDRESS REGION [ADDRESS ...]' with at most {MAX_ADDRESSES} "
            f"addresses, within {MAX_LINE_BYTES} bytes"
        )
    address, region, *more = parts
    try:
        info = peer_info(address)
    except ConfigError as exc:
        raise ProtocolError(f"bad peer address in a peer record: {exc}") from exc
    if not region.isidentifier():
        raise ProtocolError(f"bad region {region[:20]!r} in a peer record")
    check_peer_addresses(parts[:1] + more, str(info.peer_id))
    return PeerRecord(str(info.peer_id), address, region, other_addresses=tuple(more))


class NewPeer(Protocol):
    """Told of each peer the book learns (its record), once. Must not block or raise: it runs
    in the exchange that brought the peer."""

    def __call__(self, record: PeerRecord, /) -> None: ...


class PeerHeard(Protocol):
    """Told of a peer's id whenever an exchange with it succeeds (it is alive right now). Must
    not block or raise."""

    def __call__(self, peer: str, /) -> None: ...


@dataclass
class AddressBook:
    """Peers this node knows, with a callback for each new one."""

    rpc: RequestResponse
    own: PeerRecord
    on_new_peer: NewPeer
    #: Called with a peer's id whenever an exchange with it succeeds (it is alive right now).
    on_heard: PeerHeard = lambda _peer: None
    peers: dict[str, PeerRecord] = field(default_factory=dict)
    #: Spare capacity (microbatches) that peers last hinted; informational only.
    spare: dict[str, int] = field(default_factory=dict)

    def serve(self) -> None:
        self.rpc.serve(PROTOCOL_ID, self._handle, LIMITS)

    async def _handle(self, peer: str, request: bytes) -> bytes:
        try:
            record = parse_record(request.decode())
        except UnicodeDecodeError as exc:
            raise ProtocolError("peer record is not UTF-8") from exc
        if record.peer_id != peer:
            raise ProtocolError(f"peer {peer} introduced itself with another peer id")
        self.learn(record, firsthand=True)
        self.on_heard(peer)
        lines = [format_record(r) for r in [self.own, *self.peers.values()]]
        return "\n".join(lines[:MAX_ENTRIES]).encode()

    def learn(self, record: PeerRecord, firsthand: bool = False) -> None:
        """Add a peer (``on_new_peer`` fires once per peer), or update a known one's record.

        ``firsthand``: the peer itself said it, over its own connection. Cards and hints (they
        carry a stage) are signed by the peer, so they are firsthand too."""
        if record.peer_id == self.own.peer_id:
            return
        firsthand = firsthand or record.stage is not None
        known = self.peers.get(record.peer_id)
        if known is not None:
            # The peer's own word may correct what an exchange said, or bring a new address
            # after a restart; an exchange's hearsay never overrides it.
            if not firsthand and known.stage is not None:
                return
            if record.stage is None:
                record = replace(record, stage=known.stage)
            if not record.other_addresses and record.address in known.addresses:
                # A hint or a load report names one address: the full list stays.
                record = replace(
                    record, address=known.address, other_addresses=known.other_addresses
                )
            if record != known:
                self.peers[record.peer_id] = record
                self._remember_address(record, moved=firsthand and record.address != known.address)
            return
        if len(self.peers) >= MAX_ENTRIES:
            return
        self.peers[record.peer_id] = record
        self._remember_address(record, moved=False)
        self.on_new_peer(record)

    def forget(self, peer_id: str) -> None:
        """Drop a peer that said it is leaving; it is learned anew if it shows up again."""
        self.peers.pop(peer_id, None)
        self.spare.pop(peer_id, None)

    def stage_of(self, peer_id: str) -> int | None:
        """The stage ``peer_id``'s signed card or hint names (0: a data node), None if this
        book holds none (a peer learned only by exchange, whose records carry no stage)."""
        record = self.peers.get(peer_id)
        return None if record is None else record.stage

    def replicas_of(self, stage: int) -> list[PeerRecord]:
        return [r for r in self.peers.values() if r.stage == stage]

    def _remember_address(self, record: PeerRecord, moved: bool) -> None:
        peer = ID.from_base58(record.peer_id)
        addrs = [addr for address in record.addresses for addr in peer_info(address).addrs]
        if moved:
            # Only the new addresses: the old ones belong to the peer's previous process.
            point_at(self.rpc.host, peer, addrs)
        else:
            self.rpc.host.get_peerstore().add_addrs(peer, addrs, ADDRESS_TTL_S)

    async def exchange_with(self, address: str) -> None:
        """Introduce this node to the peer at ``address`` and learn the peers it knows."""
        info = peer_info(address)
        request = format_record(self.own).encode()
        try:
            await self.rpc.dialer.connect(info.peer_id, info.addrs)
            reply = await self.rpc.request(info.peer_id, PROTOCOL_ID, request, LIMITS)
        except (PeerUnavailable, DialFailed, OSError, trio.TooSlowError) as exc:
            log.info("peer exchange with %s failed: %s", address, exc)
            return
        except Exception as exc:  # libp2p's dial errors have no common base worth naming
            log.info("could not dial %s: %s", address, exc)
            return
        self.on_heard(str(info.peer_id))
        for line in reply.decode(errors="replace").splitlines()[:MAX_ENTRIES]:
            try:
                self.learn(parse_record(line))
            except ProtocolError as exc:
                log.warning("peer %s sent a bad peer record: %s", info.peer_id, exc)


def own_record(rpc: RequestResponse, region: str) -> PeerRecord:
    """This node's record: every address its host advertises, best first."""
    first, *more = full_addresses(rpc.host)
    return PeerRecord(str(rpc.host.get_id()), first, region, other_addresses=tuple(more))
