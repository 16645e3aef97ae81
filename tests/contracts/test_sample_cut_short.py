"""The re-execution sample cannot be cut short: it is drawn over the leaf indices the data node
committed on chain (its leaf count and its workers' spans), one in each relay's span, so a data
node that breaks off a direct reading of its certificate where its colluding relay's span
starts drops nothing from the sample. Each sampled leaf the reading lacks is asked for on its
own: served, the colluder's hop is re-executed and its wrong tensor found; answered without
them, that is a finding naming the data node, while the other relay's sampled hop is still
re-executed.
The test chain over JSON-RPC, real libp2p hosts, real stage computations (``gwtf-node audit
--sample``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from gwtf.contracts.certificate_tree import CertificateTree
from gwtf.node.audit.checks import UNCHECKED, WITHHELD
from gwtf.node.cli.audit import EXIT_FINDINGS
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.serving import _REQUEST as _RECEIPTS_REQUEST
from gwtf.node.receipts.serving import CERTIFIED, ReceiptServer
from gwtf.node.receipts.wire import ReceiptPage, encode_page
from gwtf.node.store.database import open_database
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.store.hops import HopStore
from tests.contracts.conftest import Staffed
from tests.contracts.test_audit_command import devnet_file, serving_data_node  # noqa: F401
from tests.contracts.test_reexecution_audit import audit_json, computed_hops
from tests.contracts.world import STAGES, UNITS_PER_HOP, NodeKey
from tests.served import served_in_a_thread

TIMEOUT_S = 3


@dataclass
class CuttingServer(ReceiptServer):
    """A data node that stalls every request of its certificate that reaches into ``cut``
    (its colluder's span) and asks more leaves than it holds: a reading breaks off there. With
    ``single_too`` it answers the requests of the colluder's leaves asked on their own with an
    empty page, as if the certificate held no such leaves: withheld, in its own answer."""

    cut: range = range(0)
    single_too: bool = False

    async def _answer(self, peer: str, request: bytes) -> bytes:
        _, _, which, offset, size = _RECEIPTS_REQUEST.unpack(request)
        reaches = offset < self.cut.stop and self.cut.start < offset + size
        if which == CERTIFIED and reaches and size > len(self.cut):
            await trio.sleep_forever()
        if which == CERTIFIED and reaches and self.single_too:
            tree = self.trees(0)
            assert tree is not None
            return encode_page(ReceiptPage(tree.count, offset, ()))
        return await super()._answer(peer, request)


@contextmanager
def cutting_data_node(
    s: Staffed, tree: CertificateTree, db: Path, cut: range, single_too: bool
) -> Iterator[str]:
    terms = ReceiptTerms(s.run, s.w.ledger_domain, STAGES, UNITS_PER_HOP)
    store = HopStore(open_database(f"sqlite:///{db}"))
    server = CuttingServer(store, terms, {0: tree}.get, None, cut, single_too)

    @asynccontextmanager
    async def hosts() -> AsyncIterator[str]:
        async with running_host(identity_from_key(s.data.private_key)) as host:
            server.serve(RequestResponse(host), timeout_s=5.0)
            yield full_address(host)

    with served_in_a_thread(hosts) as address:
        yield address


def span_of(tree: CertificateTree, worker: NodeKey) -> range:
    indices = [i for i, e in enumerate(tree.entries) if e and e.receipt.worker == worker.address]
    return range(min(indices), max(indices) + 1)


def audit_cut(
    s: Staffed, devnet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], single: bool
) -> tuple[int, dict[str, Any]]:
    """a (its first hop's output off) colludes with the data node, which cuts its reading at
    a's span; c is honest. The audit samples 3 hops."""
    w = s.w
    entries, made = computed_hops(s, tmp_path)
    tree = w.certificate_tree(entries)
    w.certify(tree, s.run, 0, s.data)
    archives: dict[str, EvidenceArchive] = made["archives"]
    cut = span_of(tree, s.a)
    serving = [
        cutting_data_node(s, tree, tmp_path / "data.sqlite", cut, single),
        serving_data_node(s, s.a, None, tmp_path / "a.sqlite", evidence=archives[s.a.address]),
        serving_data_node(s, s.c, None, tmp_path / "c.sqlite", evidence=archives[s.c.address]),
    ]
    w.travel_to(w.epoch_times(s.run, 0)[2] + 1)
    w.mine()
    with serving[0] as data, serving[1] as a, serving[2] as c:
        return audit_json(capsys, devnet, s.run, [data, a, c], 3, str(TIMEOUT_S))


@pytest.mark.slow  # ~40 s: real stage computations, an audit re-executing them
def test_a_reading_cut_at_the_colluders_span_still_samples_and_convicts_it(
    staffed: Staffed,
    devnet_file: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = staffed
    code, report = audit_cut(s, devnet_file, tmp_path, capsys, single=False)
    assert code == EXIT_FINDINGS, report
    (certificate,) = report["certificates"]
    replayed = {r["microbatch"]: r for r in certificate["replayed"]}
    assert sorted(replayed) == [0, 1, 2]  # every leaf, the colluder's included
    assert replayed[0]["wrong"] and not replayed[1]["wrong"] and not replayed[2]["wrong"]
    kinds = {(f["kind"], f["accused"]) for f in certificate["findings"]}
    assert ("wrong tensor", s.a.address) in kinds
    assert (UNCHECKED, s.data.address) in kinds  # the reading itself broke off


@pytest.mark.slow  # ~60 s: as above, and the withheld leaves asked in rounds
def test_sampled_leaves_the_data_node_withholds_name_it_and_the_rest_is_checked(
    staffed: Staffed,
    devnet_file: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = staffed
    code, report = audit_cut(s, devnet_file, tmp_path, capsys, single=True)
    assert code == EXIT_FINDINGS, report
    (certificate,) = report["certificates"]
    withheld = [f for f in certificate["findings"] if f["kind"] == WITHHELD]
    (finding,) = withheld
    assert finding["accused"] == s.data.address and "sampled leaves" in finding["detail"]
    # c's sampled hop is still re-executed, and found right.
    (replayed,) = certificate["replayed"]
    assert replayed["worker"] == s.c.address and replayed["wrong"] is False
