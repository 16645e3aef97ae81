"""The node's chain adapter: connecting, sending transactions, and the ``ChainPort`` it reads.

``ChainPort`` is what the rest of the node asks the chain (is this peer a registered, staked
node of run R; a node's info; a run's info). ``Web3Chain`` answers from the deployed contracts
through web3; ``FakeChain`` answers from memory for unit tests of the core, and one shared
conformance suite (tests/node/test_chain.py) runs against both so the fake cannot drift.

Library errors are translated here, at the boundary: an unreachable RPC becomes
``ChainUnavailable``, an unfunded sender ``WalletError``, a revert the contract's custom error
(``contracts.bindings.ContractRevert``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import requests
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import Web3RPCError
from web3.providers.eth_tester import EthereumTesterProvider
from web3.providers.rpc.utils import ExceptionRetryConfiguration

from gwtf.errors import ChainError, WalletError
from node.settings import Secret

# Few, quick retries: a person waiting on the CLI should hear about a dead RPC in seconds.
CONNECT_RETRIES = 2
CONNECT_BACKOFF_S = 0.1
RECEIPT_TIMEOUT_S = 120.0
WEI_PER_ETH = 10**18


class ChainUnavailable(ChainError):
    """The JSON-RPC endpoint did not answer."""

    def __init__(self, rpc_url: str) -> None:
        super().__init__(
            f"cannot reach chain RPC at {rpc_url}; start `gwtf-node devnet` or pass --rpc-url"
        )
        self.rpc_url = rpc_url


class InsufficientFunds(WalletError):
    """The sending wallet cannot pay for value + gas."""

    def __init__(self, address: str, balance_wei: int, needed_wei: int) -> None:
        super().__init__(
            f"wallet {address} holds {format_eth(balance_wei)} ETH but this needs about "
            f"{format_eth(needed_wei)} ETH; fund it (on a devnet: `gwtf-node fund --to {address}`)"
        )
        self.address = address
        self.balance_wei = balance_wei
        self.needed_wei = needed_wei


def format_eth(wei: int) -> str:
    return f"{wei / WEI_PER_ETH:.6f}".rstrip("0").rstrip(".") if wei else "0"


def connect(
    rpc_url: str | None,
    *,
    timeout_s: float = 10.0,
    rpc_token: Secret | None = None,
) -> Web3:
    """A connected ``Web3``: JSON-RPC at ``rpc_url``, or a fresh in-process eth-tester if None."""
    if not rpc_url:
        return Web3(EthereumTesterProvider())
    headers = {"Content-Type": "application/json"}
    if rpc_token is not None:
        headers["Authorization"] = f"Bearer {rpc_token.reveal()}"
    provider = Web3.HTTPProvider(
        rpc_url,
        request_kwargs={"timeout": timeout_s, "headers": headers},
        exception_retry_configuration=ExceptionRetryConfiguration(
            errors=(requests.ConnectionError, requests.Timeout),
            retries=CONNECT_RETRIES,
            backoff_factor=CONNECT_BACKOFF_S,
        ),
    )
    w3 = Web3(provider)
    try:
        w3.eth.chain_id  # noqa: B018 (the first request proves the endpoint answers)
    except (requests.RequestException, OSError) as exc:
        raise ChainUnavailable(rpc_url) from exc
    except (Web3RPCError, ValueError) as exc:
        raise ChainError(f"{rpc_url} answered but is not an Ethereum JSON-RPC node ({exc})") from exc
    return w3


def is_insufficient_funds(exc: BaseException) -> bool:
    """geth, anvil and our devnet all say "insufficient funds" when a sender cannot pay."""
    return "insufficient funds" in str(exc).lower()


@dataclass(frozen=True)
class Sender:
    """Who pays for and signs a transaction: a local key, or an account the node unlocks."""

    address: str
    account: LocalAccount | None = field(default=None, repr=False)

    @classmethod
    def from_account(cls, account: LocalAccount) -> Sender:
        return cls(address=account.address, account=account)


def send_transaction(
    w3: Web3, sender: Sender, tx: dict[str, Any], *, timeout_s: float = RECEIPT_TIMEOUT_S
) -> Any:
    """Fill, check funds for, sign (when the key is local), send and await one transaction.

    ``tx`` holds ``to``/``data``/``value`` (e.g. from ``contract.functions.f().build_transaction``
    with a ``from``); reverts surface from gas estimation as web3/eth-tester exceptions that the
    caller decodes with ``contracts.bindings.decode_revert``.
    """
    tx = dict(tx)
    tx["from"] = sender.address
    tx.setdefault("chainId", w3.eth.chain_id)
    tx.setdefault("nonce", w3.eth.get_transaction_count(sender.address, "pending"))
    if "gas" not in tx:
        tx["gas"] = w3.eth.estimate_gas(tx)  # type: ignore[arg-type]
    if "maxFeePerGas" not in tx and "gasPrice" not in tx:
        base_fee = int(w3.eth.get_block("latest").get("baseFeePerGas", 0) or 0)
        tip = int(w3.eth.max_priority_fee)
        tx["maxPriorityFeePerGas"] = tip
        tx["maxFeePerGas"] = 2 * base_fee + tip
    price = int(tx.get("maxFeePerGas", tx.get("gasPrice", 0)))
    needed_wei = int(tx.get("value", 0)) + int(tx["gas"]) * price
    balance_wei = int(w3.eth.get_balance(sender.address))
    if balance_wei < needed_wei:
        raise InsufficientFunds(sender.address, balance_wei, needed_wei)
    try:
        if sender.account is not None:
            signed = sender.account.sign_transaction(tx)
            tx_hash = w3.eth.send_raw_transaction(signed.raw_transaction)
        else:
            tx_hash = w3.eth.send_transaction(tx)  # type: ignore[arg-type]
    except Web3RPCError as exc:
        if is_insufficient_funds(exc):
            raise InsufficientFunds(sender.address, balance_wei, needed_wei) from exc
        raise ChainError(f"the chain refused the transaction: {exc}") from exc
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=timeout_s)
    if receipt["status"] != 1:
        raise ChainError(
            f"transaction {tx_hash.hex()} failed on chain (gas used {receipt['gasUsed']}); "
            "check the contract state and retry"
        )
    return receipt


# ---------------------------------------------------------------------------------------------
# The port: what the node reads from the chain.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    node_address: str
    operator: str
    peer_id: bytes
    stake_wei: int
    active: bool
    gpu_model: str
    memory_mib: int
    throughput: int
    max_in_flight: int


@dataclass(frozen=True)
class RunInfo:
    run_id: int
    sponsor: str
    stage_count: int
    epoch_length_s: int
    units_per_hop: int
    reward_per_epoch_wei: int
    challenge_window_s: int
    min_stake_wei: int
    balance_wei: int
    closed: bool


class ChainPort(Protocol):
    """What a node needs to know from the chain; every answer is a snapshot at call time."""

    def run_info(self, run_id: int) -> RunInfo | None: ...

    def node_info(self, node_address: str) -> NodeInfo | None: ...

    def node_by_peer_id(self, peer_id: bytes) -> NodeInfo | None: ...

    def is_run_member(self, run_id: int, peer_id: bytes) -> bool:
        """True iff ``peer_id`` is a registered, active node that joined run ``run_id`` with
        at least the run's minimum stake."""
        ...


