"""``gwtf-node audit`` end to end: the test chain served over JSON-RPC, a data node's real libp2p
host serving its certificate to peers outside the run (the auditor is one), the command run as
a person runs it. An honest certificate passes; a certified hop of a non-member is found, marked
provable, and the command exits with ``EXIT_FINDINGS``; a data node not among the peers has its
certificate reported unchecked, accusing nobody (``EXIT_INCOMPLETE``); a data node nobody can
dial is audited in full through the relays connected to it, a reading one cuts short going on
through the next, while a forwarder that passes on leaves that do not verify is reported,
accusing nobody."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from libp2p.peer.id import ID
from libp2p.security.noise import transport as noise

from gwtf.contracts.certificate_tree import CertificateTree, LeafProof
from gwtf.node.audit.checks import UNCHECKED, UNVERIFIED, WITHHELD, Finding
from gwtf.node.audit.replays import UNREPLAYED, WEIGHTS_DIFFER, WRONG_TENSOR
from gwtf.node.chain.deployment import DevnetInfo, write_devnet_file
from gwtf.node.cli.audit import EXIT_FINDINGS, EXIT_INCOMPLETE, exit_code_of
from gwtf.node.cli.main import main
from gwtf.node.devnet.rpc import DevnetHttpServer, EthTesterRpc
from gwtf.node.p2p.dialing import PER_ADDRESS_S
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key, new_identity, node_address_of_peer
from gwtf.node.p2p.rpc import Decline, PublicRate, RequestResponse, RpcLimits
from gwtf.node.receipts import serving
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.cheats import Cheat
from gwtf.node.receipts.evidence import serve_evidence
from gwtf.node.receipts.serving import (
    _REQUEST as _RECEIPTS_REQUEST,
)
from gwtf.node.receipts.serving import (
    RECEIPTS_PROTOCOL,
    RECEIPTS_VIA_PROTOCOL,
    ReceiptServer,
    serve_receipts_forwarding,
)
from gwtf.node.receipts.wire import ReceiptPage, decode_page, encode_page
from gwtf.node.store.batches import BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.evidence import EvidenceArchive
from tests.contracts.conftest import Certified, Staffed
from tests.contracts.test_disputes import certified_with, one_hop
from tests.contracts.world import STAGES, UNITS_PER_HOP, NodeKey
from tests.served import served_in_a_thread


@pytest.fixture
def devnet_file(staffed: Staffed, tmp_path: Path) -> Iterator[Path]:
    """The test chain over JSON-RPC, and the devnet file naming its contracts."""
    w = staffed.w
    server = DevnetHttpServer(EthTesterRpc(w.tester), "127.0.0.1", 0).start_background()
    path = write_devnet_file(
        tmp_path / "devnet.json", DevnetInfo(server.url, w.w3.eth.chain_id, w.suite.addresses, ())
    )
    try:
        yield path
    finally:
        server.stop()


@contextmanager
def serving_data_node(
    s: Staffed,
    node: NodeKey,
    tree: CertificateTree | None,
    db: Path,
    cheat: Cheat | None = None,
    evidence: EvidenceArchive | None = None,
) -> Iterator[str]:
    """``node``'s host serving its receipts and ``tree`` as its certificate of epoch 0 (None: a
    relay's, no certificate) to anyone, with what ``cheat`` makes of them, and a relay's kept
    ``evidence`` (it admits no peer: an auditor is served in public); yields its address."""
    terms = ReceiptTerms(s.run, s.w.ledger_domain, STAGES, UNITS_PER_HOP)
    trees = {0: tree} if tree is not None else {}
    server = ReceiptServer(
        BatchStore(open_database(f"sqlite:///{db}"), terms.domain), terms, trees.get, cheat
    )

    async def refuse(_peer: str) -> bool:
        return False

    @asynccontextmanager
    async def hosts() -> AsyncIterator[str]:
        async with running_host(identity_from_key(node.private_key)) as host:
            rpc = RequestResponse(host, admit=refuse)
            server.serve(rpc, timeout_s=5.0)
            if evidence is not None:
                serve_evidence(rpc, evidence, s.run, timeout_s=5.0)
            yield full_address(host)

    with served_in_a_thread(hosts) as address:
        yield address


def audit(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, run: int, *peers: str
) -> tuple[int, dict[str, Any]]:
    flags = [flag for peer in peers for flag in ("--peer", peer)]
    argv = ["--devnet-file", str(devnet_file), "audit", "--run", str(run), "--epoch", "0"]
    code = main([*argv, *flags, "--timeout-s", "10", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_an_honest_certificate_passes_the_audit(
    certified: Certified, devnet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving_data_node(certified, certified.data, certified.tree, tmp_path / "d.sqlite") as at:
        code, report = audit(capsys, devnet_file, certified.run, at)
        argv = ["--devnet-file", str(devnet_file), "audit", "--run", str(certified.run)]
        assert main([*argv, "--epoch", "0", "--peer", at]) == 0  # the tables a person reads
        printed = capsys.readouterr().out
    assert "certificates" in printed and "no finding" in printed
    assert code == 0, report
    (cert,) = report["certificates"]
    assert cert["data_node"] == certified.data.address and cert["findings"] == []
    assert cert["leaves_served"] == cert["count"] == certified.tree.count
    assert report["findings"] == 0 and report["peers"] == {certified.data.address: "ok"}


def test_a_certified_hop_of_a_non_member_is_found_provable_and_fails_the_audit(
    staffed: Staffed, devnet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = staffed.w
    ghost = w.register("ghost", w.stranger)  # bonded, but never in the run
    tree, _ = certified_with(
        staffed, [one_hop(staffed), one_hop(staffed, worker_key=ghost, microbatchId=1)]
    )
    with serving_data_node(staffed, staffed.data, tree, tmp_path / "d.sqlite") as at:
        code, report = audit(capsys, devnet_file, staffed.run, at)
    assert code == EXIT_FINDINGS
    (cert,) = report["certificates"]
    (finding,) = cert["findings"]
    assert finding["kind"] == "invalid hop" and finding["provable_on_chain"]
    assert finding["fraud_proof"] == "proveInvalidHop" and "no bonded member" in finding["detail"]
    # Without the data node among the peers, its certificate cannot be checked: unchecked,
    # which accuses nobody: the audit proved nothing, and was not whole.
    code, report = audit(capsys, devnet_file, staffed.run)
    assert code == EXIT_INCOMPLETE
    (unchecked,) = report["certificates"][0]["findings"]
    assert unchecked["kind"] == "unchecked" and not unchecked["provable_on_chain"]


def test_an_unreachable_chain_is_one_line_and_the_chains_exit_code(
    staffed: Staffed, devnet_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--rpc-url", "http://127.0.0.1:9", "--devnet-file", str(devnet_file), "audit"]
    assert main([*argv, "--run", str(staffed.run), "--epoch", "0"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("gwtf-node: error:") and "\n" not in err


def test_a_data_node_slow_over_its_handshake_is_audited_within_the_audits_timeout(
    certified: Certified,
    devnet_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node busy training (or on a loaded machine) may take seconds over a connection's
    handshakes: the auditor waits for it within its ``--timeout-s`` (10 s here), not within
    the ``PER_ADDRESS_S`` a node gives each address of its neighbours."""
    secure_inbound = noise.Transport.secure_inbound

    async def slow(self: noise.Transport, conn: Any) -> Any:
        await trio.sleep(PER_ADDRESS_S + 1.0)
        return await secure_inbound(self, conn)

    monkeypatch.setattr(noise.Transport, "secure_inbound", slow)
    with serving_data_node(certified, certified.data, certified.tree, tmp_path / "d.sqlite") as at:
        code, report = audit(capsys, devnet_file, certified.run, at)
    assert report["peers"] == {certified.data.address: "ok"}
    assert code == 0 and report["certificates"][0]["findings"] == []


