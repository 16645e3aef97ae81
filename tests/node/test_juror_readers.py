"""A seated juror's evidence reads have a disk reader of their own: the run's members are not
rate-limited, and one that keeps the relay's shared readers busy (slow reads of a made-up key)
does not time out a juror's read (real hosts on loopback; the relay's disk reads of the
member's key are slowed where a loaded disk would slow them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from libp2p.custom_types import TProtocol

from gwtf.contracts.encoding import ledger_domain
from gwtf.errors import ProtocolError
from gwtf.node.p2p.forwarding import for_limits, forwarded, forwarded_limits
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity, peer_id_of
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse
from gwtf.node.receipts import evidence, serving
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.evidence import (
    EVIDENCE_FOR_PROTOCOL,
    EVIDENCE_VIA_PROTOCOL,
    FORWARDED_READERS,
    FRAME,
    READERS,
    fetch_frame,
    serve_evidence,
    serve_evidence_forwarding,
)
from gwtf.node.receipts.serving import (
    RECEIPTS_VIA_PROTOCOL,
    ReceiptServer,
    serve_receipts_forwarding,
)
from gwtf.node.store.batches import BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.evidence import Chunk, EvidenceArchive
from tests.p2p.test_host_stop import run_bounded

TIMEOUT_S = 0.5
RUN = 1
SLOW = bytes(32)
DOMAIN = ledger_domain(1, "0x" + "44" * 20)


class SlowForOneKey(EvidenceArchive):
    """Reads of ``SLOW`` take twice the request timeout; every other read is the disk's."""

    def frame_chunk(self, epoch: int, digest: bytes, offset: int, size: int) -> Chunk | None:
        if digest == SLOW:
            time.sleep(2 * TIMEOUT_S)
        return super().frame_chunk(epoch, digest, offset, size)


def test_a_member_busying_the_readers_does_not_time_out_a_seated_jurors_read(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as member,
            running_host(new_identity()) as juror,
            running_host(new_identity()) as outsider,
        ):
            seated = str(juror.get_id())

            class Held:
                async def holds(self, peer: str) -> bool:
                    return peer == seated

            async def members_only(peer: str) -> bool:
                return peer == str(member.get_id())

            archive = SlowForOneKey(tmp_path, keep_epochs=2, epoch_now=lambda: 0)
            digest = archive.keep_frame(0, b"hop evidence")
            serve_evidence(RequestResponse(relay, admit=members_only), archive, RUN, 10.0,
                           seats=Held())  # fmt: skip
            clients = {}
            for name, host in (("member", member), ("juror", juror), ("outsider", outsider)):
                clients[name] = RequestResponse(host)
                await clients[name].dialer.connect(relay.get_id(), relay.get_addrs())
            target = str(relay.get_id())

            async def busy_reader() -> None:
                with pytest.raises(PeerUnavailable):  # not kept: it only kept a reader busy
                    await fetch_frame(clients["member"], target, RUN, 0, SLOW, 30.0)

            async with trio.open_nursery() as nursery:
                for _ in range(2 * READERS):
                    nursery.start_soon(busy_reader)
                await trio.sleep(0.3)  # every shared reader is in a slow read now
                frame = await fetch_frame(clients["juror"], target, RUN, 0, digest, TIMEOUT_S)
                assert frame == b"hop evidence"
                # Anyone else waits for the shared readers: past its timeout.
                with pytest.raises(PeerUnavailable):
                    await fetch_frame(clients["outsider"], target, RUN, 0, digest, TIMEOUT_S)
                nursery.cancel_scope.cancel()

    run_bounded(main)


