"""`gwtf-node demo`: the whole on-chain story of one epoch, really run, then summarised.

On a development chain (in-process eth-tester by default, or any devnet URL): the contracts are
deployed; a sponsor opens and funds a run and names its data node; four volunteers with fresh
wallets register relay nodes with stake and join; the nodes do an epoch of hops of a tiny
two-stage schedule and sign and countersign a receipt for each; one relay also countersigns a
second, different receipt for a hop it received. After the epoch the data node commits the
Merkle root of its certificates: every hop of the microbatches it completed. An auditor checks
the certificate and every signature it has seen, finds the double countersignature, commits to
the proof and reveals it a block later: the equivocating relay loses its stake (the bounty is a
small share, the rest is burned). Once the epoch settles the honest relays claim their ranges of
the certificate; the slashed relay cannot, and when the claim period ends its share goes back to
the run's pool. Every number printed is read back from the chain (events, views, receipts):
nothing is computed from what the demo meant to do.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from rich.console import Console
from web3 import Web3
from web3.logs import DISCARD

from contracts import fraud_proofs
from contracts.bindings import ContractRevert, deploy_suite
from contracts.certificate_tree import CertificateTree, SignedReceipt, build_certificate_tree
from contracts.encoding import CertRef, Eip712Domain, ledger_domain, sign_receipt
from node.chain.actions import (
    Capacity,
    Contracts,
    RunConfig,
    add_data_node,
    claim_reward,
    close_epoch,
    commit_proof,
    fund_run,
    join_run,
    open_run,
    register_node,
    reveal_proof,
    submit_certificates,
    transfer_eth,
    withdraw_credit,
)
from node.chain.adapter import Sender, advance_time, advance_time_to, connect, format_eth
from node.demo.report import DemoReport, NodeRow, print_report
from node.demo.schedule import (
    countersigned_receipt,
    find_equivocations,
    signatures_seen,
    synthetic_schedule,
)

ETH = 10**18
RELAYS_BY_STAGE = (("relay-a", "relay-b"), ("relay-c", "relay-d"))
DATA_NODE = "data-node"
CHEATER = "relay-d"
# Above any single operation here (registerNode ~0.3 M); see node.chain.adapter.transact_as for why.
DEMO_GAS_LIMIT = 1_500_000


@dataclass(frozen=True)
class DemoConfig:
    seed: int = 7
    iterations: int = 3
    microbatches_per_iteration: int = 4
    units_per_hop: int = 10
    reward_per_epoch_wei: int = 4 * ETH
    stake_wei: int = 2 * ETH
    volunteer_funding_wei: int = 5 * ETH
    epoch_length_s: int = 3600
    challenge_window_s: int = 3600


@dataclass
class _Actors:
    """Who is who in the demo; wallets sign locally like a real volunteer's keystore."""

    wallets: dict[str, Sender] = field(default_factory=dict)
    node_keys: dict[str, LocalAccount] = field(default_factory=dict)
    gas_by_wallet: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    gas_by_operation: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def record(self, operation: str, wallet: str, receipt: Any) -> Any:
        self.gas_by_wallet[wallet] += int(receipt["gasUsed"])
        self.gas_by_operation[operation].append(int(receipt["gasUsed"]))
        return receipt


def run_demo(
    w3: Web3 | None = None, config: DemoConfig | None = None, console: Console | None = None
) -> DemoReport:
    """Run the story on ``w3`` (a fresh in-process chain when None) and print the summary."""
    config = config or DemoConfig()
    console = console or Console()
    w3 = w3 or connect(None)
    rng = random.Random(config.seed)
    dev = [Sender.unlocked(a) for a in w3.eth.accounts]
    deployer, sponsor, auditor, faucet = dev[0], dev[1], dev[2], dev[3]

    suite = deploy_suite(w3, deployer.address)
    contracts = Contracts.at(w3, suite.addresses, gas_limit=DEMO_GAS_LIMIT)
    actors = _Actors()
    run_id = _open_and_fund_run(contracts, sponsor, config, actors)
    console.print(f"1. contracts deployed; sponsor {sponsor.address[:10]} opened run {run_id}")
    _enrol_nodes(contracts, run_id, sponsor, faucet, config, actors)
    console.print("2. data node named, 4 relays registered with stake and joined the run")

    domain = ledger_domain(w3.eth.chain_id, contracts.ledger.address)
    data_node = actors.node_keys[DATA_NODE].address
    hops = synthetic_schedule(
        rng, RELAYS_BY_STAGE, DATA_NODE, config.iterations, config.microbatches_per_iteration
    )
    receipts = [
        countersigned_receipt(hop, run_id, 0, data_node, config.units_per_hop, actors.node_keys,
                              domain, received_output=hop.output_tensor)
        for hop in hops
    ]  # fmt: skip
    forged = _countersign_a_second_version(receipts, actors, domain)
    console.print(
        f"3. {len(receipts)} hops signed by their workers and countersigned; {CHEATER} also "
        "countersigned a second version of one"
    )
    tree, cert = _certify(contracts, run_id, receipts, domain, actors)
    console.print(
        f"4. epoch 0 over: the data node certified {cert.count} hops ({cert.units} units)"
    )
    bounty_wei = _audit(contracts, [*receipts, forged], domain, auditor, actors)
    console.print(
        f"5. auditor {auditor.address[:10]} checked the certificate and every signature it saw; "
        f"bounty from accepted fraud proofs: {format_eth(bounty_wei)} ETH"
    )
    _claim_rewards(contracts, run_id, cert, tree, actors, auditor)
    console.print(
        f"6. the epoch settled: the honest relays pulled their rewards, {CHEATER}'s claim was "
        "refused; 90 days later the epoch closed and its unclaimed share went back to the pool"
    )
    report = _read_back(contracts, run_id, tree, actors, auditor.address, bounty_wei)
    print_report(report, console)
    return report


