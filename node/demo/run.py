"""`gwtf-node demo`: the whole on-chain story of one epoch, really run, then summarised.

On a development chain (in-process eth-tester by default, or any devnet URL): the contracts are
deployed; a sponsor opens and funds a run and registers its data node; four volunteers with
fresh wallets register relay nodes with stake and join; the nodes do an epoch of hops of a tiny
two-stage schedule and sign and countersign a receipt for each; after the epoch each relay
submits the Merkle root of its receipts; one relay double-claims a hop, an auditor finds it in
the relay's tree, proves it on chain and collects the bounty; time passes the challenge window
and the honest relays pull their rewards. Every number printed is read back from the chain
(events, views, receipts): nothing is computed from what the demo meant to do.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from web3 import Web3
from web3.logs import DISCARD

from contracts.bindings import ContractRevert, deploy_suite
from contracts.encoding import ClaimRef, ledger_domain
from contracts.epoch_tree import EpochTree, SignedReceipt, build_epoch_tree
from node.chain.actions import (
    Capacity,
    Contracts,
    RunConfig,
    claim_reward,
    fund_run,
    join_run,
    open_run,
    prove_double_claim,
    register_node,
    submit_epoch_root,
    transfer_eth,
    withdraw_credit,
)
from node.chain.adapter import Sender, advance_time_to, connect, format_eth
from node.demo.report import DemoReport, NodeRow, print_report
from node.demo.schedule import (
    countersigned_receipt,
    find_double_claims,
    receipts_by_worker,
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
    _enrol_nodes(contracts, run_id, sponsor, faucet, rng, config, actors)
    console.print("2. data node and 4 relays registered with stake and joined the run")

    domain = ledger_domain(w3.eth.chain_id, contracts.ledger.address)
    hops = synthetic_schedule(
        rng, RELAYS_BY_STAGE, DATA_NODE, config.iterations, config.microbatches_per_iteration
    )
    receipts = [
        countersigned_receipt(hop, run_id, 0, config.units_per_hop, actors.node_keys, domain,
                              received_output=hop.output_tensor)
        for hop in hops
    ]  # fmt: skip
    console.print(f"3. {len(receipts)} hops signed by their workers and countersigned")
    trees = _submit_roots(contracts, run_id, receipts, domain, actors)
    console.print(f"4. epoch 0 over: {len(trees)} relays submitted their receipts' Merkle roots")
    bounty_wei = _audit(contracts, run_id, trees, auditor, actors)
    console.print(
        f"5. auditor {auditor.address[:10]} checked every tree; bounty from accepted fraud "
        f"proofs: {format_eth(bounty_wei)} ETH"
    )
    _claim_rewards(contracts, run_id, trees, actors)
    console.print("6. challenge window over: relays pulled their rewards")
    report = _read_back(contracts, run_id, actors, auditor.address, bounty_wei)
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
    c: Contracts,
    run_id: int,
    sponsor: Sender,
    faucet: Sender,
    rng: random.Random,
    cfg: DemoConfig,
    actors: _Actors,
) -> None:
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
        # Shaped like a libp2p peer id (multihash sha2-256 prefix + 32 bytes).
        peer_id = b"\x12\x20" + rng.randbytes(32)
        capacity = (
            Capacity("RTX 4090", 24_576, 1_200, 4)
            if name != DATA_NODE
            else Capacity("A100", 81_920, 2_400, 8)
        )
        receipt = register_node(c, wallet, key.key, peer_id, capacity, cfg.stake_wei)
        actors.record("registerNode", name, receipt)
        actors.record("joinRun", name, join_run(c, wallet, run_id, key.address))


def _submit_roots(
    c: Contracts, run_id: int, receipts: list[SignedReceipt], domain: Any, actors: _Actors
) -> dict[str, EpochTree]:
    (opens_at, _, _, _) = c.ledger.functions.epochTimes(run_id, 0).call()
    advance_time_to(c.w3, int(opens_at))
    by_worker = receipts_by_worker(receipts)
    trees: dict[str, EpochTree] = {}
    for name in (n for stage in RELAYS_BY_STAGE for n in stage):
        own = list(by_worker.get(actors.node_keys[name].address, []))
        if name == CHEATER:
            # The cheat: the same hop claimed a second time at the end of the tree.
            own.append(own[0])
        tree = build_epoch_tree(own, domain)
        trees[name] = tree
        claim = tree.claim(run_id, 0, actors.node_keys[name].address)
        actors.record("submitEpochRoot", name, submit_epoch_root(c, actors.wallets[name], claim))
    return trees


def _audit(
    c: Contracts, run_id: int, trees: dict[str, EpochTree], auditor: Sender, actors: _Actors
) -> int:
    """The auditor checks every tree the nodes serve and proves each double claim it finds."""
    bounty_wei = 0
    for name, tree in trees.items():
        claim = tree.claim(run_id, 0, actors.node_keys[name].address)
        for first, second in find_double_claims(tree)[:1]:  # one proof voids the whole claim
            receipt = prove_double_claim(
                c, auditor, claim, tree.leaf_proof(first), claim, tree.leaf_proof(second)
            )
            actors.record("proveDoubleClaim", "auditor", receipt)
            for event in c.ledger.events.FraudProven().process_receipt(receipt, errors=DISCARD):
                bounty_wei += int(event["args"]["bountyWei"])
    if bounty_wei:
        actors.record("withdrawCredit", "auditor", withdraw_credit(c, auditor))
    return bounty_wei


def _claim_rewards(c: Contracts, run_id: int, trees: dict[str, EpochTree], actors: _Actors) -> None:
    (_, _, _, settles_at) = c.ledger.functions.epochTimes(run_id, 0).call()
    advance_time_to(c.w3, int(settles_at))
    for name, tree in trees.items():
        claim: ClaimRef = tree.claim(run_id, 0, actors.node_keys[name].address)
        try:
            actors.record("claimReward", name, claim_reward(c, actors.wallets[name], claim))
        except ContractRevert as revert:
            # The cheater's claim was voided: the ledger refuses to pay it.
            actors.gas_by_operation.setdefault("refused: " + revert.name, []).append(0)


def _read_back(
    c: Contracts, run_id: int, actors: _Actors, auditor: str, bounty_wei: int
) -> DemoReport:
    ledger, registry = c.ledger, c.registry
    submitted = {
        e["args"]["node"]: e["args"]
        for e in ledger.events.EpochRootSubmitted.get_logs(
            argument_filters={"runId": run_id}, from_block=0
        )
    }
    rewards: dict[str, int] = defaultdict(int)
    for e in ledger.events.RewardClaimed.get_logs(argument_filters={"runId": run_id}, from_block=0):
        rewards[e["args"]["node"]] += int(e["args"]["amountWei"])
    slashed: dict[str, int] = defaultdict(int)
    for e in registry.events.NodeSlashed.get_logs(from_block=0):
        slashed[e["args"]["node"]] += int(e["args"]["amountWei"])
    rows = []
    for stage, names in enumerate(RELAYS_BY_STAGE):
        for name in names:
            node = actors.node_keys[name].address
            claim = submitted.get(node)
            rows.append(
                NodeRow(
                    name=name,
                    stage=stage,
                    node_address=node,
                    wallet=actors.wallets[name].address,
                    stake_wei=int(registry.functions.getNode(node).call()[1]),
                    receipts=int(claim["count"]) if claim else 0,
                    units=int(claim["units"]) if claim else 0,
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
        rows=tuple(rows),
        epoch_budget_wei=int(budget_event["args"]["budgetWei"]),
        run_available_wei=int(run[5]),
        auditor=auditor,
        bounty_wei=bounty_wei,
        gas_by_operation={k: tuple(v) for k, v in actors.gas_by_operation.items()},
    )
