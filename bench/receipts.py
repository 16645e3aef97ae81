"""What receipts cost a node: signing and checking per hop, the database's write rate, a data
node's certificate tree, and memory over a long run — each against its goal, in one run.

1. Per hop (``ReceiptBook``, in process): the worker signs, the receiver checks the signature
   and countersigns, the worker checks the countersignature; both commit to their SQLite
   databases (the receiver the whole receipt, the worker its signature, then the
   countersignature). Microseconds
   of CPU per hop, against the 16 x 64-token microbatch's stage compute (forward + backward,
   measured here) that each hop carries.
2. Database writes: receipts committed per second, batched (``HopStore.sign_once``, 1,000 per
   transaction, SQLite WAL on one core; goal >= 20,000/s).
3. A data node's epoch: each receipt checked and prepared as it is reported, then at the
   epoch's end the certifiable ones chosen (``certify.certifiable``) and the tree and root of
   100,000 receipts built (goal <= 2 s for the tree).
4. Memory: the process's resident memory after 1,000 and after 10,000 hops through the receipt
   path (goal: within 10 %): receipts live in the database, not in memory.
5. Batches: what a batch of ``--batch`` hops costs both ends through the node's batched path
   (``gwtf.node.receipts.batching``: each end commits its receipts unsigned, ``IN_FLIGHT`` a
   transaction as its writer groups them; the worker closes, the receiver rebuilds the root,
   checks and countersigns, the worker checks; one commit per batch per end), and with the
   bare primitives (``batched_us``), against the per-hop path of 1. measured in the same run.

Usage: python bench/receipts.py [--hops 10000] [--tree 100000] [--batch 64]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import torch
import trio
from eth_utils.crypto import keccak

from gwtf.contracts.batches import batch_of
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
from gwtf.node.receipts.book import HopFacts, ReceiptBook, ReceiptTerms, address_of_peer
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


def hop_path(folder: Path, checkpoints: tuple[int, ...]) -> tuple[float, dict[int, float]]:
    """CPU microseconds per hop through signing, checking and countersigning (both ends, their
    database threads included), and the resident memory at each checkpoint."""
    books = [
        ReceiptBook(TERMS, KEYS[n], HopStore(open_database(f"sqlite:///{folder / n}.sqlite")))
        for n in ("a", "b")
    ]
    worker, receiver = books
    memory: dict[int, float] = {}
    cpu_s = [0.0]

    async def one(i: int) -> None:
        receipt = worker.receipt(facts(i))
        signature = await worker.sign(receipt)
        assert signature is not None
        counter = await receiver.countersign(PEERS["a"], PEERS["data"], receipt, signature)
        worker.acknowledged(PEERS["b"], PEERS["data"], receipt, signature, counter)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for book in books:
                nursery.start_soon(book.run)
            started = time.process_time()
            done = 0
            for checkpoint in checkpoints:
                while done < checkpoint:
                    upto = min(done + IN_FLIGHT, checkpoint)
                    async with trio.open_nursery() as batch:
                        for i in range(done, upto):
                            batch.start_soon(one, i)
                    done = upto
                while worker.counts.completed < checkpoint:  # the worker's last commit, behind
                    await trio.sleep(0.001)
                gc.collect()
                memory[checkpoint] = rss_mib()
            cpu_s[0] = time.process_time() - started
            nursery.cancel_scope.cancel()

    trio.run(main)
    return 1e6 * cpu_s[0] / checkpoints[-1], memory


def batched_us(folder: Path, hops: int, size: int) -> float:
    """CPU microseconds per hop of what a batch of ``size`` hops costs both ends, in one thread
    with the real primitives (the node signs batches of one; this is the price of larger ones):
    each end builds its receipts, their digests and the batch's tree (``batches.batch_of``); the
    worker commits its receipts in one transaction and signs the root; the receiver checks that
    signature over the root it built, commits its receipts in one transaction and countersigns;
    the worker checks the countersignature and commits it in one transaction."""
    stores = {n: HopStore(open_database(f"sqlite:///{folder / n}-batched.sqlite")) for n in "ab"}
    a, b = (address_of_peer(PEERS[n]) for n in "ab")
    started = time.process_time()
    for first in range(0, hops, size):
        mine = [facts(i).receipt(TERMS) for i in range(first, first + size)]
        batch, tree = batch_of(mine, DOMAIN)
        signed = batch.digest(DOMAIN)
        signature = sign(signed, KEYS["a"])
        stores["a"].sign_once(
            [ToSign(r.hop_key, r, tree.leaf(i), lambda s=signature: s) for i, r in enumerate(mine)]
        )
        theirs = [facts(i).receipt(TERMS) for i in range(first, first + size)]
        their_batch, their_tree = batch_of(theirs, DOMAIN)
        checked = their_batch.digest(DOMAIN)
        assert recover_digest_signer(checked, signature) == a
        counter = sign(checked, KEYS["b"])
        stores["b"].countersign_once(
            [
                ToSign(r.hop_key, r, their_tree.leaf(i), lambda c=counter: c, signature)
                for i, r in enumerate(theirs)
            ]
        )
        assert recover_digest_signer(signed, counter) == b
        stores["a"].add_countersignatures([(r.hop_key, counter) for r in mine])
    return 1e6 * (time.process_time() - started) / (len(range(0, hops, size)) * size)


def batch_book_us(folder: Path, hops: int, size: int) -> float:
    """CPU microseconds per hop through the node's batched path (``BatchBook``), both ends:
    each builds its receipts from the hop's facts and commits them, ``IN_FLIGHT`` a
    transaction; every ``size`` hops the worker closes the batch, the close request is encoded
    and decoded, the receiver countersigns it and the worker keeps the countersignature."""
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
    return 1e6 * (time.process_time() - started) / hops


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
    parser.add_argument("--batch", type=int, default=64, help="hops per batch (batched rows)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        small = max(1, args.hops // 10)
        per_hop_us, memory = hop_path(folder, (small, args.hops))
        compute_us = stage_compute_us()
        batched = batched_us(folder, args.hops, args.batch)
        booked = batch_book_us(folder, args.hops, args.batch)
        rate = write_rate(folder, 20_000)
        prepare_us, chose_s, built_s = epoch_of(args.tree)
    rows = [
        ("receipt path per hop, both ends (CPU us)", f"{per_hop_us:.0f}", ""),
        ("  a relay stage forward + backward, 16 x 64 tokens (CPU us)", f"{compute_us:.0f}", ""),
        ("  receipts / compute of the hop", f"{per_hop_us / compute_us:.3f}", "<= 0.02"),
        (
            f"batched path, {args.batch} hops a batch, per hop, both ends (CPU us)",
            f"{booked:.0f}",
            "",
        ),
        ("  / the receipt path per hop (baseline above)", f"{booked / per_hop_us:.3f}", ""),
        ("  / compute of the hop", f"{booked / compute_us:.4f}", "<= 0.02"),
        (
            f"a batch of {args.batch}'s bare primitives per hop, both ends (CPU us)",
            f"{batched:.0f}",
            "",
        ),
        ("  / the receipt path per hop (baseline above)", f"{batched / per_hop_us:.3f}", ""),
        ("  / compute of the hop", f"{batched / compute_us:.4f}", "<= 0.02"),
        ("database writes, batched, SQLite (receipts/s)", f"{rate:.0f}", ">= 20000"),
        ("a reported receipt's hashes, computed as it comes (us)", f"{prepare_us:.0f}", ""),
        (f"choosing the certifiable of {args.tree:,} receipts (s)", f"{chose_s:.2f}", ""),
        (f"certificate tree and root of {args.tree:,} receipts (s)", f"{built_s:.2f}", "<= 2"),
        (
            f"resident memory after {small:,} / {args.hops:,} hops (MiB)",
            f"{memory[small]:.0f} / {memory[args.hops]:.0f}",
            f"ratio {memory[args.hops] / memory[small]:.3f} <= 1.1",
        ),
    ]
    print(f"{'measure':<62}{'value':>14}  goal")
    for label, value, goal in rows:
        print(f"{label:<62}{value:>14}  {goal}")


if __name__ == "__main__":
    main()