def picky_forwarder(host: Any, passes: Callable[[int], bool]) -> RequestResponse:
    """``host`` forwarding receipts requests honestly when ``passes`` their offset, declining
    the others (as a forwarder whose connection broke partway through a reading would)."""
    rpc = RequestResponse(host, admit=_refuse)

    async def forward(_peer: str, request: bytes) -> bytes:
        length = request[0]
        target = ID.from_base58(request[1 : 1 + length].decode())
        inner = request[1 + length :]
        if not passes(_RECEIPTS_REQUEST.unpack(inner)[3]):
            raise Decline("not forwarding that page")
        limits = RpcLimits(len(inner), 1 << 20, 5.0)
        return await rpc.request(target, RECEIPTS_PROTOCOL, inner, limits)

    rpc.serve(RECEIPTS_VIA_PROTOCOL, forward, RpcLimits(128, 1 << 20, 10.0), PublicRate())
    return rpc


async def _refuse(_peer: str) -> bool:
    return False


@contextmanager
def data_node_at_home(s: Staffed, tree: CertificateTree, db: Path) -> Iterator[dict[str, str]]:
    """``s``'s data node serving ``tree`` at an address nobody can dial (a closed port), kept
    connected by a relay that forwards receipts requests honestly and by a forwarder that
    changes the first leaf of each certificate page it passes on, by a blinder that answers
    each request with an empty page of a total of 0, by a quitter that forwards the first page
    only and by a latecomer that forwards every page but the first; yields the addresses given
    to the auditor ("data", "relay", "forger", "blinder", "quitter", "latecomer") and the node
    addresses ("relay node", "forger node", "blinder node", "quitter node", "latecomer
    node")."""
    terms = ReceiptTerms(s.run, s.w.ledger_domain, STAGES, UNITS_PER_HOP)
    server = ReceiptServer(
        BatchStore(open_database(f"sqlite:///{db}"), terms.domain), terms, {0: tree}.get
    )

    async def refuse(_peer: str) -> bool:
        return False

    @asynccontextmanager
    async def hosts() -> AsyncIterator[dict[str, str]]:
        async with (
            running_host(identity_from_key(s.data.private_key)) as data,
            running_host(new_identity()) as relay,
            running_host(new_identity()) as forger,
            running_host(new_identity()) as blinder,
            running_host(new_identity()) as quitter,
            running_host(new_identity()) as latecomer,
        ):
            server.serve(RequestResponse(data, admit=refuse), timeout_s=5.0)
            relaying = RequestResponse(relay, admit=refuse)
            serve_receipts_forwarding(relaying, 5.0)
            forging = RequestResponse(forger, admit=refuse)

            async def tamper(_peer: str, request: bytes) -> bytes:
                length = request[0]
                target = ID.from_base58(request[1 : 1 + length].decode())
                inner = request[1 + length :]
                limits = RpcLimits(len(inner), 1 << 20, 5.0)
                page = decode_page(await forging.request(target, RECEIPTS_PROTOCOL, inner, limits))
                if page.leaves:
                    first = page.leaves[0]
                    changed = LeafProof(replace(first.hop, units=first.hop.units + 1), first.proof)
                    page = replace(page, leaves=(changed, *page.leaves[1:]))
                return encode_page(page)

            limits = RpcLimits(128, 1 << 20, 10.0)
            forging.serve(RECEIPTS_VIA_PROTOCOL, tamper, limits, PublicRate())
            blinding = RequestResponse(blinder, admit=refuse)

            async def blind(_peer: str, _request: bytes) -> bytes:
                return encode_page(ReceiptPage(0, 0, ()))

            blinding.serve(RECEIPTS_VIA_PROTOCOL, blind, limits, PublicRate())
            quitting = picky_forwarder(quitter, lambda offset: offset == 0)
            coming_late = picky_forwarder(latecomer, lambda offset: offset > 0)
            for rpc in (relaying, forging, blinding, quitting, coming_late):
                # as a home node's keepalive holds them
                await rpc.dialer.connect(data.get_id(), data.get_addrs())
            yield {
                "data": f"/ip4/127.0.0.1/tcp/9/p2p/{data.get_id()}",
                "relay": full_address(relay),
                "forger": full_address(forger),
                "blinder": full_address(blinder),
                "relay node": node_address_of_peer(relay.get_id()),
                "forger node": node_address_of_peer(forger.get_id()),
                "quitter": full_address(quitter),
                "latecomer": full_address(latecomer),
                "blinder node": node_address_of_peer(blinder.get_id()),
                "quitter node": node_address_of_peer(quitter.get_id()),
                "latecomer node": node_address_of_peer(latecomer.get_id()),
            }

    with served_in_a_thread(hosts) as addresses:
        yield addresses


