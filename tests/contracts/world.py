"""Test vocabulary for the contracts: accounts with roles, node keys, runs, receipts and trees."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_account import Account
from eth_tester import EthereumTester
from eth_utils.crypto import keccak
from web3 import Web3
from web3.types import TxReceipt

from contracts.bindings import ContractRevert, Suite, SuiteParams, call, transact
from contracts.encoding import (
    ClaimRef,
    Eip712Domain,
    HopReceipt,
    ledger_domain,
    registry_domain,
    scheduled_units,
    sign_binding,
    sign_receipt,
)
from contracts.epoch_tree import EpochTree, SignedReceipt, build_epoch_tree

ETH = 10**18
TEST_GAS_LIMIT = 3_000_000
EPOCH_S = 1_000
WINDOW_S = 2_000
UNITS_PER_HOP = 100
REWARD_PER_EPOCH = 3 * ETH


@dataclass(frozen=True)
class NodeKey:
    """A node's secp256k1 key (it signs bindings and receipts) and its libp2p peer id."""

    private_key: bytes
    address: str
    peer_id: bytes

    @classmethod
    def derive(cls, label: str) -> NodeKey:
        private_key = keccak(text=f"gwtf test node {label}")
        address = Account.from_key(private_key).address
        return cls(private_key, address, b"\x00\x24\x08\x01" + keccak(text=label)[:28])


def default_capacity() -> tuple[str, int, int, int]:
    return ("RTX 4090", 24_576, 3_600, 4)


