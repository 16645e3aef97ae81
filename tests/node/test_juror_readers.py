"""A seated juror's evidence reads have a disk reader of their own: the run's members are not
rate-limited, and one that keeps the relay's shared readers busy (slow reads of a made-up key)
does not time out a juror's read (real hosts on loopback; the relay's disk reads of the
member's key are slowed where a loaded disk would slow them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse
from gwtf.node.receipts.evidence import READERS, fetch_frame, serve_evidence
from gwtf.node.store.evidence import Chunk, EvidenceArchive
from tests.p2p.test_host_stop import run_bounded

TIMEOUT_S = 0.5
RUN = 1
SLOW = bytes(32)


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
