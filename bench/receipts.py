"""What receipts cost a node: the batched path the live node runs against signing each hop on
its own, the database's write rate, a data node's certificate tree, and memory over a long run
— each against its goal, in one run.

1. Per hop, the baseline (``per_hop_us``): each hop's receipt signed on its own with the same
   keys and primitives — the worker signs its digest and commits it, the receiver rebuilds the
   receipt, recovers the signer, countersigns and commits both signatures, the worker recovers
   the countersignature and commits it (``HopStore``, ``IN_FLIGHT`` hops a transaction at each
   step, in one thread).
2. The batched path (``batch_book_us``, ``gwtf.node.receipts.batching``): both ends commit each
   hop's receipt unsigned, ``IN_FLIGHT`` a transaction; every ``--batch`` hops the worker closes
   and signs the root, the close request is encoded and decoded, the receiver rebuilds the root
   from its own rows, checks, commits and countersigns, the worker checks and keeps it (in one
   thread: a node adds its writer threads' trio round trips). Microseconds of CPU per hop, both
   ends, against 1. and against the 16 x 64-token microbatch's stage compute (forward +
   backward, measured here) that each hop carries.
3. Database writes: receipts committed per second, batched (``HopStore.sign_once``, 1,000 per
   transaction, SQLite WAL on one core; goal >= 20,000/s).
4. A data node's epoch: each receipt checked and prepared as it is reported, then at the
   epoch's end the certifiable ones chosen (``certify.certifiable``) and the tree and root of
   100,000 receipts built (goal <= 2 s for the tree).
5. Memory: the process's resident memory after a tenth and after all of ``--hops`` hops
   through the batched path (goal: within 10 %): receipts live in the database, not in memory.

Usage: python bench/receipts.py [--hops 10000] [--tree 100000] [--batch 256]
"""

from __future__ import annotations

import argparse
import functools
import gc
import tempfile
import time
from pathlib import Path

import torch
from eth_utils.crypto import keccak

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt, tree_of_prepared
from gwtf.contracts.encoding import (
    BACKWARD,
    FORWARD,
    HopReceipt,
    hop_key,
    ledger_domain,
    receipt_digest,
    recover_digest_signer,
)
from gwtf.contracts.encoding import sign_digest as sign
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.receipts.batching import BatchBook, BatchSettings, CloseRequest
from gwtf.node.receipts.book import HopFacts, ReceiptTerms, address_of_peer
from gwtf.node.receipts.certify import Anchor, certifiable
from gwtf.node.store.batches import BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore, ToSign
from gwtf.node.training.config import named_config
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

DOMAIN = ledger_domain(31337, "0x" + "ab" * 20)
TERMS = ReceiptTerms(1, DOMAIN, 2, 10)
KEYS = {name: keccak(text=f"bench receipts {name}") for name in ("data", "a", "b")}
PEERS = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}
IN_FLIGHT = 16  # hops through the receipt path at once, as a relay's queue holds them


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmRSS in /proc/self/status")


def facts(i: int) -> HopFacts:
    return HopFacts(
        epoch=0, data_node=PEERS["data"], iteration=i // 64, microbatch_id=i, stage=1,
        direction=FORWARD, attempt=0, worker=PEERS["a"], counterparty=PEERS["b"],
        input_digest=keccak(i.to_bytes(8, "big")),
        output_digest=keccak(b"out" + i.to_bytes(8, "big")),
    )  # fmt: skip


