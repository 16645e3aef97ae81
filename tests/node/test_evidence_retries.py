"""An audit's evidence from a relay that is slow to answer: asked again, after a wait, before its
hop is left unreplayed; one that never answers costs the audit a bounded time (real hosts on
loopback; the relay's disk reads are slowed where a loaded machine would slow them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from gwtf.node.audit import replays
from gwtf.node.audit.replays import FETCH_DEADLINES, NODE_RETRY_TIMEOUTS, EvidenceSource
from gwtf.node.p2p.forwarding import forwarded_limits
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity, node_address_of_peer, peer_id_of
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.receipts.evidence import (
    _NOT_KEPT,
    _REPLY,
    _REQUEST,
    CHUNK_BYTES,
    EVIDENCE_VIA_PROTOCOL,
    serve_evidence,
    serve_evidence_forwarding,
)
from gwtf.node.store.evidence import Chunk, EvidenceArchive
from tests.p2p.test_host_stop import run_bounded

TIMEOUT_S = 0.5
RUN = 1


class StalledArchive(EvidenceArchive):
    """An archive whose first ``stalls`` frame reads outlast the auditor's request timeout, as
    a relay's would on a machine busy training."""

    def __init__(self, root: Path, stalls: int) -> None:
        super().__init__(root, keep_epochs=2, epoch_now=lambda: 0)
        self.stalls = stalls

    def frame_chunk(self, epoch: int, digest: bytes, offset: int, size: int) -> Chunk | None:
        if self.stalls > 0:
            self.stalls -= 1
            time.sleep(3 * TIMEOUT_S)
        return super().frame_chunk(epoch, digest, offset, size)


