"""What a certificate reading that stops on a bad page says: a data node read directly that
sends a malformed page did it (its leaves from there on count as withheld, exit 10), while one
read through a forwarder, or a reading that broke off, accuses nobody (exit 11) (real hosts on
loopback)."""

from __future__ import annotations

import trio

from gwtf.contracts.encoding import CertRef, ledger_domain
from gwtf.node.audit.checks import UNCHECKED, UNVERIFIED, WITHHELD
from gwtf.node.audit.runner import (
    read_certificate_directly,
    read_certificate_over,
    reading_findings,
)
from gwtf.node.cli.audit import EXIT_FINDINGS, EXIT_INCOMPLETE, exit_code_of
from gwtf.node.p2p.forwarding import forwarded_limits
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.receipts.serving import RECEIPTS_PROTOCOL, RECEIPTS_VIA_PROTOCOL, _limits
from tests.p2p.test_host_stop import run_bounded

TIMEOUT_S = 0.5
CERT = CertRef(1, 0, "0x" + "11" * 20, b"\x01" * 32, 3, 300, b"\x02" * 32)
CERT_DOMAIN = ledger_domain(1337, "0x" + "22" * 20)


async def _malformed(_peer: str, _request: bytes) -> bytes:
    return b"no receipt page"


async def _stalled(_peer: str, _request: bytes) -> bytes:
    await trio.sleep(100 * TIMEOUT_S)
    return b""


def test_a_malformed_page_read_directly_accuses_its_data_node_and_forwarded_nobody() -> None:
    results = {}

    async def main() -> None:
        async with (
            running_host(new_identity()) as bad,
            running_host(new_identity()) as silent,
            running_host(new_identity()) as forwarder,
            running_host(new_identity()) as auditor,
        ):
            RequestResponse(bad).serve(
                RECEIPTS_PROTOCOL, _malformed, _limits(TIMEOUT_S), PublicRate()
            )
            RequestResponse(silent).serve(
                RECEIPTS_PROTOCOL, _stalled, _limits(TIMEOUT_S), PublicRate()
            )
            inner = _limits(TIMEOUT_S)
            limits = forwarded_limits(inner.max_request_bytes, inner.max_response_bytes, TIMEOUT_S)
            RequestResponse(forwarder).serve(
                RECEIPTS_VIA_PROTOCOL, _malformed, limits, PublicRate()
            )
            rpc = RequestResponse(auditor)
            for host in (bad, silent, forwarder):
                await rpc.dialer.connect(host.get_id(), host.get_addrs())
            for name, host in (("malformed", bad), ("silent", silent)):
                fetched, malformed = await read_certificate_directly(
                    rpc, CERT, str(host.get_id()), TIMEOUT_S
                )
                results[name] = reading_findings(CERT, fetched, 0, "", False, malformed)
            via = str(forwarder.get_id())
            fetched, _, _ = await read_certificate_over(
                rpc, CERT, str(bad.get_id()), [via], CERT_DOMAIN, TIMEOUT_S
            )
            results["forwarded"] = reading_findings(CERT, fetched, 0, via, True, False)

    run_bounded(main)
    findings, complete = results["malformed"]
    assert complete and [f.kind for f in findings] == [WITHHELD], findings
    assert findings[0].accused == CERT.dataNode
    assert exit_code_of(findings) == EXIT_FINDINGS
    findings, complete = results["silent"]
    assert not complete and [f.kind for f in findings] == [UNCHECKED], findings
    assert exit_code_of(findings) == EXIT_INCOMPLETE
    findings, complete = results["forwarded"]
    assert not complete and [(f.kind, f.accused) for f in findings] == [(UNVERIFIED, "")]
    assert exit_code_of(findings) == EXIT_INCOMPLETE
