"""Gas of every GWTF operation, and on-chain gas per receipt when one certificate covers N hops.

All numbers are ``gasUsed`` of real transactions on an in-process eth-tester (py-evm, Prague)
chain running the committed contracts. A data node commits one root per epoch for all the hops
it certifies, and each of the two workers of those hops claims its range of the tree once. The
baseline, measured in the same run, is a certificate of a single hop with its one claim (what
putting every hop on chain would cost); the goal is below 1 gas per receipt at N = 100,000 for
the certificate. Also timed: certifying the hops into leaves and building the tree in Python
(``gwtf.contracts.certificate_tree``). One tensor dispute runs end to end through the court (open,
answer, draw salt, draw, three jurors' commits and reveals, ruling) with its gas summed, and its
length in blocks at the deployed windows. A certificate also commits one span per worker, which
the ledger checks and hashes into a range tree on submission: certificates of W workers (one hop
each) give submitCertificates' gas per worker and a claim's against a range tree of W leaves.

    .venv/bin/python bench/gas.py [--sizes 1,10,1000,100000] [--max-signed 1000] [--sign-all]
                                  [--no-plot]

Signatures are real EIP-712 signatures. Signing is the workers' and counterparties' work during
the epoch, not part of building a tree, so beyond --max-signed hops (default 1,000) the bench
reuses the signatures it made, cyclically, unless --sign-all is given; the leaves still hash
every byte. Writes bench/out/gas_per_receipt.png.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from rich.console import Console
from rich.table import Table
from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.batches import sign_batch
from gwtf.contracts.bindings import SuiteParams, deploy_suite
from gwtf.contracts.certificate_tree import CertificateTree, SignedReceipt, tree_of_hops
from gwtf.contracts.encoding import (
    CertifiedHop,
    HopReceipt,
    certify_hop,
    ledger_domain,
    scheduled_units,
    sign_receipt,
)
from gwtf.contracts.fraud_proofs import Fraud
from gwtf.contracts.merkle import build_tree
from gwtf.node.chain.actions import (
    Capacity,
    Contracts,
    RunConfig,
    add_data_node,
    add_stake,
    award_bounty,
    claim_reward,
    commit_proof,
    deposit_juror,
    draw_salt_of,
    fund_run,
    join_run,
    open_run,
    register_node,
    request_unstake,
    reveal_proof,
    submit_certificates,
    withdraw_credit,
)
from gwtf.node.chain.adapter import Sender, advance_time, advance_time_to, connect, mine_blocks

OUT_DIR = Path(__file__).resolve().parent / "out"
ETH = 10**18
UNITS_PER_HOP = 10
#: The run's price of a forward hop: 100,000 hops of an epoch fit its 10 ETH cap at twice this.
HOP_PRICE_WEI = 10**13
STAGES = 2
#: Receipts per batch in the batched fraud proofs: a proof of six hashes in its batch.
BATCH = 64
# Fixed limit above every operation here; a revert is still caught by a simulation first.
GAS_LIMIT = 8_000_000
#: Workers of the certificate whose span a span fraud proof shows (its proofs are log2 of it).
SPAN_PROOF_WORKERS = 1_000
#: The court's windows here (gas does not depend on them); the deployed ones are SuiteParams'.
BENCH_PARAMS = SuiteParams(court_phase_blocks=20, court_draw_delay_blocks=2)
JURORS = 7


@dataclass(frozen=True)
class TreeResult:
    receipts: int
    submit_gas: int
    claim_gas: int  # both workers' claims
    sign_s: float
    signed: int
    leaves_s: float
    tree_s: float


@dataclass
class Bench:
    contracts: Contracts
    run_id: int
    sponsor: Sender
    gas: dict[str, list[int]] = field(default_factory=dict)
    wallet_of: dict[str, Sender] = field(default_factory=dict)
    #: The tensor dispute's gas, summed over its transactions, and its length in blocks.
    dispute_gas: int = 0
    dispute_blocks: int = 0
    dispute_s: float = 0.0

    def record(self, name: str, receipt: Any) -> Any:
        self.gas.setdefault(name, []).append(int(receipt["gasUsed"]))
        return receipt

    @property
    def domain(self) -> Any:
        c = self.contracts
        return ledger_domain(c.w3.eth.chain_id, c.ledger.address)


def setup(console: Console) -> Bench:
    w3 = connect(None)
    dev = [Sender.unlocked(a) for a in w3.eth.accounts]
    suite = deploy_suite(w3, dev[0].address, BENCH_PARAMS)
    contracts = Contracts.at(w3, suite.addresses, gas_limit=GAS_LIMIT)
    config = RunConfig(keccak(b"model"), keccak(b"data"), STAGES, 3_600, UNITS_PER_HOP,
                       10 * ETH, 3_600, ETH, HOP_PRICE_WEI)  # fmt: skip
    sponsor = dev[1]
    bench = Bench(contracts, 0, sponsor)
    started = time.perf_counter()
    run_id = open_run(contracts, sponsor, config, 5 * ETH)
    bench.gas["openRun"] = [_last_gas(w3)]
    bench.run_id = run_id
    bench.record("fundRun", fund_run(contracts, sponsor, run_id, 50 * ETH))
    console.print(f"contracts deployed; run {run_id} open ({time.perf_counter() - started:.1f} s)")
    return bench


def _last_gas(w3: Any) -> int:
    block = w3.eth.get_block("latest", full_transactions=True)
    return int(w3.eth.get_transaction_receipt(block["transactions"][-1]["hash"])["gasUsed"])


def register_relay(bench: Bench, wallet: Sender, key: LocalAccount) -> None:
    c = bench.contracts
    bench.wallet_of[key.address] = wallet
    capacity = Capacity("RTX 4090", 24_576, 1_200, 4)
    bench.record("registerNode", register_node(c, wallet, key.key, capacity, 2 * ETH))
    bench.record("joinRun", join_run(c, wallet, bench.run_id, key.address))


def register_data_node(bench: Bench, key: LocalAccount) -> None:
    c = bench.contracts
    capacity = Capacity("A100", 81_920, 2_400, 8)
    bench.record("registerNode", register_node(c, bench.sponsor, key.key, capacity, 2 * ETH))
    bench.record("addDataNode", add_data_node(c, bench.sponsor, bench.run_id, key.address))


def make_receipts(
    count: int, data_node: str, a: LocalAccount, b: LocalAccount, run_id: int
) -> list[HopReceipt]:
    """``count`` hops, half a's and half b's, each countersigned by the other."""
    receipts = []
    for i in range(count):
        worker, peer = (a, b) if i % 2 == 0 else (b, a)
        direction = (i // 2) % 2
        receipts.append(
            HopReceipt(
                runId=run_id, epoch=0, dataNode=data_node, iteration=i // 64,
                microbatchId=i // 4, stage=1 + (i // 2) % STAGES, direction=direction, attempt=0,
                worker=worker.address, counterparty=peer.address,
                inputDigest=keccak(i.to_bytes(8, "big") + b"in"),
                outputDigest=keccak(i.to_bytes(8, "big") + b"out"),
                units=scheduled_units(direction, UNITS_PER_HOP),
            )
        )  # fmt: skip
    return receipts


def build_certificate(
    bench: Bench, count: int, data_node: str, a: LocalAccount, b: LocalAccount, max_signed: int
) -> tuple[CertificateTree, dict[str, float | int]]:
    domain = bench.domain
    receipts = make_receipts(count, data_node, a, b, bench.run_id)
    keys = {a.address: a.key, b.address: b.key}
    started = time.perf_counter()
    signed_count = min(count, max_signed)
    signatures = [
        (sign_receipt(r, domain, keys[r.worker]), sign_receipt(r, domain, keys[r.counterparty]))
        for r in receipts[:signed_count]
    ]
    sign_s = time.perf_counter() - started
    entries = [SignedReceipt(r, *signatures[i % signed_count]) for i, r in enumerate(receipts)]
    started = time.perf_counter()
    leaves = sorted(
        (certify_hop(e.receipt, domain, e.worker_signature, e.counterparty_signature)
         for e in entries),
        key=lambda hop: hop.sort_key(),
    )  # fmt: skip
    running, hops = 0, []
    for index, hop in enumerate(leaves):
        hops.append(replace(hop, index=index, unitsBefore=running))
        running += hop.units
    leaf_hashes = [hop.leaf() for hop in hops]
    leaves_s = time.perf_counter() - started
    started = time.perf_counter()
    build_tree(leaf_hashes)
    tree_s = time.perf_counter() - started
    tree = tree_of_hops(hops)
    timings = {"sign_s": sign_s, "signed": signed_count, "leaves_s": leaves_s, "tree_s": tree_s}
    return tree, timings


def measure(
    sizes: list[int], max_signed: int, workers: list[int], console: Console
) -> tuple[Bench, list[TreeResult], list[SpanResult]]:
    bench = setup(console)
    c = bench.contracts
    a, b, cheat, cheat2 = (Account.create() for _ in range(4))
    wallets = [Sender.from_account(Account.create()) for _ in range(4)]
    dev = [Sender.unlocked(x) for x in c.w3.eth.accounts]
    for wallet in wallets:
        c.w3.eth.send_transaction({"from": dev[2].address, "to": wallet.address, "value": 20 * ETH})
    for key, wallet in zip((a, b, cheat, cheat2), wallets, strict=True):
        register_relay(bench, wallet, key)
    bench.record("addStake", add_stake(c, bench.wallet_of[a.address], a.address, ETH))
    first, fraud, spanner, batched = (Account.create() for _ in range(4))
    data_nodes = [Account.create() for _ in sizes]
    span_nodes = [Account.create() for _ in workers]
    for key in (first, fraud, spanner, batched, *data_nodes, *span_nodes):
        register_data_node(bench, key)
    trees = []
    for size, data_node in zip(sizes, data_nodes, strict=True):
        tree, timings = build_certificate(bench, size, data_node.address, a, b, max_signed)
        trees.append((size, tree, tree.cert_ref(bench.run_id, 0, data_node.address), timings))
        console.print(f"certificate of {size:,} hops built")
    _, ends_at, _, settles_at = c.ledger.functions.epochTimes(bench.run_id, 0).call()
    advance_time_to(c.w3, int(ends_at))
    # The first certificate of an epoch also fixes the epoch's budget; it goes first so that
    # every measured tree pays the same, steady-state price.
    warmup, _ = build_certificate(bench, 4, first.address, a, b, 4)
    bench.record("submitCertificates (first of epoch)", submit_certificates(
        c, bench.sponsor, warmup.cert_ref(bench.run_id, 0, first.address), warmup.spans_or_raise()
    ))  # fmt: skip
    submit_gas: dict[int, int] = {}
    for size, tree, cert, _ in trees:
        receipt = bench.record(
            "submitCertificates",
            submit_certificates(c, bench.sponsor, cert, tree.spans_or_raise()),
        )
        submit_gas[size] = int(receipt["gasUsed"])
    spread = []
    for count, data_node in zip(workers, span_nodes, strict=True):
        tree = _tree_of_workers(count, a)
        cert = tree.cert_ref(bench.run_id, 0, data_node.address)
        submitted = submit_certificates(c, bench.sponsor, cert, tree.spans_or_raise())
        spread.append((count, tree, cert, int(submitted["gasUsed"])))
    _prove_frauds(bench, fraud, spanner, a, b, cheat)
    _prove_batched_frauds(bench, batched, a, b, cheat2)
    _, small_tree, small_cert, _ = trees[0]
    bench.dispute_blocks = _tensor_dispute(bench, small_tree, small_cert, a, b)
    advance_time_to(c.w3, int(settles_at))
    results = []
    for size, tree, cert, t in trees:
        claim_gas = 0
        for key in (a, b):
            if tree.worker_range(key.address) is None:
                continue
            wallet = bench.wallet_of[key.address]
            claimed = bench.record("claimReward", claim_reward(c, wallet, cert, tree, key.address))
            claim_gas += int(claimed["gasUsed"])
        results.append(TreeResult(
            size, submit_gas[size], claim_gas, float(t["sign_s"]), int(t["signed"]),
            float(t["leaves_s"]), float(t["tree_s"]),
        ))  # fmt: skip
    spans = []
    for count, tree, cert, gas in spread:
        claimed = claim_reward(c, bench.wallet_of[a.address], cert, tree, a.address)
        spans.append(SpanResult(count, gas, int(claimed["gasUsed"])))
    bench.record("requestUnstake", request_unstake(c, bench.wallet_of[a.address], a.address))
    return bench, results, spans


def _tree_of_workers(count: int, a: LocalAccount) -> CertificateTree:
    """A certificate of ``count`` workers with one forward hop each: ``a`` (which claims) and
    made-up others (which never claim). Only the spans' gas is measured: the leaves are not
    signed receipts."""
    workers = sorted({a.address, *(Account.create().address for _ in range(count - 1))},
                     key=lambda w: int(w, 16))  # fmt: skip
    hops = [
        CertifiedHop(i, i * UNITS_PER_HOP, worker, UNITS_PER_HOP, keccak(f"key {i}".encode()),
                     keccak(f"digest {i}".encode()), keccak(f"signatures {i}".encode()))
        for i, worker in enumerate(workers)
    ]  # fmt: skip
    return tree_of_hops(hops)


def _prove_frauds(
    bench: Bench, data_node: LocalAccount, spanner: LocalAccount, a: LocalAccount,
    b: LocalAccount, cheat: LocalAccount,
) -> None:  # fmt: skip
    """One proof of each kind: a certificate with an off-schedule hop, a certificate of
    ``SPAN_PROOF_WORKERS`` workers whose first span takes the second worker's leaf, then the
    equivocation of a worker (each commit, then reveal a block later)."""
    c, domain, auditor = bench.contracts, bench.domain, bench.sponsor
    bad = HopReceipt(bench.run_id, 0, data_node.address, 0, 9, STAGES + 1, 0, 0, a.address,
                     b.address, keccak(b"in"), keccak(b"out"), UNITS_PER_HOP)  # fmt: skip
    entry = SignedReceipt(bad, sign_receipt(bad, domain, a.key), sign_receipt(bad, domain, b.key))
    leaf = certify_hop(bad, domain, entry.worker_signature, entry.counterparty_signature)
    tree = tree_of_hops([leaf, replace(leaf, index=1, unitsBefore=UNITS_PER_HOP)])
    cert = tree.cert_ref(bench.run_id, 0, data_node.address)
    submit_certificates(c, bench.sponsor, cert, tree.spans_or_raise())
    entries = {"proveInvalidHop": fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), entry)}
    spread = _tree_of_workers(SPAN_PROOF_WORKERS, a)
    honest_spans = spread.spans_or_raise()
    grabbing = (replace(honest_spans[0], lastIndex=1, unitsEnd=honest_spans[1].unitsEnd),)
    spread = spread.with_spans((*grabbing, *honest_spans[2:]))
    span_cert = spread.cert_ref(bench.run_id, 0, spanner.address)
    submit_certificates(c, bench.sponsor, span_cert, spread.spans_or_raise())
    entries["proveBadSpan"] = fraud_proofs.bad_span(
        span_cert, spread.span_proof(0), spread.leaf_proof(1)
    )
    honest = HopReceipt(bench.run_id, 0, data_node.address, 0, 5, 1, 0, 0, cheat.address,
                        b.address, keccak(b"x"), keccak(b"y"), UNITS_PER_HOP)  # fmt: skip
    other = replace(honest, outputDigest=keccak(b"z"))
    entries["proveEquivocation"] = fraud_proofs.equivocation(
        cheat.address, honest, sign_receipt(honest, domain, cheat.key), other,
        sign_receipt(other, domain, cheat.key),
    )  # fmt: skip
    for name, proof in entries.items():
        salt = os.urandom(32)
        bench.record("commit (fraud proof)", commit_proof(c, auditor, proof, salt))
        advance_time(c.w3, 1)
        bench.record(name, reveal_proof(c, auditor, proof, salt))
    # A bounty is final once no earlier commitment can be revealed: mine past the window.
    mine_blocks(c.w3, int(c.disputes.functions.revealWindowBlocks().call()) + 1)
    for node in (data_node.address, spanner.address, cheat.address):
        bench.record("awardBounty", award_bounty(c, auditor, node))
    bench.record("withdrawCredit", withdraw_credit(c, auditor))


def _prove_batched_frauds(
    bench: Bench, data_node: LocalAccount, a: LocalAccount, b: LocalAccount, cheat: LocalAccount
) -> None:
    """The proofs whose receipts are signed in batches of ``BATCH`` (a proof of log2(BATCH)
    hashes each): an off-schedule hop of a batch, and the equivocation of a worker that signed
    two versions of a hop in two batches."""
    c, domain, auditor = bench.contracts, bench.domain, bench.sponsor
    bad = [
        HopReceipt(bench.run_id, 0, data_node.address, 0, m, STAGES + 1, 0, 0, a.address,
                   b.address, keccak(b"in"), keccak(m.to_bytes(8, "big")), UNITS_PER_HOP)
        for m in range(BATCH)
    ]  # fmt: skip
    entry = sign_batch(bad, domain, a.key, b.key)[BATCH // 2]
    leaf = certify_hop(
        entry.receipt, domain, entry.worker_signature, entry.counterparty_signature,
        proof=entry.proof,
    )  # fmt: skip
    tree = tree_of_hops([leaf, replace(leaf, index=1, unitsBefore=UNITS_PER_HOP)])
    cert = tree.cert_ref(bench.run_id, 0, data_node.address)
    submit_certificates(c, bench.sponsor, cert, tree.spans_or_raise())
    name = f"proveInvalidHop (batch of {BATCH})"
    entries = {name: fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), entry)}
    honest = [
        HopReceipt(bench.run_id, 0, data_node.address, 0, m, 1, 0, 0, cheat.address, b.address,
                   keccak(b"x"), keccak(m.to_bytes(8, "big")), UNITS_PER_HOP)
        for m in range(BATCH)
    ]  # fmt: skip
    other = [*honest[:-1], replace(honest[-1], outputDigest=keccak(b"z"))]
    first = sign_batch(honest, domain, cheat.key, b.key)[-1]
    second = sign_batch(other, domain, cheat.key, b.key)[-1]
    entries[f"proveEquivocation (two batches of {BATCH})"] = fraud_proofs.equivocation(
        cheat.address, first.receipt, first.worker_signature, second.receipt,
        second.worker_signature, first.proof, second.proof,
    )  # fmt: skip
    for name, proof in entries.items():
        salt = os.urandom(32)
        commit_proof(c, auditor, proof, salt)
        advance_time(c.w3, 1)
        bench.record(name, reveal_proof(c, auditor, proof, salt))


def _tensor_dispute(
    bench: Bench, tree: CertificateTree, cert: Any, worker: LocalAccount, counterparty: LocalAccount
) -> int:
    """One tensor dispute about ``worker``'s first hop, through the court to its ruling by
    seven jurors (three seats, all voting RIGHT, so that the worker still claims its range
    below); returns its length in blocks."""
    c, auditor = bench.contracts, bench.sponsor
    w3 = c.w3
    dev = Sender.unlocked(w3.eth.accounts[3])
    penalty = int(c.court.functions.penaltyWei().call())
    jurors = []
    for _ in range(JURORS):
        wallet, key = Sender.from_account(Account.create()), Account.create()
        w3.eth.send_transaction({"from": dev.address, "to": wallet.address, "value": 3 * ETH})
        register_node(c, wallet, key.key, Capacity("cpu", 1_024, 1, 1), ETH)
        deposited = deposit_juror(c, wallet, key.address, 5 * penalty)
        bench.record("Court.deposit (first of a juror)", deposited)
        jurors.append((wallet, key.address))
    # A top-up in a later block: each cell of the juror's path in the draw tree, its weight,
    # the total and the pool get a new checkpoint.
    bench.record("Court.deposit (top-up)", deposit_juror(c, *jurors[0], penalty))
    # The certificate's first receipt is the worker's, countersigned (``make_receipts``).
    receipt = make_receipts(1, cert.dataNode, worker, counterparty, bench.run_id)[0]
    domain = bench.domain
    entry = SignedReceipt(
        receipt,
        sign_receipt(receipt, domain, worker.key),
        sign_receipt(receipt, domain, counterparty.key),
    )
    leaf = certify_hop(receipt, domain, entry.worker_signature, entry.counterparty_signature)
    index = next(
        i for i in range(cert.count) if tree.leaf_proof(i).hop.receiptDigest == leaf.receiptDigest
    )
    proof = fraud_proofs.wrong_tensor(cert, tree.leaf_proof(index), entry)
    assert proof.fraud == Fraud.WRONG_TENSOR
    started, first_block, gas = time.perf_counter(), int(w3.eth.block_number), []
    salt = os.urandom(32)
    gas.append(bench.record("commit (fraud proof)", commit_proof(c, auditor, proof, salt)))
    mine_blocks(w3, 1)
    opened = bench.record("openTensorDispute", reveal_proof(c, auditor, proof, salt))
    referred_events = c.disputes.events.TensorDisputeReferred()
    (referred,) = referred_events.process_receipt(opened, errors=DISCARD)
    case_id = int(referred["args"]["caseId"])
    court, phase = c.court.functions, int(c.court.functions.phaseBlocks().call())
    worker_wallet = bench.wallet_of[worker.address]
    gas += [
        opened,
        bench.record("Court.answer", c.send(worker_wallet, court.answer(case_id, salt))),
    ]
    digest = fraud_proofs.disputed_receipt_digest(proof)
    revealed = c.send(auditor, court.revealSalt(case_id, draw_salt_of(auditor, digest)))
    gas.append(bench.record("Court.revealSalt", revealed))
    mine_blocks(w3, int(court.getRounds(case_id).call()[0][0]) - int(w3.eth.block_number))
    gas.append(bench.record("Court.draw (3 seats)", c.send(auditor, court.draw(case_id))))
    seats = {str(node) for node in court.getRounds(case_id).call()[0][8]}
    sitting = [(wallet, node) for wallet, node in jurors if node in seats]
    vote_salt = os.urandom(32)
    for wallet, node in sitting:
        sealed = court.voteCommitment(case_id, 0, node, 1, vote_salt).call()
        gas.append(
            bench.record(
                "Court.commitVote", c.send(wallet, court.commitVote(case_id, node, sealed))
            )
        )
    drawn_at = int(court.getRounds(case_id).call()[0][2])
    mine_blocks(w3, drawn_at + phase - int(w3.eth.block_number))
    for wallet, node in sitting:
        fn = court.revealVote(case_id, node, 1, vote_salt)
        gas.append(bench.record("Court.revealVote", c.send(wallet, fn)))
    mine_blocks(w3, drawn_at + 3 * phase - int(w3.eth.block_number))
    gas.append(bench.record("Court.executeRuling", c.send(auditor, court.executeRuling(case_id))))
    bench.dispute_gas = sum(int(receipt["gasUsed"]) for receipt in gas)
    bench.dispute_s = time.perf_counter() - started
    return int(w3.eth.block_number) - first_block


@dataclass(frozen=True)
class SpanResult:
    workers: int
    submit_gas: int
    claim_gas: int  # one worker's claim


def print_span_table(spans: list[SpanResult], console: Console) -> None:
    if not spans:
        return
    base = spans[0]
    table = Table(title="A certificate of W workers (one hop each): the spans' cost")
    for heading in ("W workers", "submit gas", "submit gas/worker", f"vs W = {base.workers}",
                    "one claim's gas", f"claim vs W = {base.workers}"):  # fmt: skip
        table.add_column(heading, justify="right")
    for r in spans:
        table.add_row(
            f"{r.workers:,}", f"{r.submit_gas:,}", f"{r.submit_gas / r.workers:,.0f}",
            f"{r.submit_gas / base.submit_gas:.2f}", f"{r.claim_gas:,}",
            f"{r.claim_gas / base.claim_gas:.3f}",
        )  # fmt: skip
    console.print(table)


def print_tables(bench: Bench, results: list[TreeResult], console: Console) -> None:
    ops = Table(title="Gas per operation (gasUsed of real transactions)")
    for heading in ("operation", "calls", "min", "max"):
        ops.add_column(heading, justify="left" if heading == "operation" else "right")
    for name, used in sorted(bench.gas.items()):
        ops.add_row(name, str(len(used)), f"{min(used):,}", f"{max(used):,}")
    console.print(ops)
    baseline = next((r for r in results if r.receipts == 1), results[0])
    base_per_receipt = (baseline.submit_gas + baseline.claim_gas) / baseline.receipts
    per = Table(title="One certificate covering N hops, claimed by its 2 workers "
                      "(baseline: a certificate and a claim per hop)")  # fmt: skip
    for heading in ("N receipts", "submit gas", "claims gas", "gas/receipt (submit)",
                    "gas/receipt (submit+claims)", "vs baseline", "leaves s", "tree s",
                    "signed"):  # fmt: skip
        per.add_column(heading, justify="right")
    for r in results:
        total = (r.submit_gas + r.claim_gas) / r.receipts
        per.add_row(
            f"{r.receipts:,}", f"{r.submit_gas:,}", f"{r.claim_gas:,}",
            f"{r.submit_gas / r.receipts:,.3f}", f"{total:,.3f}",
            f"{total / base_per_receipt:.2e}", f"{r.leaves_s:.2f}", f"{r.tree_s:.2f}",
            f"{r.signed:,}",
        )  # fmt: skip
    console.print(per)
    big = results[-1]
    verdict = "met" if big.submit_gas / big.receipts < 1 else "NOT met"
    console.print(
        f"goal < 1 gas per receipt at N = {big.receipts:,}: {verdict} "
        f"({big.submit_gas / big.receipts:.3f} for the certificate, "
        f"{(big.submit_gas + big.claim_gas) / big.receipts:.3f} with the claims). A microbatch "
        f"of a {STAGES}-stage pipeline makes {2 * STAGES} receipts."
    )
    deployed = SuiteParams()
    # The same case at the deployed windows: the salts, the draw delay and three windows.
    blocks = 2 * deployed.court_phase_blocks + deployed.court_draw_delay_blocks
    blocks += 3 * deployed.court_phase_blocks
    console.print(
        f"one tensor dispute end to end (3 jurors, no appeal): {bench.dispute_gas:,} gas over "
        f"{bench.dispute_blocks} blocks here ({bench.dispute_s:.1f} s on eth-tester); at the "
        f"deployed windows about {blocks} blocks, {blocks * 12 / 3600:.1f} h of 12 s blocks"
    )
    console.print(
        f"leaves and tree of {big.receipts:,} hops: {big.leaves_s + big.tree_s:.2f} s; "
        f"signing {1e3 * big.sign_s / max(big.signed, 1):.2f} ms per hop (both signatures)"
    )


def plot(results: list[TreeResult]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    sizes = [r.receipts for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(sizes, [r.submit_gas / r.receipts for r in results], "o-", label="certificate")
    ax.loglog(sizes, [(r.submit_gas + r.claim_gas) / r.receipts for r in results], "s--",
              label="certificate + claims")  # fmt: skip
    ax.axhline(1, color="grey", linestyle=":", label="goal: 1 gas")
    ax.set_xlabel("hops covered by one certificate")
    ax.set_ylabel("gas per receipt")
    ax.legend()
    path = OUT_DIR / "gas_per_receipt.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1,10,1000,100000")
    parser.add_argument("--max-signed", type=int, default=1_000)
    parser.add_argument("--sign-all", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--workers", default="1,10,100,1000", help="workers per certificate")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    console = Console(width=160)
    workers = sorted({int(s) for s in args.workers.split(",") if s.strip()})
    bench, results, spans = measure(
        sizes, max(sizes) if args.sign_all else args.max_signed, workers, console
    )
    print_tables(bench, results, console)
    print_span_table(spans, console)
    if not args.no_plot:
        console.print(f"plot: {plot(results)}")


if __name__ == "__main__":
    main()