def test_a_data_node_nobody_dials_is_audited_in_full_through_its_relay(
    staffed: Staffed, devnet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = staffed.w
    ghost = w.register("ghost", w.stranger)  # bonded, but never in the run
    tree, _ = certified_with(
        staffed, [one_hop(staffed), one_hop(staffed, worker_key=ghost, microbatchId=1)]
    )
    with data_node_at_home(staffed, tree, tmp_path / "d.sqlite") as at:
        # The forger is asked first (the order given): its pages are set aside, the relay's read.
        code, report = audit(
            capsys, devnet_file, staffed.run, at["forger"], at["relay"], at["data"]
        )
        # A blinder asked first: its empty reading verifies, yet the relay is asked on.
        blind_code, blind = audit(
            capsys, devnet_file, staffed.run, at["blinder"], at["relay"], at["data"]
        )
        # Through the forger alone, nothing is checked and nobody accused.
        alone_code, alone = audit(capsys, devnet_file, staffed.run, at["forger"], at["data"])
    assert staffed.data.address in report["forwarded"]  # not dialled: its receipts forwarded too
    assert code == EXIT_FINDINGS
    (cert,) = report["certificates"]
    assert cert["read_through"] == at["relay node"]
    assert cert["leaves_served"] == cert["count"] == tree.count
    by_kind = {f["kind"]: f for f in cert["findings"]}
    assert set(by_kind) == {"invalid hop", "unverified"}, cert["findings"]
    invalid, forged = by_kind["invalid hop"], by_kind["unverified"]
    assert invalid["fraud_proof"] == "proveInvalidHop" and "no bonded member" in invalid["detail"]
    assert invalid["accused"] == staffed.data.address
    assert forged["accused"] == "" and not forged["provable_on_chain"]
    assert at["forger node"] in forged["detail"] and "leaf 0" in forged["detail"]
    # What is known, and no more: the data node may have served them so.
    assert "do not verify against the data node's root" in forged["detail"]
    assert "may be honest" in forged["detail"]
    assert blind_code == EXIT_FINDINGS
    (cert,) = blind["certificates"]
    assert cert["read_through"] == at["relay node"]
    assert cert["leaves_served"] == cert["count"] == tree.count
    assert {f["kind"] for f in cert["findings"]} == {"invalid hop"}, cert["findings"]
    assert alone_code == EXIT_INCOMPLETE  # nobody accused: nothing proven
    (cert,) = alone["certificates"]
    assert cert["read_through"] == "" and cert["leaves_served"] == 0
    kinds = sorted((f["kind"], f["accused"], f["provable_on_chain"]) for f in cert["findings"])
    # The forged leaves, and the reading they cut short: through a forwarder, nobody's.
    assert kinds == [("unverified", "", False), ("unverified", "", False)]


def test_a_certificate_reading_cut_short_goes_on_through_the_next_forwarder(
    certified: Certified,
    devnet_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quitter forwards the first page only, the latecomer every page but the first: the
    reading goes on through the latecomer from where the quitter stopped, each page checked
    against the root, and is whole."""
    monkeypatch.setattr(serving, "MAX_PAGE", 2)  # pages of two leaves: several per reading
    tree = certified.tree
    assert tree.count > 2
    with data_node_at_home(certified, tree, tmp_path / "d.sqlite") as at:
        code, report = audit(
            capsys, devnet_file, certified.run, at["quitter"], at["latecomer"], at["data"]
        )
    (cert,) = report["certificates"]
    assert cert["findings"] == [] and code == 0, cert
    assert cert["read_through"] == f"{at['quitter node']}, {at['latecomer node']}"
    assert cert["leaves_served"] == cert["count"] == tree.count


def test_a_forwarder_passing_on_nothing_has_the_data_node_accused_of_nothing(
    certified: Certified, devnet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blinder's empty page of a total of 0 ends its reading cleanly, with no leaf: what it
    did not pass on is not the data node's withholding."""
    with data_node_at_home(certified, certified.tree, tmp_path / "d.sqlite") as at:
        code, report = audit(capsys, devnet_file, certified.run, at["blinder"], at["data"])
    (cert,) = report["certificates"]
    assert cert["leaves_served"] == 0 and cert["read_through"] == ""
    (finding,) = cert["findings"]
    assert finding["kind"] == "unverified" and finding["accused"] == "", finding
    assert code == EXIT_INCOMPLETE


def test_an_audit_exits_with_findings_only_when_one_accuses_a_node() -> None:
    """Unchecked, unverified and unreplayed accuse nobody: alone they prove nothing."""
    nobody = [
        Finding(UNCHECKED, "0xd", "not read"),
        Finding(UNVERIFIED, "", "forwarded leaves do not verify"),
        Finding(UNREPLAYED, "", "unverifiable"),
    ]
    assert exit_code_of([]) == 0
    assert exit_code_of(nobody) == EXIT_INCOMPLETE
    for kind in (WITHHELD, WEIGHTS_DIFFER, WRONG_TENSOR):
        assert exit_code_of([*nobody, Finding(kind, "0xa", "")]) == EXIT_FINDINGS
