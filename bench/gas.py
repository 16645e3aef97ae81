"""Gas of every GWTF operation, and on-chain gas per receipt when one epoch root covers N receipts.

All numbers are ``gasUsed`` of real transactions on an in-process eth-tester (py-evm, Prague)
chain running the committed contracts. The baseline, measured in the same run, is a root that
covers a single receipt (what putting every hop on chain would cost); the goal is below 1 gas
per receipt at N = 100,000. Also timed: hashing each tree's leaves and building the tree in
Python (``contracts.encoding.receipt_leaf``, ``contracts.merkle.build_tree``).

    .venv/bin/python bench/gas.py [--sizes 1,10,1000,100000] [--sign-all] [--no-plot]

Countersignatures are real EIP-712 signatures. Signing is the counterparties' work during the
epoch, not part of building a tree, so beyond --max-signed receipts (default 1,000) the bench
reuses the signatures it made, cyclically, unless --sign-all is given; the leaves still hash
every byte. Writes bench/out/gas_per_receipt.png.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from rich.console import Console
from rich.table import Table
from web3.logs import DISCARD

from contracts.bindings import SuiteParams, deploy_suite
from contracts.encoding import (
    ClaimRef,
    HopReceipt,
    ledger_domain,
    receipt_leaf,
    scheduled_units,
    sign_receipt,
)
from contracts.epoch_tree import EpochTree, SignedReceipt, build_epoch_tree
from contracts.merkle import build_tree
from node.chain.actions import (
    Capacity,
    Contracts,
    RunConfig,
    add_stake,
    claim_reward,
    fund_run,
    join_run,
    prove_double_claim,
    register_node,
    request_unstake,
    submit_epoch_root,
    withdraw_credit,
)
from node.chain.adapter import Sender, advance_time_to, connect

OUT_DIR = Path(__file__).resolve().parent / "out"
ETH = 10**18
UNITS_PER_HOP = 10
STAGES = 2
# Fixed limit above every operation here; a revert is still caught by a simulation first.
GAS_LIMIT = 2_000_000


@dataclass(frozen=True)
class TreeResult:
    receipts: int
    submit_gas: int
    claim_gas: int
    sign_s: float
    signed: int
    leaves_s: float
    tree_s: float


@dataclass
class Bench:
    contracts: Contracts
    run_id: int
    gas: dict[str, list[int]]
    wallets: list[Sender]
    wallet_of: dict[str, Sender] = field(default_factory=dict)

    def record(self, name: str, receipt: Any) -> Any:
        self.gas.setdefault(name, []).append(int(receipt["gasUsed"]))
        return receipt


def make_receipts(
    count: int, worker: LocalAccount, peer: LocalAccount, run_id: int
) -> list[HopReceipt]:
    receipts = []
    for i in range(count):
        direction = (i // STAGES) % 2
        receipts.append(
            HopReceipt(
                runId=run_id, epoch=0, iteration=i // 64, microbatchId=i, stage=i % STAGES,
                direction=direction, attempt=0, worker=worker.address, counterparty=peer.address,
                inputDigest=keccak(i.to_bytes(8, "big") + b"in"),
                outputDigest=keccak(i.to_bytes(8, "big") + b"out"),
                units=scheduled_units(direction, UNITS_PER_HOP),
            )
        )  # fmt: skip
    return receipts


def build_signed_tree(
    bench: Bench, count: int, worker: LocalAccount, peer: LocalAccount, max_signed: int
) -> tuple[list[SignedReceipt], bytes, dict[str, float | int | None]]:
    domain = ledger_domain(bench.contracts.w3.eth.chain_id, bench.contracts.ledger.address)
    receipts = make_receipts(count, worker, peer, bench.run_id)
    started = time.perf_counter()
    signed_count = min(count, max_signed)
    signatures = [sign_receipt(r, domain, peer.key) for r in receipts[:signed_count]]
    sign_s = time.perf_counter() - started
    entries = [SignedReceipt(r, signatures[i % signed_count]) for i, r in enumerate(receipts)]
    started = time.perf_counter()
    leaves, running = [], 0
    for index, entry in enumerate(entries):
        leaves.append(
            receipt_leaf(entry.receipt, domain, index, running, entry.counterparty_signature)
        )
        running += entry.receipt.units
    leaves_s = time.perf_counter() - started
    started = time.perf_counter()
    root = build_tree(leaves).root
    tree_s = time.perf_counter() - started
    timings = {"sign_s": sign_s, "signed": signed_count, "leaves_s": leaves_s,
               "tree_s": tree_s}  # fmt: skip
    return entries, root, timings


def setup(console: Console) -> tuple[Bench, LocalAccount]:
    w3 = connect(None)
    dev = [Sender.unlocked(a) for a in w3.eth.accounts]
    suite = deploy_suite(w3, dev[0].address, SuiteParams())
    contracts = Contracts.at(w3, suite.addresses, gas_limit=GAS_LIMIT)
    bench = Bench(contracts, 0, {}, dev)
    config = RunConfig(keccak(b"model"), keccak(b"data"), STAGES, 3_600, UNITS_PER_HOP,
                       10 * ETH, 3_600, ETH)  # fmt: skip
    opened = bench.record(
        "openRun", contracts.send(dev[1], contracts.ledger.functions.openRun(config.as_tuple()),
                                  5 * ETH)
    )  # fmt: skip
    (event,) = contracts.ledger.events.RunOpened().process_receipt(opened, errors=DISCARD)
    bench.run_id = int(event["args"]["runId"])
    bench.record("fundRun", fund_run(contracts, dev[1], bench.run_id, 50 * ETH))
    peer = Account.create()
    register_and_join(bench, dev[9], peer)
    console.print(f"contracts deployed; run {bench.run_id} open")
    return bench, peer


def register_and_join(bench: Bench, wallet: Sender, key: LocalAccount) -> None:
    c = bench.contracts
    bench.wallet_of[key.address] = wallet
    peer_id = b"\x12\x20" + keccak(key.address.encode())
    capacity = Capacity("RTX 4090", 24_576, 1_200, 4)
    bench.record("registerNode", register_node(c, wallet, key.key, peer_id, capacity, 2 * ETH))
    bench.record("joinRun", join_run(c, wallet, bench.run_id, key.address))


def measure(sizes: list[int], max_signed: int, console: Console) -> tuple[Bench, list[TreeResult]]:
    bench, peer = setup(console)
    c = bench.contracts
    workers = [Account.create() for _ in sizes]
    cheat_key = Account.create()
    for index, key in enumerate([*workers, cheat_key]):
        register_and_join(bench, bench.wallets[2 + index % 6], key)
    bench.record("addStake", add_stake(c, bench.wallet_of[workers[0].address], workers[0].address,
                                       ETH))  # fmt: skip
    trees = []
    for size, key in zip(sizes, workers, strict=True):
        entries, root, timings = build_signed_tree(bench, size, key, peer, max_signed)
        units = sum(entry.receipt.units for entry in entries)
        trees.append((size, key, ClaimRef(bench.run_id, 0, key.address, root, size, units),
                      timings))  # fmt: skip
        console.print(f"tree of {size:,} receipts built")
    opens_at, _, _, settles_at = c.ledger.functions.epochTimes(bench.run_id, 0).call()
    advance_time_to(c.w3, int(opens_at))
    # The first root of an epoch also fixes the epoch's budget; the cheater goes first so that
    # every measured tree pays the same, steady-state price.
    cheat_tree, cheat_claim = _submit_a_double_claim(bench, cheat_key, peer)
    submit_gas: dict[int, int] = {}
    for size, key, claim, _ in trees:
        wallet = bench.wallet_of[key.address]
        receipt = bench.record("submitEpochRoot", submit_epoch_root(c, wallet, claim))
        submit_gas[size] = int(receipt["gasUsed"])
    auditor = bench.wallets[8]
    bench.record("proveDoubleClaim", prove_double_claim(
        c, auditor, cheat_claim, cheat_tree.leaf_proof(0), cheat_claim, cheat_tree.leaf_proof(3)
    ))  # fmt: skip
    bench.record("withdrawCredit", withdraw_credit(c, auditor))
    advance_time_to(c.w3, int(settles_at))
    results = []
    for size, key, claim, t in trees:
        wallet = bench.wallet_of[key.address]
        claimed = bench.record("claimReward", claim_reward(c, wallet, claim))
        results.append(TreeResult(size, submit_gas[size], int(claimed["gasUsed"]),
                                  float(t["sign_s"] or 0), int(t["signed"] or 0),
                                  float(t["leaves_s"] or 0), float(t["tree_s"] or 0)))  # fmt: skip
    unstaker = bench.wallet_of[workers[0].address]
    bench.record("requestUnstake", request_unstake(c, unstaker, workers[0].address))
    return bench, results


def _submit_a_double_claim(
    bench: Bench, cheat: LocalAccount, peer: LocalAccount
) -> tuple[EpochTree, ClaimRef]:
    c = bench.contracts
    domain = ledger_domain(c.w3.eth.chain_id, c.ledger.address)
    honest = [SignedReceipt(r, sign_receipt(r, domain, peer.key))
              for r in make_receipts(3, cheat, peer, bench.run_id)]  # fmt: skip
    tree = build_epoch_tree([*honest, honest[0]], domain)
    claim = tree.claim(bench.run_id, 0, cheat.address)
    wallet = bench.wallet_of[cheat.address]
    bench.record("submitEpochRoot (first of epoch)", submit_epoch_root(c, wallet, claim))
    return tree, claim


def print_tables(bench: Bench, results: list[TreeResult], console: Console) -> None:
    ops = Table(title="Gas per operation (gasUsed of real transactions)")
    for heading in ("operation", "calls", "min", "max"):
        ops.add_column(heading, justify="left" if heading == "operation" else "right")
    for name, used in sorted(bench.gas.items()):
        ops.add_row(name, str(len(used)), f"{min(used):,}", f"{max(used):,}")
    console.print(ops)
    baseline = next((r for r in results if r.receipts == 1), results[0])
    base_per_receipt = (baseline.submit_gas + baseline.claim_gas) / baseline.receipts
    per = Table(title="One epoch root covering N receipts (baseline: a root per receipt)")
    for heading in ("N receipts", "submit gas", "claim gas", "gas/receipt (submit)",
                    "gas/receipt (submit+claim)", "vs baseline", "leaves s", "tree s",
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
        f"({big.submit_gas / big.receipts:.3f} submit only). A microbatch of a {STAGES}-stage "
        f"pipeline makes {2 * STAGES} receipts."
    )
    console.print(
        f"leaves and tree of {big.receipts:,} receipts: {big.leaves_s + big.tree_s:.2f} s; "
        f"signing {1e3 * big.sign_s / max(big.signed, 1):.2f} ms per countersignature"
    )


def plot(results: list[TreeResult]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    sizes = [r.receipts for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(sizes, [r.submit_gas / r.receipts for r in results], "o-", label="submit")
    ax.loglog(sizes, [(r.submit_gas + r.claim_gas) / r.receipts for r in results], "s--",
              label="submit + claim")  # fmt: skip
    ax.axhline(1, color="grey", linestyle=":", label="goal: 1 gas")
    ax.set_xlabel("receipts covered by one epoch root")
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
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    console = Console(width=160)
    bench, results = measure(sizes, max(sizes) if args.sign_all else args.max_signed, console)
    print_tables(bench, results, console)
    if not args.no_plot:
        console.print(f"plot: {plot(results)}")


if __name__ == "__main__":
    main()