@dataclass
class World:
    tester: EthereumTester
    w3: Web3
    suite: Suite
    params: SuiteParams
    keys: dict[str, NodeKey] = field(default_factory=dict)
    scenarios: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def scenario(self, name: str, build: Callable[[], Any]) -> Any:
        """Runs ``build`` once per session and snapshots the chain after it; later tests jump
        straight to that snapshot (py-evm snapshots can be reverted to repeatedly)."""
        if name in self.scenarios:
            snapshot, value = self.scenarios[name]
            self.tester.revert_to_snapshot(snapshot)
            return value
        value = build()
        self.scenarios[name] = (self.tester.take_snapshot(), value)
        return value

    # ------------------------------------------------------------ accounts and time
    @property
    def deployer(self) -> str:
        return str(self.w3.eth.accounts[0])

    @property
    def sponsor(self) -> str:
        return str(self.w3.eth.accounts[1])

    def wallet(self, i: int) -> str:
        return str(self.w3.eth.accounts[2 + i])  # wallets 0..3 -> accounts 2..5

    @property
    def challenger(self) -> str:
        return str(self.w3.eth.accounts[6])

    @property
    def stranger(self) -> str:
        return str(self.w3.eth.accounts[7])

    def key(self, label: str) -> NodeKey:
        if label not in self.keys:
            self.keys[label] = NodeKey.derive(label)
        return self.keys[label]

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def travel_to(self, timestamp: int) -> None:
        """Moves the clock so that the next transaction's block has ``timestamp`` (eth_call on
        "latest" sees one second less)."""
        self.tester.time_travel(timestamp)

    @property
    def registry(self) -> Any:
        return self.suite.registry

    @property
    def ledger(self) -> Any:
        return self.suite.ledger

    @property
    def ledger_domain(self) -> Eip712Domain:
        return ledger_domain(self.w3.eth.chain_id, self.ledger.address)

    @property
    def registry_domain(self) -> Eip712Domain:
        return registry_domain(self.w3.eth.chain_id, self.registry.address)

    def tx(self, fn: Any, sender: str, value: int = 0) -> TxReceipt:
        # A fixed gas limit skips py-evm's binary-search estimation (~13 executions per
        # transaction); a revert is then mined and replayed by `transact` for its reason.
        return transact(self.w3, fn, sender, value, gas=TEST_GAS_LIMIT)

    def call(self, fn: Any, sender: str | None = None) -> Any:
        return call(fn, sender)

    def balance(self, account: str) -> int:
        return int(self.w3.eth.get_balance(account))

    # ------------------------------------------------------------ registry
    def register(self, label: str, wallet: str, stake_wei: int = 2 * ETH) -> NodeKey:
        key = self.key(label)
        signature = sign_binding(wallet, key.peer_id, key.private_key, self.registry_domain)
        fn = self.registry.functions.registerNode(
            key.address, key.peer_id, default_capacity(), signature
        )
        self.tx(fn, wallet, stake_wei)
        return key

    # ------------------------------------------------------------ runs
    def run_config(self, **overrides: Any) -> tuple[Any, ...]:
        config = {
            "modelConfigHash": keccak(text="model"),
            "datasetHash": keccak(text="data"),
            "stageCount": 4,
            "epochLengthS": EPOCH_S,
            "unitsPerHop": UNITS_PER_HOP,
            "rewardPerEpochWei": REWARD_PER_EPOCH,
            "challengeWindowS": WINDOW_S,
            "minStakeWei": ETH,
        }
        config.update(overrides)
        return tuple(config.values())

    def open_run(self, funding_wei: int = 10 * ETH, **overrides: Any) -> int:
        receipt = self.tx(
            self.ledger.functions.openRun(self.run_config(**overrides)), self.sponsor, funding_wei
        )
        (event,) = self.ledger.events.RunOpened().process_receipt(receipt)
        return int(event["args"]["runId"])

    def join(self, run_id: int, key: NodeKey, wallet: str) -> None:
        self.tx(self.ledger.functions.joinRun(run_id, key.address), wallet)

    def epoch_times(self, run_id: int, epoch: int) -> tuple[int, int, int, int]:
        return tuple(self.ledger.functions.epochTimes(run_id, epoch).call())  # type: ignore[return-value]

    def to_submission(self, run_id: int, epoch: int) -> None:
        opens_at, _, _, _ = self.epoch_times(run_id, epoch)
        if self.now() < opens_at:
            self.travel_to(opens_at + 1)  # calls on "latest" are inside the period too

    def to_settled(self, run_id: int, epoch: int) -> None:
        _, _, _, settles_at = self.epoch_times(run_id, epoch)
        self.travel_to(max(settles_at + 1, self.now() + 1))

    # ------------------------------------------------------------ receipts
    def receipt(
        self,
        run_id: int,
        epoch: int,
        worker: NodeKey,
        counterparty: NodeKey,
        microbatch: int,
        stage: int = 0,
        direction: int = 0,
        attempt: int = 0,
        **overrides: Any,
    ) -> HopReceipt:
        fields: dict[str, Any] = {
            "runId": run_id,
            "epoch": epoch,
            "iteration": microbatch // 4,
            "microbatchId": microbatch,
            "stage": stage,
            "direction": direction,
            "attempt": attempt,
            "worker": worker.address,
            "counterparty": counterparty.address,
            "inputDigest": keccak(text=f"in {microbatch} {stage} {direction}"),
            "outputDigest": keccak(text=f"out {microbatch} {stage} {direction}"),
            "units": scheduled_units(direction, UNITS_PER_HOP),
        }
        fields.update(overrides)
        return HopReceipt(**fields)

    def countersign(
        self, receipt: HopReceipt, signer: NodeKey, domain: Eip712Domain | None = None
    ) -> SignedReceipt:
        signature = sign_receipt(receipt, domain or self.ledger_domain, signer.private_key)
        return SignedReceipt(receipt, signature)

    def honest_tree(
        self, run_id: int, epoch: int, worker: NodeKey, counterparty: NodeKey, count: int
    ) -> EpochTree:
        entries = [
            self.countersign(
                self.receipt(run_id, epoch, worker, counterparty, microbatch=m, direction=m % 2),
                counterparty,
            )
            for m in range(count)
        ]
        return build_epoch_tree(entries, self.ledger_domain)

    def tree_of(self, entries: Sequence[SignedReceipt], **kwargs: Any) -> EpochTree:
        return build_epoch_tree(entries, self.ledger_domain, **kwargs)

    def submit(
        self, claim: ClaimRef, wallet: str, *, count: int | None = None, units: int | None = None
    ) -> TxReceipt:
        fn = self.ledger.functions.submitEpochRoot(
            claim.runId,
            claim.epoch,
            claim.node,
            claim.root,
            claim.count if count is None else count,
            claim.units if units is None else units,
        )
        return self.tx(fn, wallet)


def expect_revert(excinfo: Any, name: str, *args: Any) -> None:
    """Asserts a ContractRevert by error name and arguments."""
    error = excinfo.value
    assert isinstance(error, ContractRevert), error
    assert error.name == name, f"expected {name}{args}, got {error.name}{error.args}"
    if args:
        assert error.args == args, f"{name}: expected args {args}, got {error.args}"


def reverts(w: World, fn: Any, sender: str, name: str, *args: Any, value: int = 0) -> None:
    """Sends ``fn`` and asserts it reverts with custom error ``name`` and exactly ``args``."""
    try:
        w.tx(fn, sender, value)
    except ContractRevert as error:
        assert error.name == name, f"expected {name}{args}, got {error.name}{error.args}"
        assert error.args == args, f"{name}: expected args {args}, got {error.args}"
        return
    raise AssertionError(f"expected revert {name}{args}, but the transaction succeeded")
