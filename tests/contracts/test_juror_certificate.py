"""A data node answers the seated jurors of a case about any node of its run outside the rate
all outsiders share, on its certificate (what a juror checks a hop's leaf and its replicas
against), as a relay does on its own evidence: whoever floods the data node's outsider rate
through a jury's window cannot keep its certificate from the jurors. Its court reader is the
run's (``CourtSeats(contracts, None, run)``: the accused is a relay of its run, or itself).
A real eth-tester court with a drawn jury (a case about relay c), real libp2p hosts on
loopback, the data node serving its certificate of epoch 0 while a fresh peer id floods it.

The reader's busy retries are cut to one (the real schedule backs off for minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf.node.audit.runner import read_certificate_directly, verified_leaves
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.chain.seats import CourtSeats
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key, new_identity
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.receipts import serving
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.serving import CERTIFIED, RECEIPTS_PROTOCOL, ReceiptServer
from gwtf.node.receipts.wire import MAX_PAGE
from gwtf.node.store.batches import BatchStore
from gwtf.node.store.database import open_database
from tests.contracts.conftest import Staffed
from tests.contracts.test_dispute_graces import suite_of
from tests.contracts.test_juror_seats import FLOODED, TIMEOUT_S, _flood, drawn_case
from tests.contracts.world import STAGES, UNITS_PER_HOP, NodeKey


def certificate_read_under_flood(
    s: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, seated: bool, juror: str
) -> tuple[int, int, str | None]:
    """The data node's certificate of epoch 0 read directly by a juror (``juror``: "sitting",
    dialling with a seated juror's node key, or "idle", with a juror's that holds no seat)
    while a fresh peer id floods the data node's outsider rate; ``seated``: the data node
    reads its run's seated jurors from the court. (leaves on chain, leaves read that verify
    against the root on chain, why the reading stopped)."""
    monkeypatch.setattr(serving, "MAX_BUSY_RETRIES", 1)
    case = drawn_case(s, tmp_path)
    contracts = suite_of(s.w)
    (cert,) = EpochLedger(contracts, s.run, None).certificates(0)
    terms = ReceiptTerms(s.run, s.w.ledger_domain, STAGES, UNITS_PER_HOP)
    store = BatchStore(open_database(f"sqlite:///{tmp_path / 'data.sqlite'}"), terms.domain)
    trees = {0: case["tree"]}
    key: NodeKey = case[juror][0].key
    # The live node's wiring: the run's court reader, the one its forwarders read too.
    seats = CourtSeats(contracts, None, s.run) if seated else None
    page = serving._REQUEST.pack(s.run, 0, CERTIFIED, 0, MAX_PAGE)

    async def outsiders_only(_peer: str) -> bool:
        return False

    async def main() -> tuple[int, int, str | None]:
        with trio.fail_after(120):
            return await read()

    async def read() -> tuple[int, int, str | None]:
        async with (
            running_host(identity_from_key(s.data.private_key)) as host,
            running_host(identity_from_key(key.private_key)) as reader,
            running_host(new_identity()) as flooder,
            trio.open_nursery() as nursery,
        ):
            rpc = RequestResponse(host, admit=outsiders_only)
            rate = PublicRate(*FLOODED, seats=seats)
            ReceiptServer(store, terms, trees.get).serve(rpc, TIMEOUT_S, rate)
            address = full_address(host)
            for _ in range(4):
                nursery.start_soon(_flood, RequestResponse(flooder), address, RECEIPTS_PROTOCOL,
                                   page)  # fmt: skip
            await trio.sleep(0.5)  # the flood has the shared budget
            juror_rpc = RequestResponse(reader)
            await juror_rpc.dialer.connect(host.get_id(), host.get_addrs())
            fetched, _ = await read_certificate_directly(
                juror_rpc, cert, str(host.get_id()), TIMEOUT_S
            )
            nursery.cancel_scope.cancel()
        verified = await trio.to_thread.run_sync(verified_leaves, cert, fetched, s.w.ledger_domain)
        return cert.count, len(verified), fetched.stopped

    return trio.run(main)


def test_a_seated_juror_reads_a_flooded_data_nodes_certificate_whole(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case is about relay c: the data node, another node of its run, answers c's
    seated jurors outside its outsiders' rate all the same."""
    count, verified, stopped = certificate_read_under_flood(
        staffed, tmp_path, monkeypatch, seated=True, juror="sitting"
    )
    assert stopped is None, stopped
    assert verified == count > 0


@pytest.mark.parametrize(("seated", "juror"), [(True, "idle"), (False, "sitting")])
def test_an_unseated_reader_shares_the_flooded_rate(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seated: bool, juror: str
) -> None:
    """A juror without a seat is an outsider like any other; and a data node that answers
    the seated ones within the outsiders' rate (no court reader) lets the flood keep its
    certificate from them."""
    count, verified, stopped = certificate_read_under_flood(
        staffed, tmp_path, monkeypatch, seated=seated, juror=juror
    )
    assert verified == 0 < count
    assert stopped is not None and "busy" in stopped, stopped