def test_evidence_a_relay_is_slow_to_serve_is_asked_again_after_a_wait(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_host(new_identity()) as relay, running_host(new_identity()) as auditor:
            archive = StalledArchive(tmp_path, stalls=1)
            digest = archive.keep_frame(0, b"hop input")
            serve_evidence(RequestResponse(relay), archive, RUN, TIMEOUT_S)
            rpc = RequestResponse(auditor)
            await rpc.dialer.connect(relay.get_id(), relay.get_addrs())
            node = node_address_of_peer(relay.get_id()).lower()
            source = EvidenceSource(rpc, {node: str(relay.get_id())}, RUN, TIMEOUT_S)
            assert await source.frame(0, digest, [node]) == b"hop input"
            assert archive.stalls == 0, "the first read stalled past the request's timeout"
            # The relay still counts as serving: its other frames are asked for.
            other = archive.keep_frame(0, b"hop output")
            assert await source.frame(0, other, [node]) == b"hop output"

    run_bounded(main)


def test_a_reached_relay_that_stops_answering_is_read_through_a_forwarder(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as data_node,
            running_host(new_identity()) as auditor,
        ):
            archive = StalledArchive(tmp_path, stalls=0)
            digest = archive.keep_frame(0, b"hop input")
            serve_evidence(RequestResponse(relay), archive, RUN, TIMEOUT_S)
            forwarding = RequestResponse(data_node)
            serve_evidence_forwarding(forwarding, TIMEOUT_S)
            await forwarding.dialer.connect(relay.get_id(), relay.get_addrs())
            rpc = RequestResponse(auditor)
            await rpc.dialer.connect(data_node.get_id(), data_node.get_addrs())
            # The auditor reached the relay, then lost its connection and cannot dial it again.
            relay_id = relay.get_id()
            await rpc.dialer.connect(relay_id, relay.get_addrs())
            await auditor.get_network().close_peer(relay_id)
            auditor.get_peerstore().clear_addrs(relay_id)
            node = node_address_of_peer(relay_id).lower()
            source = EvidenceSource(
                rpc, {node: str(relay_id)}, RUN, TIMEOUT_S, forwarders=[str(data_node.get_id())]
            )
            assert await source.frame(0, digest, [node]) == b"hop input"

    run_bounded(main)


def test_a_relay_that_never_answers_costs_the_audit_a_bounded_time(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_host(new_identity()) as relay, running_host(new_identity()) as auditor:
            archive = StalledArchive(tmp_path, stalls=1000)
            digests = [archive.keep_frame(0, bytes([i]) * 8) for i in range(5)]
            serve_evidence(RequestResponse(relay), archive, RUN, TIMEOUT_S)
            rpc = RequestResponse(auditor)
            await rpc.dialer.connect(relay.get_id(), relay.get_addrs())
            node = node_address_of_peer(relay.get_id()).lower()
            source = EvidenceSource(rpc, {node: str(relay.get_id())}, RUN, TIMEOUT_S)
            budget = NODE_RETRY_TIMEOUTS * TIMEOUT_S
            started = trio.current_time()
            for digest in digests:
                assert await source.frame(0, digest, [node]) is None
            spent = trio.current_time() - started
            # A first try (one request timeout: the reply never comes) and the node's retry
            # budget, for all five hops: the relay is asked nothing once no round served.
            assert spent < FETCH_DEADLINES * TIMEOUT_S + budget + 2.0

    run_bounded(main)


def test_silent_relays_together_cost_the_audit_no_more_than_its_total_retry_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each node's retries are its own, and all of them together within the audit's: three
    relays that never answer, with a total of one node's budget, get retries only while it
    lasts."""
    monkeypatch.setattr(replays, "RETRY_BUDGET_TIMEOUTS", NODE_RETRY_TIMEOUTS)

    async def main() -> None:
        async with (
            running_host(new_identity()) as first,
            running_host(new_identity()) as second,
            running_host(new_identity()) as third,
            running_host(new_identity()) as auditor,
        ):
            rpc = RequestResponse(auditor)
            peers, digests = {}, []
            for n, relay in enumerate((first, second, third)):
                archive = StalledArchive(tmp_path / str(n), stalls=1000)
                digests.append(archive.keep_frame(0, b"never served"))
                serve_evidence(RequestResponse(relay), archive, RUN, TIMEOUT_S)
                await rpc.dialer.connect(relay.get_id(), relay.get_addrs())
                peers[node_address_of_peer(relay.get_id()).lower()] = str(relay.get_id())
            source = EvidenceSource(rpc, peers, RUN, TIMEOUT_S)
            total = source.retry_budget_s
            started = trio.current_time()
            for node, digest in zip(peers, digests, strict=True):
                assert await source.frame(0, digest, [node]) is None
            spent = trio.current_time() - started
            assert source.retry_budget_s <= 0
            # Three first tries (a request timeout each) and the total retry budget.
            assert spent < 3 * 2 * TIMEOUT_S + total + 1.5

    run_bounded(main)


def test_a_silent_node_with_several_forwarders_leaves_a_busy_relay_its_retries(
    tmp_path: Path,
) -> None:
    """Each node has its own retry budget: a home relay that never answers, asked first through
    each of its forwarders in every round, spends its own, and a relay busy on its first try,
    asked after it, still gets its retry."""

    async def main() -> None:
        async with (
            running_host(new_identity()) as silent,
            running_host(new_identity()) as busy,
            running_host(new_identity()) as one,
            running_host(new_identity()) as two,
            running_host(new_identity()) as auditor,
        ):
            mute = StalledArchive(tmp_path / "silent", stalls=1000)
            muted = mute.keep_frame(0, b"never served")
            serve_evidence(RequestResponse(silent), mute, RUN, TIMEOUT_S)
            archive = StalledArchive(tmp_path / "busy", stalls=1)
            digest = archive.keep_frame(0, b"hop input")
            serve_evidence(RequestResponse(busy), archive, RUN, TIMEOUT_S)
            rpc = RequestResponse(auditor)
            forwarders = []
            for host in (one, two):  # the silent relay's connections, as it keeps them
                forwarding = RequestResponse(host)
                serve_evidence_forwarding(forwarding, TIMEOUT_S)
                await forwarding.dialer.connect(silent.get_id(), silent.get_addrs())
                await rpc.dialer.connect(host.get_id(), host.get_addrs())
                forwarders.append(str(host.get_id()))
            await rpc.dialer.connect(busy.get_id(), busy.get_addrs())
            at_home = node_address_of_peer(silent.get_id()).lower()
            reached = node_address_of_peer(busy.get_id()).lower()
            source = EvidenceSource(
                rpc, {reached: str(busy.get_id())}, RUN, TIMEOUT_S,
                unreached={at_home: str(silent.get_id())}, forwarders=forwarders,
            )  # fmt: skip
            assert await source.frame(0, muted, [at_home]) is None
            assert source.node_retry_budget_s[at_home] <= 0, "the silent node spent its own"
            assert await source.frame(0, digest, [reached]) == b"hop input"
            assert archive.stalls == 0, "the busy relay's first try did stall"

    run_bounded(main)


def _lying_forwarder(rpc: RequestResponse, reply: bytes) -> None:
    """A forwarder that answers every forwarded evidence request with ``reply`` itself."""

    async def lie(_peer: str, _request: bytes) -> bytes:
        return reply

    limits = forwarded_limits(_REQUEST.size, _REPLY.size + CHUNK_BYTES, TIMEOUT_S)
    rpc.serve(EVIDENCE_VIA_PROTOCOL, lie, limits, PublicRate())


def test_a_forwarder_saying_not_kept_leaves_the_other_routes_asked(tmp_path: Path) -> None:
    """Only a node's own direct answer counts as "not kept": a forwarder's is that route
    failing, both for a node never reached and for a reached one that is busy twice."""

    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as liar,
            running_host(new_identity()) as honest,
            running_host(new_identity()) as auditor,
        ):
            archive = StalledArchive(tmp_path, stalls=0)
            digest = archive.keep_frame(0, b"hop input")
            serve_evidence(RequestResponse(relay), archive, RUN, TIMEOUT_S)
            _lying_forwarder(RequestResponse(liar), _REPLY.pack(_NOT_KEPT, 0))
            forwarding = RequestResponse(honest)
            serve_evidence_forwarding(forwarding, TIMEOUT_S)
            await forwarding.dialer.connect(relay.get_id(), relay.get_addrs())
            rpc = RequestResponse(auditor)
            for peer in (liar, honest):
                await rpc.dialer.connect(peer.get_id(), peer.get_addrs())
            node = node_address_of_peer(relay.get_id()).lower()
            relay_id = str(relay.get_id())
            forwarders = [str(liar.get_id()), str(honest.get_id())]
            unreached = EvidenceSource(
                rpc, {}, RUN, TIMEOUT_S, unreached={node: relay_id}, forwarders=forwarders
            )
            assert await unreached.frame(0, digest, [node]) == b"hop input"
            # Reached directly, busy for the first try and the second round's direct one.
            await rpc.dialer.connect(relay.get_id(), relay.get_addrs())
            archive.stalls = 2
            reached = EvidenceSource(rpc, {node: relay_id}, RUN, TIMEOUT_S, forwarders=forwarders)
            assert await reached.frame(0, digest, [node]) == b"hop input"
            assert archive.stalls == 0
            # The node's own direct "not kept" still counts.
            missing = EvidenceSource(rpc, {node: relay_id}, RUN, TIMEOUT_S, forwarders=forwarders)
            assert await missing.frame(0, b"\x00" * 32, [node]) is None
            assert node not in missing._silent, "a node keeping none is not a silent one"

    run_bounded(main)


def test_retries_a_forwarder_ends_with_not_kept_are_charged_to_the_budgets(
    tmp_path: Path,
) -> None:
    """A retry round that ends in a forwarder's "not kept" took its time all the same: it is
    charged to the node's retry budget and the audit's. Uncharged, a forwarder that stalls a
    node's first try and says "not kept" on the retry makes every request for that node cost
    a first try and a retry, never counted, however many hops ask: an audit without bound."""

    async def main() -> None:
        async with running_host(new_identity()) as liar, running_host(new_identity()) as auditor:
            asked: dict[bytes, int] = {}

            async def stall_then_not_kept(_peer: str, request: bytes) -> bytes:
                asked[request] = asked.get(request, 0) + 1
                if asked[request] == 1:
                    await trio.sleep(100 * TIMEOUT_S)  # the first try times out
                await trio.sleep(TIMEOUT_S / 2)  # the retry takes its time, then "not kept"
                return _REPLY.pack(_NOT_KEPT, 0)

            limits = forwarded_limits(_REQUEST.size, _REPLY.size + CHUNK_BYTES, TIMEOUT_S)
            RequestResponse(liar).serve(
                EVIDENCE_VIA_PROTOCOL, stall_then_not_kept, limits, PublicRate()
            )
            rpc = RequestResponse(auditor)
            await rpc.dialer.connect(liar.get_id(), liar.get_addrs())
            home = peer_id_of(new_identity())  # a relay at home, asked only through the liar
            at_home = node_address_of_peer(home).lower()
            source = EvidenceSource(
                rpc, {}, RUN, TIMEOUT_S,
                unreached={at_home: str(home)},
                forwarders=[str(liar.get_id())],
            )  # fmt: skip
            total = source.retry_budget_s
            for n in range(3):
                assert await source.frame(0, bytes([n]) * 32, [at_home]) is None
            own = source.node_retry_budget_s.get(at_home, NODE_RETRY_TIMEOUTS * TIMEOUT_S)
            assert own < NODE_RETRY_TIMEOUTS * TIMEOUT_S, "the node's retries were not charged"
            assert source.retry_budget_s < total, "the audit's retries were not charged"

    run_bounded(main)


def test_first_tries_that_serve_nothing_are_charged_until_the_node_is_silent(
    tmp_path: Path,
) -> None:
    """A home node's first try that serves nothing (one forwarder stalls every request, the
    other says "not kept") is charged to its budget and the audit's: uncharged, each request
    for the node cost a request timeout, however many, and the node was never made silent."""

    async def main() -> None:
        async with (
            running_host(new_identity()) as staller,
            running_host(new_identity()) as liar,
            running_host(new_identity()) as auditor,
        ):

            async def stall(_peer: str, _request: bytes) -> bytes:
                await trio.sleep(100 * TIMEOUT_S)
                return b""

            limits = forwarded_limits(_REQUEST.size, _REPLY.size + CHUNK_BYTES, TIMEOUT_S)
            RequestResponse(staller).serve(EVIDENCE_VIA_PROTOCOL, stall, limits, PublicRate())
            _lying_forwarder(RequestResponse(liar), _REPLY.pack(_NOT_KEPT, 0))
            rpc = RequestResponse(auditor)
            for peer in (staller, liar):
                await rpc.dialer.connect(peer.get_id(), peer.get_addrs())
            home = peer_id_of(new_identity())  # a relay at home, asked only through those two
            at_home = node_address_of_peer(home).lower()
            source = EvidenceSource(
                rpc, {}, RUN, TIMEOUT_S,
                unreached={at_home: str(home)},
                forwarders=[str(staller.get_id()), str(liar.get_id())],
            )  # fmt: skip
            total = source.retry_budget_s
            started = trio.current_time()
            for n in range(20):
                assert await source.frame(0, bytes([n]) * 32, [at_home]) is None
            spent = trio.current_time() - started
            assert at_home in source._silent, "the node was never made silent"
            assert source.retry_budget_s < total, "the audit's budget was not charged"
            # Its own budget, and the one try that spent it: not a timeout per request.
            assert spent < NODE_RETRY_TIMEOUTS * TIMEOUT_S + 2 * FETCH_DEADLINES * TIMEOUT_S

    run_bounded(main)