def _open_and_fund_run(c: Contracts, sponsor: Sender, cfg: DemoConfig, actors: _Actors) -> int:
    actors.wallets["sponsor"] = sponsor
    run_config = RunConfig(
        model_config_hash=Web3.keccak(text="tiny-gpt: 2 stages x 2 layers, d=64"),
        dataset_hash=Web3.keccak(text="synthetic tokens, seed 7"),
        stage_count=len(RELAYS_BY_STAGE),
        epoch_length_s=cfg.epoch_length_s,
        units_per_hop=cfg.units_per_hop,
        reward_per_epoch_wei=cfg.reward_per_epoch_wei,
        challenge_window_s=cfg.challenge_window_s,
        min_stake_wei=ETH,
    )
    # Opened with part of the budget, then topped up: both paths of funding a run.
    run_id = open_run(c, sponsor, run_config, funding_wei=cfg.reward_per_epoch_wei // 2)
    actors.record("fundRun", "sponsor", fund_run(c, sponsor, run_id, 2 * cfg.reward_per_epoch_wei))
    return run_id


def _enrol_nodes(
    c: Contracts, run_id: int, sponsor: Sender, faucet: Sender, cfg: DemoConfig, actors: _Actors
) -> None:
    """The sponsor registers its data node and names it; each volunteer registers a relay
    (its node key is its libp2p identity too) and joins."""
    names = [DATA_NODE] + [name for stage in RELAYS_BY_STAGE for name in stage]
    for name in names:
        if name == DATA_NODE:
            wallet = sponsor
        else:
            wallet = Sender.from_account(Account.create())
            transfer_eth(c.w3, faucet, wallet.address, cfg.volunteer_funding_wei)
        actors.wallets[name] = wallet
        key: LocalAccount = Account.create()
        actors.node_keys[name] = key
        capacity = (
            Capacity("RTX 4090", 24_576, 1_200, 4)
            if name != DATA_NODE
            else Capacity("A100", 81_920, 2_400, 8)
        )
        receipt = register_node(c, wallet, key.key, capacity, cfg.stake_wei)
        actors.record("registerNode", name, receipt)
        if name == DATA_NODE:
            actors.record("addDataNode", name, add_data_node(c, sponsor, run_id, key.address))
        else:
            actors.record("joinRun", name, join_run(c, wallet, run_id, key.address))


def _countersign_a_second_version(
    receipts: list[SignedReceipt], actors: _Actors, domain: Eip712Domain
) -> SignedReceipt:
    """The cheat: the cheater countersigns another output for a hop it received (to dispute
    that worker's tensor later, say). The receipt it really got stays certified."""
    cheater = actors.node_keys[CHEATER]
    original = next(e for e in receipts if e.receipt.counterparty == cheater.address)
    version = replace(original.receipt, outputDigest=keccak(b"a different output"))
    return SignedReceipt(version, b"", sign_receipt(version, domain, cheater.key))


def _certify(
    c: Contracts, run_id: int, receipts: list[SignedReceipt], domain: Any, actors: _Actors
) -> tuple[CertificateTree, CertRef]:
    """The data node's certificate of every hop it saw through, committed after the epoch."""
    (_, ends_at, _, _) = c.ledger.functions.epochTimes(run_id, 0).call()
    advance_time_to(c.w3, int(ends_at))
    tree = build_certificate_tree(receipts, domain)
    cert = tree.cert_ref(run_id, 0, actors.node_keys[DATA_NODE].address)
    sponsor = actors.wallets[DATA_NODE]
    actors.record("submitCertificates", DATA_NODE, submit_certificates(c, sponsor, cert))
    return tree, cert


def _audit(
    c: Contracts,
    seen: list[SignedReceipt],
    domain: Eip712Domain,
    auditor: Sender,
    actors: _Actors,
) -> int:
    """The auditor proves each key that signed two versions of one hop: commit, then reveal a
    block later (a proof copied from the mempool cannot beat it)."""
    bounty_wei = 0
    slashed: set[str] = set()
    for first, second in find_equivocations(signatures_seen(seen), domain):
        if first.signer in slashed:
            continue
        proof = fraud_proofs.equivocation(
            first.signer, first.receipt, first.signature, second.receipt, second.signature
        )
        salt = os.urandom(32)
        actors.record("commit (fraud proof)", "auditor", commit_proof(c, auditor, proof, salt))
        advance_time(c.w3, 1)
        receipt = reveal_proof(c, auditor, proof, salt)
        actors.record("proveEquivocation", "auditor", receipt)
        slashed.add(first.signer)
        for event in c.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD):
            bounty_wei += int(event["args"]["bountyWei"])
    if bounty_wei:
        actors.record("withdrawCredit", "auditor", withdraw_credit(c, auditor))
    return bounty_wei


