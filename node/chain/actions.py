"""The transactions a volunteer, a sponsor or an auditor sends, each one short function.

Every action takes the deployed contracts (``Contracts``) and a ``Sender`` (a local key from a
keystore, or an account unlocked on a devnet) and goes through ``Contracts.send``, which checks
funds and decodes a revert into the contract's custom error. Each returns the mined receipt, so
the caller reads gas used and events from the chain rather than assuming them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_account import Account
from web3 import Web3
from web3.logs import DISCARD

from contracts.bindings import attach
from contracts.encoding import ClaimRef, LeafProof, registry_domain, sign_binding
from gwtf.errors import ChainError
from node.chain.adapter import Sender, Web3Chain, send_transaction, transact_as
from node.chain.deployment import DevnetInfo

REGISTRY = "NodeRegistry"
LEDGER = "WorkLedger"


@dataclass(frozen=True)
class Contracts:
    """The deployed suite a command works with."""

    w3: Web3
    registry: Any
    ledger: Any
    #: Fixed gas limit for every transaction (after a revert check), or None to estimate.
    gas_limit: int | None = None

    @classmethod
    def at(cls, w3: Web3, addresses: dict[str, str], gas_limit: int | None = None) -> Contracts:
        missing = [name for name in (REGISTRY, LEDGER) if name not in addresses]
        if missing:
            raise ChainError(
                f"no address for {', '.join(missing)}; redeploy with `gwtf-node devnet`"
            )
        registry = attach(w3, REGISTRY, addresses[REGISTRY])
        ledger = attach(w3, LEDGER, addresses[LEDGER])
        for name, contract in ((REGISTRY, registry), (LEDGER, ledger)):
            if not w3.eth.get_code(contract.address):
                raise ChainError(
                    f"no {name} contract at {contract.address} on this chain; "
                    "restart `gwtf-node devnet` (a devnet forgets everything when it stops)"
                )
        return cls(w3, registry, ledger, gas_limit)

    @classmethod
    def from_devnet(cls, w3: Web3, info: DevnetInfo) -> Contracts:
        return cls.at(w3, info.contracts)

    def port(self) -> Web3Chain:
        return Web3Chain(self.registry, self.ledger)

    def send(self, sender: Sender, fn: Any, value_wei: int = 0) -> Any:
        return transact_as(self.w3, sender, fn, value_wei, gas_limit=self.gas_limit)


@dataclass(frozen=True)
class Capacity:
    gpu_model: str
    memory_mib: int
    microbatches_per_hour: int
    max_in_flight: int

    def as_tuple(self) -> tuple[str, int, int, int]:
        return (self.gpu_model, self.memory_mib, self.microbatches_per_hour, self.max_in_flight)


@dataclass(frozen=True)
class RunConfig:
    model_config_hash: bytes
    dataset_hash: bytes
    stage_count: int
    epoch_length_s: int
    units_per_hop: int
    reward_per_epoch_wei: int
    challenge_window_s: int
    min_stake_wei: int

    def as_tuple(self) -> tuple[object, ...]:
        # Field order of RunBook.RunConfig.
        return (
            self.model_config_hash,
            self.dataset_hash,
            self.stage_count,
            self.epoch_length_s,
            self.units_per_hop,
            self.reward_per_epoch_wei,
            self.challenge_window_s,
            self.min_stake_wei,
        )


def register_node(
    c: Contracts,
    wallet: Sender,
    node_key: bytes,
    peer_id: bytes,
    capacity: Capacity,
    stake_wei: int,
) -> Any:
    """Register the node whose signing key is ``node_key`` under ``wallet``, with a stake."""
    domain = registry_domain(c.w3.eth.chain_id, c.registry.address)
    signature = sign_binding(wallet.address, peer_id, node_key, domain)
    node_address = Account.from_key(node_key).address
    fn = c.registry.functions.registerNode(node_address, peer_id, capacity.as_tuple(), signature)
    return c.send(wallet, fn, stake_wei)


def add_stake(c: Contracts, wallet: Sender, node: str, amount_wei: int) -> Any:
    return c.send(wallet, c.registry.functions.addStake(node), amount_wei)


def request_unstake(c: Contracts, wallet: Sender, node: str) -> Any:
    return c.send(wallet, c.registry.functions.requestUnstake(node))


def open_run(c: Contracts, sponsor: Sender, config: RunConfig, funding_wei: int) -> int:
    """Open a run funded with ``funding_wei``; returns its id, read from the RunOpened event."""
    receipt = c.send(sponsor, c.ledger.functions.openRun(config.as_tuple()), funding_wei)
    (event,) = c.ledger.events.RunOpened().process_receipt(receipt, errors=DISCARD)
    return int(event["args"]["runId"])


def fund_run(c: Contracts, sponsor: Sender, run_id: int, amount_wei: int) -> Any:
    return c.send(sponsor, c.ledger.functions.fundRun(run_id), amount_wei)


def join_run(c: Contracts, wallet: Sender, run_id: int, node: str) -> Any:
    return c.send(wallet, c.ledger.functions.joinRun(run_id, node))


def submit_epoch_root(c: Contracts, wallet: Sender, claim: ClaimRef) -> Any:
    fn = c.ledger.functions.submitEpochRoot(
        claim.runId, claim.epoch, claim.node, claim.root, claim.count, claim.units
    )
    return c.send(wallet, fn)


def prove_double_claim(
    c: Contracts,
    auditor: Sender,
    first: ClaimRef,
    first_leaf: LeafProof,
    second: ClaimRef,
    second_leaf: LeafProof,
) -> Any:
    fn = c.ledger.functions.proveDoubleClaim(
        first.as_tuple(), first_leaf.as_tuple(), second.as_tuple(), second_leaf.as_tuple()
    )
    return c.send(auditor, fn)


def claim_reward(c: Contracts, wallet: Sender, claim: ClaimRef) -> Any:
    return c.send(wallet, c.ledger.functions.claimReward(claim.as_tuple()))


def withdraw_credit(c: Contracts, account: Sender) -> Any:
    return c.send(account, c.ledger.functions.withdrawCredit())


def transfer_eth(w3: Web3, sender: Sender, to: str, amount_wei: int) -> Any:
    """Plain ETH transfer (``gwtf-node fund`` on a devnet)."""
    tx = {"to": Web3.to_checksum_address(to), "value": amount_wei, "gas": 21_000}
    return send_transaction(w3, sender, tx)
