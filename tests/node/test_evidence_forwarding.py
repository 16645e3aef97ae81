"""Forwarding evidence requests: only over a connection the forwarder already has, and only
well-formed ones (real hosts on loopback; the NAT case is tests/internet/test_evidence_bed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PeerUnavailable, RequestDeclined, RequestResponse, RpcLimits
from gwtf.node.receipts.evidence import (
    EVIDENCE_VIA_PROTOCOL,
    fetch_frame,
    serve_evidence,
    serve_evidence_forwarding,
)
from gwtf.node.store.evidence import EvidenceArchive
from tests.p2p.test_host_stop import run_bounded


def test_a_forwarder_fetches_only_from_peers_it_is_connected_to(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running_host(new_identity()) as relay,
            running_host(new_identity()) as forwarder,
            running_host(new_identity()) as auditor,
        ):
            archive = EvidenceArchive(tmp_path, keep_epochs=2, epoch_now=lambda: 0)
            digest = archive.keep_frame(0, b"hop evidence")
            serve_evidence(RequestResponse(relay), archive, 1, 5.0)
            forwarding = RequestResponse(forwarder)
            serve_evidence_forwarding(forwarding, 5.0)
            rpc = RequestResponse(auditor)
            await rpc.dialer.connect(forwarder.get_id(), forwarder.get_addrs())
            relay_id, via = str(relay.get_id()), str(forwarder.get_id())
            with pytest.raises(RequestDeclined, match="not connected"):
                await fetch_frame(rpc, relay_id, 1, 0, digest, 5.0, via=via)
            await forwarding.dialer.connect(relay.get_id(), relay.get_addrs())
            assert await fetch_frame(rpc, relay_id, 1, 0, digest, 5.0, via=via) == b"hop evidence"
            limits = RpcLimits(128, 64, 5.0)
            for bad in (b"", b"\x05abc", bytes([len(relay_id)]) + relay_id.encode() + b"short"):
                with pytest.raises(PeerUnavailable, match="forwarded evidence request"):
                    await rpc.request(forwarder.get_id(), EVIDENCE_VIA_PROTOCOL, bad, limits)

    run_bounded(main)