def _claim_rewards(
    c: Contracts,
    run_id: int,
    cert: CertRef,
    tree: CertificateTree,
    actors: _Actors,
    auditor: Sender,
) -> None:
    """The relays claim once the epoch settles; a slashed one is refused, and what nobody
    claimed returns to the pool when the claim period ends (anyone closes the epoch)."""
    (_, _, _, settles_at) = c.ledger.functions.epochTimes(run_id, 0).call()
    advance_time_to(c.w3, int(settles_at))
    for name in (n for stage in RELAYS_BY_STAGE for n in stage):
        node = actors.node_keys[name].address
        try:
            receipt = claim_reward(c, actors.wallets[name], cert, tree, node)
        except ContractRevert as refused:
            actors.gas_by_operation.setdefault(f"refused: {refused.name}", []).append(0)
            continue
        actors.record("claimReward", name, receipt)
    claim_period_s = int(c.ledger.functions.CLAIM_PERIOD_S().call())
    advance_time_to(c.w3, int(settles_at) + claim_period_s)
    actors.record("closeEpoch", "auditor", close_epoch(c, auditor, run_id, 0))


def _read_back(
    c: Contracts,
    run_id: int,
    tree: CertificateTree,
    actors: _Actors,
    auditor: str,
    bounty_wei: int,
) -> DemoReport:
    ledger, registry, disputes = c.ledger, c.registry, c.disputes
    rewards: dict[str, int] = defaultdict(int)
    units: dict[str, int] = defaultdict(int)
    for e in ledger.events.RewardClaimed.get_logs(argument_filters={"runId": run_id}, from_block=0):
        rewards[e["args"]["node"]] += int(e["args"]["amountWei"])
        units[e["args"]["node"]] += int(e["args"]["units"])
    (closed,) = ledger.events.EpochClosed.get_logs(argument_filters={"runId": run_id}, from_block=0)
    certified = {node: span.units for node in tree.workers() if (span := tree.worker_range(node))}
    slashed: dict[str, int] = defaultdict(int)
    for e in registry.events.NodeSlashed.get_logs(from_block=0):
        slashed[e["args"]["node"]] += int(e["args"]["amountWei"])
    (submitted,) = ledger.events.CertificatesSubmitted.get_logs(
        argument_filters={"runId": run_id}, from_block=0
    )
    rows = []
    for stage, names in enumerate(RELAYS_BY_STAGE, start=1):
        for name in names:
            node = actors.node_keys[name].address
            rows.append(
                NodeRow(
                    name=name,
                    stage=stage,
                    node_address=node,
                    wallet=actors.wallets[name].address,
                    stake_wei=int(registry.functions.getNode(node).call()[1]),
                    units=certified.get(node, 0),
                    claimed_units=units[node],
                    reward_wei=rewards[node],
                    slashed_wei=slashed[node],
                    gas_used=actors.gas_by_wallet[name],
                    balance_wei=int(c.w3.eth.get_balance(actors.wallets[name].address)),
                )
            )
    (budget_event,) = ledger.events.EpochBudgetFixed.get_logs(
        argument_filters={"runId": run_id}, from_block=0
    )
    run = ledger.functions.getRun(run_id).call()
    return DemoReport(
        run_id=run_id,
        registry=registry.address,
        ledger=ledger.address,
        disputes=disputes.address,
        certified_hops=int(submitted["args"]["count"]),
        certified_units=int(submitted["args"]["units"]),
        rows=tuple(rows),
        epoch_budget_wei=int(budget_event["args"]["budgetWei"]),
        run_available_wei=int(run[5]),
        auditor=auditor,
        bounty_wei=bounty_wei,
        burned_wei=int(disputes.functions.burnedWei().call()),
        returned_wei=int(closed["args"]["returnedWei"]),
        gas_by_operation={k: tuple(v) for k, v in actors.gas_by_operation.items()},
    )
