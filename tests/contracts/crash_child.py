"""A node's epoch cycle and receipt store in a process of its own, for the crash-point tests
(``test_crash_points.py``): it runs one step against the test's chain over JSON-RPC and its
own database, and dies by SIGKILL where ``GWTF_FAILPOINT`` says (``gwtf.node.failpoints``).

Usage: python -m tests.contracts.crash_child '<json>' where the JSON names the ``step``
(``settle``, ``claim`` or ``countersign``) and what it needs (see each function).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio

from gwtf.contracts.certificate_tree import CertificateTree, WorkerRange, build_certificate_tree
from gwtf.contracts.encoding import (
    Eip712Domain,
    HopReceipt,
    hop_key,
    ledger_domain,
    receipt_digest,
    sign_digest,
    signing_digest,
)
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import Sender, connect
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.epochs import DataNodeEpochs, EpochClock, WorkerEpochs
from gwtf.node.receipts.proofs import checked_proofs
from gwtf.node.receipts.reports import ReceiptInbox
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore, ToSign
from gwtf.node.store.ledger import KeptProof, LedgerRecords
from tests.contracts.world import STAGES, TEST_GAS_LIMIT, UNITS_PER_HOP

#: The receipts' domain where no chain is asked (the ``countersign`` step).
STORE_DOMAIN = ledger_domain(1, "0x" + "ab" * 20)


def data_node_cycle(
    terms: ReceiptTerms, address: str, db_path: Path, ledger: EpochLedger
) -> DataNodeEpochs:
    """A data node's epoch cycle on its database, with nothing in training."""
    db = open_database(f"sqlite:///{db_path}")
    store = HopStore(db)
    unused: Any = None  # the inbox only keeps trees here; nothing is served
    inbox = ReceiptInbox(unused, terms, address, store, 1.0)
    return DataNodeEpochs(
        terms, address, ledger, EpochClock(ledger), store, LedgerRecords(db), inbox, lambda e: False
    )


class LocalRangeWorker(WorkerEpochs):
    """A worker's epoch cycle that reads its range from the data node's database (the test's
    stand-in for ``/gwtf/certificate/range``: no libp2p host in this process)."""

    data_db: Path | None = None

    def _tree(self, epoch: int) -> CertificateTree:
        assert self.data_db is not None
        data = HopStore(open_database(f"sqlite:///{self.data_db}"))
        return build_certificate_tree(
            data.certified_hops(self.terms.run_id, epoch), self.terms.domain
        )

    async def fetch_range(self, epoch: int, data_node: str) -> WorkerRange | None:
        return self._tree(epoch).worker_range(self.address)

    async def fetch_proofs(
        self, epoch: int, data_node: str, root: bytes, span: WorkerRange
    ) -> list[KeptProof]:
        tree = self._tree(epoch)
        leaves = range(span.first.hop.index, span.last.hop.index + 1)
        return checked_proofs([tree.leaf_proof(i) for i in leaves], span, root)


def worker_cycle(
    terms: ReceiptTerms, address: str, db_path: Path, ledger: EpochLedger, data_db: Path
) -> LocalRangeWorker:
    """A worker's epoch cycle on its database."""
    db = open_database(f"sqlite:///{db_path}")
    unused: Any = None  # no peers: ranges come from ``data_db``
    clock = EpochClock(ledger, read=ledger.now())
    cycle = LocalRangeWorker(
        terms, address, ledger, clock, HopStore(db), LedgerRecords(db), unused, unused, 1.0
    )
    cycle.data_db = data_db
    return cycle


def received_batch(terms: ReceiptTerms, first: int, args: dict[str, Any]) -> list[ToSign]:
    """Five receipts of a's forwards to b, from microbatch ``first`` on, as b countersigns
    them (with a's signatures)."""
    worker_key, receiver_key = bytes.fromhex(args["worker_key"]), bytes.fromhex(args["key"])
    batch = []
    for m in range(first, first + 5):
        receipt = HopReceipt(
            terms.run_id, 0, args["data_node"], 0, m, 1, 0, 0, args["worker"], args["address"],
            b"\x01" * 32, m.to_bytes(32, "big"), UNITS_PER_HOP,
        )  # fmt: skip
        digest = receipt_digest(receipt, terms.domain)
        signed = signing_digest(receipt, terms.domain, (), digest)
        sign = lambda signed=signed: sign_digest(signed, receiver_key)  # noqa: E731
        batch.append(
            ToSign(hop_key(receipt), receipt, digest, sign, sign_digest(signed, worker_key))
        )
    return batch


def terms_of(args: dict[str, Any], domain: Eip712Domain) -> ReceiptTerms:
    return ReceiptTerms(args["run"], domain, STAGES, UNITS_PER_HOP)


def main(args: dict[str, Any]) -> None:
    if args["step"] == "countersign":  # no chain: three batches into b's receipt store
        terms = terms_of(args, STORE_DOMAIN)
        store = HopStore(open_database(f"sqlite:///{args['db']}"))
        for first in (0, 5, 10):
            store.countersign_once(received_batch(terms, first, args))
            print(json.dumps({"committed": first}), flush=True)
        return
    contracts = Contracts.at(connect(args["url"]), args["addresses"], gas_limit=TEST_GAS_LIMIT)
    domain = ledger_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
    terms = terms_of(args, domain)
    ledger = EpochLedger(contracts, args["run"], Sender.unlocked(args["wallet"]))
    if args["step"] == "settle":
        data_node_cycle(terms, args["address"], Path(args["db"]), ledger).settle(0)
    elif args["step"] == "claim":
        cycle = worker_cycle(
            terms, args["address"], Path(args["db"]), ledger, Path(args["data_db"])
        )
        trio.run(cycle.claim, 0, args["data_node"])
    else:
        raise SystemExit(f"unknown step {args['step']!r}")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