class FakeChain:
    """In-memory ``ChainPort`` for unit tests; shares a conformance suite with ``Web3Chain``."""

    def __init__(self) -> None:
        self._runs: dict[int, RunInfo] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._members: set[tuple[int, str]] = set()

    # -- set-up, mirroring the contracts' state changes --
    def add_run(self, run: RunInfo) -> None:
        self._runs[run.run_id] = run

    def add_node(self, node: NodeInfo) -> None:
        self._nodes[node.node_address.lower()] = node

    def join_run(self, run_id: int, node_address: str) -> None:
        self._members.add((run_id, node_address.lower()))

    def deactivate(self, node_address: str) -> None:
        key = node_address.lower()
        self._nodes[key] = replace(self._nodes[key], active=False)

    # -- the port --
    def run_info(self, run_id: int) -> RunInfo | None:
        return self._runs.get(run_id)

    def node_info(self, node_address: str) -> NodeInfo | None:
        return self._nodes.get(node_address.lower())

    def node_by_peer_id(self, peer_id: bytes) -> NodeInfo | None:
        return next((n for n in self._nodes.values() if n.peer_id == peer_id), None)

    def is_run_member(self, run_id: int, peer_id: bytes) -> bool:
        node = self.node_by_peer_id(peer_id)
        run = self._runs.get(run_id)
        if node is None or run is None or not node.active:
            return False
        joined = (run_id, node.node_address.lower()) in self._members
        return joined and node.stake_wei >= run.min_stake_wei