def test_a_juror_forwarded_to_a_relay_at_home_reads_on_a_reader_of_its_own(
    tmp_path: Path,
) -> None:
    """Through a forwarder (how a juror reaches a relay at home) a seated juror's read is
    the forwarder's request at the relay, a member's: the forwarder names the juror
    (``/gwtf/evidence-for/1.0.0``) and the relay, which reads the seat itself, reads it on a
    reader of the juror's own, while a member keeps the shared readers busy. A member naming
    the juror in slow requests of its own busies only its own reader for it, not the juror's;
    an outsider is not served that protocol, and one the forwarder does not seat waits."""

    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as forwarder,
            running_host(new_identity()) as member,
            running_host(new_identity()) as juror,
            running_host(new_identity()) as outsider,
        ):
            seated = str(juror.get_id())
            members = {str(member.get_id()), str(forwarder.get_id())}

            class Held:
                async def holds(self, peer: str) -> bool:
                    return peer == seated

            async def members_only(peer: str) -> bool:
                return peer in members

            async def outsiders_only(_peer: str) -> bool:
                return False

            archive = SlowForOneKey(tmp_path, keep_epochs=2, epoch_now=lambda: 0)
            digest = archive.keep_frame(0, b"hop evidence")
            relay_rpc = RequestResponse(relay, admit=members_only)
            serve_evidence(relay_rpc, archive, RUN, 10.0, seats=Held())
            forwarding = RequestResponse(forwarder, admit=outsiders_only)
            serve_evidence_forwarding(forwarding, 10.0, Held())
            await forwarding.dialer.connect(relay.get_id(), relay.get_addrs())
            clients = {}
            for name, host in (("member", member), ("juror", juror), ("outsider", outsider)):
                clients[name] = RequestResponse(host)
            await clients["member"].dialer.connect(relay.get_id(), relay.get_addrs())
            for name in ("juror", "outsider"):
                await clients[name].dialer.connect(forwarder.get_id(), forwarder.get_addrs())
            target, via = str(relay.get_id()), str(forwarder.get_id())
            slow = evidence._REQUEST.pack(RUN, 0, FRAME, SLOW, 0)
            limits = for_limits(evidence._limits(30.0))

            async def busy_reader() -> None:
                with pytest.raises(ProtocolError):  # not kept: it only kept a reader busy
                    await fetch_frame(clients["member"], target, RUN, 0, SLOW, 30.0)

            async def naming_the_juror() -> None:
                await clients["member"].request(
                    relay.get_id(), EVIDENCE_FOR_PROTOCOL, forwarded(seated, slow), limits
                )

            async with trio.open_nursery() as nursery:
                for _ in range(2 * READERS):
                    nursery.start_soon(busy_reader)
                    nursery.start_soon(naming_the_juror)
                await trio.sleep(0.3)  # every shared reader, and the member's, is busy now
                read = await fetch_frame(clients["juror"], target, RUN, 0, digest, TIMEOUT_S, via)
                assert read == b"hop evidence"
                with pytest.raises(PeerUnavailable):  # the outsider waits for shared readers
                    await fetch_frame(clients["outsider"], target, RUN, 0, digest, TIMEOUT_S, via)
                nursery.cancel_scope.cancel()
            await clients["outsider"].dialer.connect(relay.get_id(), relay.get_addrs())
            with pytest.raises(PeerUnavailable):  # the for protocol is the run's nodes' only
                await clients["outsider"].request(
                    relay.get_id(), EVIDENCE_FOR_PROTOCOL, forwarded(seated, slow), limits
                )
            assert relay_rpc.refused == {str(outsider.get_id()): 1}

    run_bounded(main)


def test_a_forwarder_reaches_a_relay_without_the_for_protocol_for_a_seated_juror(
    tmp_path: Path,
) -> None:
    """A relay of an older version serves no ``/gwtf/evidence-for/1.0.0``: the forwarder
    passes a seated juror's request on over the plain protocol, as a member's, so the juror
    reads the evidence (a juror who reads nothing votes it missing: the honest relay would
    be convicted for its version)."""

    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as forwarder,
            running_host(new_identity()) as juror,
        ):
            seated = str(juror.get_id())

            class Held:
                async def holds(self, peer: str) -> bool:
                    return peer == seated

            async def outsiders_only(_peer: str) -> bool:
                return False

            async def the_forwarder(peer: str) -> bool:
                return peer == str(forwarder.get_id())

            archive = EvidenceArchive(tmp_path, keep_epochs=2, epoch_now=lambda: 0)
            digest = archive.keep_frame(0, b"hop evidence")
            relay_rpc = RequestResponse(relay, admit=the_forwarder)
            serve_evidence(relay_rpc, archive, RUN, 10.0, seats=Held())
            relay.remove_stream_handler(TProtocol(EVIDENCE_FOR_PROTOCOL))  # an older relay
            forwarding = RequestResponse(forwarder, admit=outsiders_only)
            serve_evidence_forwarding(forwarding, 10.0, Held())
            await forwarding.dialer.connect(relay.get_id(), relay.get_addrs())
            client = RequestResponse(juror)
            await client.dialer.connect(forwarder.get_id(), forwarder.get_addrs())
            target, via = str(relay.get_id()), str(forwarder.get_id())
            for _ in range(2):  # and again, on the channels the first try left
                read = await fetch_frame(client, target, RUN, 0, digest, 5.0, via)
                assert read == b"hop evidence"

    run_bounded(main)


