"""What a hop's records cost the data plane to build, against the receipt they feed.

A relay builds, for each hop it sends or receives, the hop's facts from its header
(``exchange.sent_hop`` / ``kept_hop``), with receipts on the receipt from those facts
(``HopFacts.receipt``), and for each hop acknowledged the record its tally counts
(``HopRecord``). Each is timed here (best of ``--repeats`` rounds of ``--number`` calls, in
nanoseconds) against building the same ``HopReceipt`` directly from its field values.

Usage: python bench/hop_facts.py [--number 20000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

from eth_utils.crypto import keccak

from gwtf.contracts.encoding import FORWARD, HopReceipt, ledger_domain
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.receipts.book import ReceiptTerms, address_of_peer
from gwtf.node.runtime.dataplane.exchange import HopRecord, kept_hop, sent_hop
from gwtf.node.runtime.dataplane.hop import FLAG_REPAIR, HopHeader

TERMS = ReceiptTerms(1, ledger_domain(31337, "0x" + "ab" * 20), 2, 10)
PEERS = {n: str(peer_id_of(identity_from_key(keccak(text=f"bench hop {n}")))) for n in "dab"}
HEADER = HopHeader(1, 3, 7, 0, FORWARD, 2, 0, 0, PEERS["d"], (PEERS["d"], PEERS["a"]), epoch=0)
IN, OUT = keccak(b"in"), keccak(b"out")


def direct_receipt() -> HopReceipt:
    return HopReceipt(
        runId=1, epoch=0, dataNode=address_of_peer(PEERS["d"]), iteration=3, microbatchId=7,
        stage=1, direction=FORWARD, attempt=0, worker=address_of_peer(PEERS["a"]),
        counterparty=address_of_peer(PEERS["b"]), inputDigest=IN, outputDigest=OUT, units=10,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    facts = sent_hop(HEADER, PEERS["a"], PEERS["b"], IN, OUT)
    assert facts.receipt(TERMS) == direct_receipt(), "the bench builds the receipt it times"
    ops: dict[str, Callable[[], object]] = {
        "HopReceipt, directly (baseline)": direct_receipt,
        "sent_hop: facts from a header": lambda: sent_hop(HEADER, PEERS["a"], PEERS["b"], IN, OUT),
        "kept_hop: facts from a header": lambda: kept_hop(HEADER, PEERS["a"], PEERS["b"], IN, OUT),
        "HopFacts.receipt": lambda: facts.receipt(TERMS),
        "HopRecord of an acknowledged hop": lambda: HopRecord(
            sent_hop(HEADER, PEERS["a"], PEERS["b"], IN, OUT),
            repair=bool(HEADER.flags & FLAG_REPAIR),
        ),
    }
    timed = {
        name: min(timeit.repeat(op, number=args.number, repeat=args.repeats)) / args.number
        for name, op in ops.items()
    }
    baseline = timed["HopReceipt, directly (baseline)"]
    print("| build | ns | vs HopReceipt |\n|---|---|---|")
    for name, seconds in timed.items():
        print(f"| {name} | {seconds * 1e9:,.0f} | {seconds / baseline:.2f} |")


if __name__ == "__main__":
    main()