def per_hop_us(folder: Path, hops: int) -> float:
    """CPU microseconds per hop, both ends, of each hop's receipt signed on its own (the
    baseline): see the module's text, 1."""
    stores = {n: HopStore(open_database(f"sqlite:///{folder / n}-per-hop.sqlite")) for n in "ab"}
    a, b = (address_of_peer(PEERS[n]) for n in "ab")
    started = time.process_time()
    for first in range(0, hops, IN_FLIGHT):
        chunk = range(first, min(first + IN_FLIGHT, hops))
        mine = [facts(i).receipt(TERMS) for i in chunk]
        digests = [receipt_digest(r, DOMAIN) for r in mine]
        signatures = [sign(d, KEYS["a"]) for d in digests]
        stores["a"].sign_once(
            [
                ToSign(hop_key(r), r, d, functools.partial(bytes, s))
                for r, d, s in zip(mine, digests, signatures, strict=True)
            ]
        )
        theirs = [facts(i).receipt(TERMS) for i in chunk]
        checked = [receipt_digest(r, DOMAIN) for r in theirs]
        assert all(
            recover_digest_signer(d, s) == a for d, s in zip(checked, signatures, strict=True)
        )
        counters = [sign(d, KEYS["b"]) for d in checked]
        stores["b"].countersign_once(
            [
                ToSign(hop_key(r), r, d, functools.partial(bytes, c), s)
                for r, d, c, s in zip(theirs, checked, counters, signatures, strict=True)
            ]
        )
        assert all(recover_digest_signer(d, c) == b for d, c in zip(digests, counters, strict=True))
        stores["a"].add_countersignatures(
            [(hop_key(r), c) for r, c in zip(mine, counters, strict=True)]
        )
    return 1e6 * (time.process_time() - started) / hops


def batch_book_us(
    folder: Path, hops: int, size: int, checkpoints: tuple[int, ...] = ()
) -> tuple[float, dict[int, float]]:
    """CPU microseconds per hop through the node's batched path (``BatchBook``), both ends:
    each builds its receipts from the hop's facts and commits them, ``IN_FLIGHT`` a
    transaction; every ``size`` hops the worker closes the batch, the close request is encoded
    and decoded, the receiver countersigns it and the worker keeps the countersignature. With
    the resident memory (MiB) after each of ``checkpoints`` hops."""
    books = {
        n: BatchBook(
            DOMAIN,
            KEYS[n],
            BatchStore(open_database(f"sqlite:///{folder / n}-book.sqlite"), DOMAIN),
            BatchSettings(max_hops=size),
        )
        for n in "ab"
    }
    worker, receiver = books["a"], books["b"]
    b = address_of_peer(PEERS["b"])
    memory: dict[int, float] = {}
    started = time.process_time()
    for first in range(0, hops, IN_FLIGHT):
        now = time.monotonic()
        chunk = range(first, min(first + IN_FLIGHT, hops))
        worker.record([facts(i).receipt(TERMS) for i in chunk], now, worker.address)
        receiver.record([facts(i).receipt(TERMS) for i in chunk], now, worker.address)
        for run_id, epoch, to in worker.due(now, iteration_end=chunk[-1] == hops - 1):
            request = worker.close(run_id, epoch, to, now)
            assert request is not None and to == b
            answer = receiver.countersign(CloseRequest.decode(request.encode()), worker.address)
            assert worker.answered(request, PEERS["b"], answer, "")
        if chunk[-1] + 1 in checkpoints:
            cpu = time.process_time()
            gc.collect()
            memory[chunk[-1] + 1] = rss_mib()
            started += time.process_time() - cpu  # not the hops' cost
    return 1e6 * (time.process_time() - started) / hops, memory


def stage_compute_us() -> float:
    """A relay's forward + backward of one 16 x 64-token microbatch (gpt-tiny, stage 1 of 2)."""
    torch.set_num_threads(1)
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    worker = StageWorker(plan, 0, TrainingSettings(device="cpu"), 0, replica_id="bench")
    x = torch.randn(16, 64, plan.config.d_model)
    rounds = 10
    started = time.process_time()
    for m in range(rounds):
        out = worker.forward(m, x)
        worker.backward(m, torch.ones_like(out))
    return 1e6 * (time.process_time() - started) / rounds


def write_rate(folder: Path, count: int) -> float:
    """Receipts per second into ``HopStore.sign_once``, 1,000 per transaction."""
    store = HopStore(open_database(f"sqlite:///{folder / 'rate'}.sqlite"))
    signature = sign(keccak(b"x"), KEYS["a"])
    data, a, b = (address_of_peer(PEERS[n]) for n in ("data", "a", "b"))
    batch = []
    for i in range(count):
        receipt = HopReceipt(1, 0, data, 0, i, 1, 0, 0, a, b, keccak(b"i"), keccak(b"o"), 10)
        key, digest = hop_key(receipt), receipt_digest(receipt, DOMAIN)
        batch.append(ToSign(key, receipt, digest, lambda: signature))
    started = time.perf_counter()
    for start in range(0, count, 1000):
        store.sign_once(batch[start : start + 1000])
    return count / (time.perf_counter() - started)