def test_a_member_naming_every_seated_juror_takes_its_forwarders_readers_only(
    tmp_path: Path,
) -> None:
    """A member may name any seated juror on ``/gwtf/evidence-for/1.0.0`` (the relay cannot
    tell whom it forwards for): each juror it names reads on a reader of its own, but all of
    them within ``FORWARDED_READERS`` of that member's, so the disk reads it holds at once are
    bounded whatever seats the chain gives, not one per seat."""
    jurors = [str(peer_id_of(new_identity())) for _ in range(2 * FORWARDED_READERS)]

    class Counting(EvidenceArchive):
        now = most = 0

        def frame_chunk(self, epoch: int, digest: bytes, offset: int, size: int) -> Chunk | None:
            Counting.now += 1
            Counting.most = max(Counting.most, Counting.now)
            time.sleep(0.3)
            Counting.now -= 1
            return super().frame_chunk(epoch, digest, offset, size)

    async def main() -> None:
        async with running_host(new_identity()) as relay, running_host(new_identity()) as member:

            class Held:
                async def holds(self, peer: str) -> bool:
                    return peer in jurors

            async def members_only(peer: str) -> bool:
                return peer == str(member.get_id())

            archive = Counting(tmp_path, keep_epochs=2, epoch_now=lambda: 0)
            digest = archive.keep_frame(0, b"hop evidence")
            serve_evidence(RequestResponse(relay, admit=members_only), archive, RUN, 10.0,
                           seats=Held())  # fmt: skip
            client = RequestResponse(member)
            await client.dialer.connect(relay.get_id(), relay.get_addrs())
            request = evidence._REQUEST.pack(RUN, 0, FRAME, digest, 0)
            limits = for_limits(evidence._limits(30.0))

            async def naming(juror: str) -> None:
                reply = await client.request(
                    relay.get_id(), EVIDENCE_FOR_PROTOCOL, forwarded(juror, request), limits
                )
                assert reply.endswith(b"hop evidence")

            async with trio.open_nursery() as nursery:
                for juror in jurors:
                    nursery.start_soon(naming, juror)

    run_bounded(main)
    assert Counting.most == FORWARDED_READERS


@pytest.mark.parametrize("via", ["evidence", "receipts"])
def test_a_malformed_request_through_a_forwarder_is_charged_to_its_sender_not_the_forwarder(
    tmp_path: Path, via: str
) -> None:
    """An outsider sends requests of a kind nobody serves through a data node to its relay:
    the relay would charge each as malformed to whoever sent it (the forwarder, an honest
    run member), six of them a ban, and the relay would refuse its own data node. The
    forwarder checks the inner request and charges the outsider; the relay charges nobody."""

    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as forwarder,
            running_host(new_identity()) as outsider,
        ):

            async def the_forwarder(peer: str) -> bool:
                return peer == str(forwarder.get_id())

            async def outsiders_only(_peer: str) -> bool:
                return False

            relay_rpc = RequestResponse(relay, admit=the_forwarder)
            forwarding = RequestResponse(forwarder, admit=outsiders_only)
            if via == "evidence":
                archive = EvidenceArchive(tmp_path, keep_epochs=2, epoch_now=lambda: 0)
                serve_evidence(relay_rpc, archive, RUN, 10.0)
                serve_evidence_forwarding(forwarding, 10.0)
                protocol, limits = EVIDENCE_VIA_PROTOCOL, evidence._limits(10.0)
                inner = evidence._REQUEST.pack(RUN, 0, 3, bytes(32), 0)
            else:
                terms = ReceiptTerms(RUN, DOMAIN, 2, 1)
                store = BatchStore(open_database(f"sqlite:///{tmp_path / 'r.sqlite'}"), DOMAIN)
                ReceiptServer(store, terms).serve(relay_rpc, 10.0)
                serve_receipts_forwarding(forwarding, 10.0)
                protocol, limits = RECEIPTS_VIA_PROTOCOL, serving._limits(10.0)
                inner = serving._REQUEST.pack(RUN, 0, 3, 0, 1)
            await forwarding.dialer.connect(relay.get_id(), relay.get_addrs())
            client = RequestResponse(outsider)
            await client.dialer.connect(forwarder.get_id(), forwarder.get_addrs())
            outer = forwarded_limits(limits.max_request_bytes, limits.max_response_bytes, 10.0)
            for _ in range(6):
                with pytest.raises(PeerUnavailable):  # refused, then banned
                    await client.request(
                        forwarder.get_id(), protocol, forwarded(str(relay.get_id()), inner), outer
                    )
            now = trio.current_time()
            assert not relay_rpc.scores.is_banned(str(forwarder.get_id()), now)
            assert forwarding.scores.is_banned(str(outsider.get_id()), now)

    run_bounded(main)