def epoch_of(count: int) -> tuple[float, float, float]:
    """(µs to prepare one receipt as it is reported, seconds to choose the certifiable ones,
    seconds to build the tree) for ``count`` receipts of microbatches through two stages,
    every digest chained."""
    relay, data = (address_of_peer(PEERS[n]) for n in ("a", "data"))
    signature = sign(keccak(b"x"), KEYS["a"])
    entries, anchors = [], []
    links = ((1, FORWARD, 0, 1), (2, FORWARD, 1, 2), (2, BACKWARD, 3, 4), (1, BACKWARD, 4, 5))
    for m in range(count // 4):
        digests = [keccak(f"{m} {i}".encode()) for i in range(6)]
        anchors += [Anchor(0, m, FORWARD, digests[0]), Anchor(0, m, BACKWARD, digests[3])]
        for stage, direction, i, o in links:
            units = 10 if direction == FORWARD else 20
            receipt = HopReceipt(
                1, 0, data, 0, m, stage, direction, 0, relay, data, digests[i], digests[o], units
            )
            entries.append(SignedReceipt(receipt, signature, signature))
    started = time.perf_counter()
    prepared = [PreparedHop.of(e, DOMAIN) for e in entries]
    prepare_us = 1e6 * (time.perf_counter() - started) / len(entries)
    started = time.perf_counter()
    chosen = certifiable(prepared, anchors, stages=2)
    chose_s = time.perf_counter() - started
    started = time.perf_counter()
    tree = tree_of_prepared(chosen)
    built_s = time.perf_counter() - started
    assert tree.count == len(entries)
    return prepare_us, chose_s, built_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=10_000)
    parser.add_argument("--tree", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256, help="hops per batch")
    args = parser.parse_args()
    small = max(IN_FLIGHT, args.hops // 10 // IN_FLIGHT * IN_FLIGHT)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        compute_us = stage_compute_us()
        per_hop = per_hop_us(folder, args.hops)
        booked, memory = batch_book_us(folder, args.hops, args.batch, (small, args.hops))
        rate = write_rate(folder, 20_000)
        prepare_us, chose_s, built_s = epoch_of(args.tree)
    rows = [
        ("each hop signed on its own, both ends (CPU us, baseline)", f"{per_hop:.0f}", ""),
        ("  a relay stage forward + backward, 16 x 64 tokens (CPU us)", f"{compute_us:.0f}", ""),
        ("  / compute of the hop", f"{per_hop / compute_us:.4f}", ""),
        (
            f"batched path, {args.batch} hops a batch, per hop, both ends (CPU us)",
            f"{booked:.0f}",
            "",
        ),
        ("  / each hop signed on its own (baseline above)", f"{booked / per_hop:.3f}", ""),
        ("  / compute of the hop", f"{booked / compute_us:.4f}", "<= 0.02"),
        ("database writes, batched, SQLite (receipts/s)", f"{rate:.0f}", ">= 20000"),
        ("a reported receipt's hashes, computed as it comes (us)", f"{prepare_us:.0f}", ""),
        (f"choosing the certifiable of {args.tree:,} receipts (s)", f"{chose_s:.2f}", ""),
        (f"certificate tree and root of {args.tree:,} receipts (s)", f"{built_s:.2f}", "<= 2"),
        (
            f"resident memory after {small:,} / {args.hops:,} hops, batched (MiB)",
            f"{memory[small]:.0f} / {memory[args.hops]:.0f}",
            f"ratio {memory[args.hops] / memory[small]:.3f} <= 1.1",
        ),
    ]
    print(f"{'measure':<62}{'value':>14}  goal")
    for label, value, goal in rows:
        print(f"{label:<62}{value:>14}  {goal}")


if __name__ == "__main__":
    main()
