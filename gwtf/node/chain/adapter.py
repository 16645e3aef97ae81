"""The node's chain adapter: connecting, sending transactions, and the ``ChainPort`` it reads.

``ChainPort`` is what the rest of the node asks the chain (may this node be served in run R; a
node's info; a run's info). ``Web3Chain`` answers from the deployed contracts
through web3; ``FakeChain`` answers from memory for unit tests of the core, and one shared
conformance suite (tests/node/test_chain.py) runs against both so the fake cannot drift.

Library errors are translated here, at the boundary: an unreachable RPC becomes
``ChainUnavailable``, an unfunded sender ``WalletError``, a revert the contract's custom error
(``gwtf.contracts.bindings.ContractRevert``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlsplit

import requests
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils.exceptions import ValidationError as EvmValidationError
from web3 import Web3
from web3.exceptions import ContractLogicError, TimeExhausted, Web3RPCError
from web3.middleware import Web3Middleware
from web3.providers.rpc.utils import ExceptionRetryConfiguration
from web3.types import RPCEndpoint, RPCResponse

from gwtf.contracts.bindings import all_errors_abi, decode_revert
from gwtf.contracts.bindings import call as call_contract
from gwtf.errors import ChainError, WalletError
from gwtf.node.settings import Secret

REVERT_ERRORS: tuple[type[Exception], ...]
try:  # eth-tester raises its own revert type in process; it is a dev/devnet dependency.
    from eth_tester.exceptions import TransactionFailed

    REVERT_ERRORS = (TransactionFailed, ContractLogicError)
except ImportError:  # pragma: no cover - only without the dev extra
    REVERT_ERRORS = (ContractLogicError,)

# What py-evm raises in process for a transaction it refuses before running it.
VALIDATION_ERRORS: tuple[type[Exception], ...] = (EvmValidationError,)
try:
    from eth_tester.exceptions import ValidationError as TesterValidationError

    VALIDATION_ERRORS = (EvmValidationError, TesterValidationError)
except ImportError:  # pragma: no cover - only without the dev extra
    pass

# A node (JSON-RPC) or py-evm (in process) refusing a transaction before running it.
REFUSAL_ERRORS: tuple[type[Exception], ...] = (Web3RPCError, *VALIDATION_ERRORS)
# Gas of a typical GWTF transaction, for "you need about X ETH" before anything is estimated.
TYPICAL_TX_GAS = 300_000
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
        return embedded_chain()
    headers = {"Content-Type": "application/json"}
    if rpc_token is not None:
        headers["Authorization"] = f"Bearer {rpc_token.reveal()}"
    provider = Web3.HTTPProvider(
        rpc_url,
        request_kwargs={"timeout": timeout_s, "headers": headers},
        session=_loopback_session(rpc_url),
        exception_retry_configuration=ExceptionRetryConfiguration(
            errors=(requests.ConnectionError, requests.Timeout),
            retries=CONNECT_RETRIES,
            backoff_factor=CONNECT_BACKOFF_S,
        ),
    )
    w3 = Web3(provider)
    w3.middleware_onion.add(ChainIdOnce, "chain_id_once")
    try:
        w3.eth.chain_id  # noqa: B018 (the first request proves the endpoint answers)
    except (requests.RequestException, OSError) as exc:
        raise ChainUnavailable(rpc_url) from exc
    except (Web3RPCError, ValueError) as exc:
        raise ChainError(
            f"{rpc_url} answered but is not an Ethereum JSON-RPC node ({exc})"
        ) from exc
    return w3


def _loopback_session(rpc_url: str) -> requests.Session | None:
    """For plain HTTP to this machine, a session that reads nothing of the environment; None
    (web3's own sessions) for any other URL.

    ``requests`` looks up the environment's proxies, ``~/.netrc`` and CA bundle for every
    request (``trust_env``): about 1 ms each, many a second on a busy node. None of them has a
    use for a chain on this machine (a proxy could not reach it, and plain HTTP has no
    certificate to check), while a remote RPC keeps them: a volunteer behind a corporate proxy
    reaches it through the proxy their environment names."""
    url = urlsplit(rpc_url)
    if url.scheme != "http" or not _is_loopback(url.hostname or ""):
        return None
    session = requests.Session()
    session.trust_env = False
    return session


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


class ChainIdOnce(Web3Middleware):
    """Answers ``eth_chainId`` from the connection's first answer. web3 checks every call and
    transaction against the node's chain id, asking for it twice each time: two round trips
    per read, for a number an endpoint never changes."""

    _answer: RPCResponse | None = None

    def wrap_make_request(self, make_request: Callable[..., RPCResponse]) -> Any:
        def middleware(method: RPCEndpoint, params: Any) -> RPCResponse:
            if method != "eth_chainId":
                return make_request(method, params)
            if self._answer is None:
                response = make_request(method, params)
                if "result" not in response:
                    return response  # an error is not kept
                self._answer = response
            return self._answer

        return middleware


def embedded_chain() -> Web3:
    """A fresh in-process eth-tester (py-evm) chain with ten funded test accounts."""
    try:
        from web3.providers.eth_tester import EthereumTesterProvider

        w3 = Web3(EthereumTesterProvider())
        # What eth-tester fills in for a call or transaction without a sender, asking for the
        # accounts each time: named once.
        w3.eth.default_account = w3.eth.accounts[0]
        return w3
    except ImportError as exc:
        raise ChainError(
            "the embedded chain needs eth-tester; install it with `pip install -e '.[dev]'`"
        ) from exc


def is_insufficient_funds(exc: BaseException) -> bool:
    """geth, anvil and our devnet say "insufficient funds"; py-evm in process "cannot afford"."""
    text = str(exc).lower()
    return "insufficient funds" in text or "cannot afford" in text


@dataclass(frozen=True)
class Sender:
    """Who pays for and signs a transaction: a local key, or an account the node unlocks."""

    address: ChecksumAddress
    account: LocalAccount | None = field(default=None, repr=False)

    @classmethod
    def from_account(cls, account: LocalAccount) -> Sender:
        return cls(address=account.address, account=account)

    @classmethod
    def unlocked(cls, address: str) -> Sender:
        """An account whose key the chain node holds (eth-tester, anvil, geth --dev)."""
        return cls(address=Web3.to_checksum_address(address))


def send_transaction(
    w3: Web3, sender: Sender, tx: dict[str, Any], *, timeout_s: float = RECEIPT_TIMEOUT_S
) -> Any:
    """Fill, check funds for, sign (when the key is local), send and await one transaction.

    ``tx`` holds ``to``/``data``/``value`` (e.g. from ``contract.functions.f().build_transaction``
    with a ``from``); reverts surface from gas estimation as web3/eth-tester exceptions that the
    caller decodes with ``gwtf.contracts.bindings.decode_revert``.
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
    try:
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=timeout_s)
    except TimeExhausted as exc:
        # Sent, so it may still be mined: the caller re-reads the chain before sending again.
        raise ChainError(
            f"transaction {tx_hash.hex()} was not mined within {timeout_s:.0f} s; it may still "
            "be: check it on the chain before sending it again"
        ) from exc
    if receipt["status"] != 1:
        raise ChainError(
            f"transaction {tx_hash.hex()} failed on chain (gas used {receipt['gasUsed']}); "
            "check the contract state and retry"
        )
    return receipt


def transact_as(
    w3: Web3, sender: Sender, fn: Any, value_wei: int = 0, *, gas_limit: int | None = None
) -> Any:
    """Send contract call ``fn`` from ``sender``: a revert becomes ``ContractRevert``, a sender
    short of funds ``InsufficientFunds``; returns the mined receipt.

    Without ``gas_limit`` the gas is estimated (what a real chain needs). With it, the call is
    simulated once to surface a revert and then sent with that limit: on eth-tester this is ten
    times faster, since its estimator re-runs the transaction for a binary search.
    """
    balance_wei = int(w3.eth.get_balance(sender.address))
    if balance_wei <= value_wei:
        # Not even the value, or nothing at all left for gas: say so before simulating.
        needed_wei = value_wei + (gas_limit or TYPICAL_TX_GAS) * int(w3.eth.gas_price)
        raise InsufficientFunds(sender.address, balance_wei, needed_wei)
    params: dict[str, Any] = {"from": sender.address, "value": value_wei}
    try:
        if gas_limit is not None:
            # "pending": the block the transaction will land in (its timestamp matters here).
            fn.call(dict(params), block_identifier="pending")
            params["gas"] = gas_limit
        tx = fn.build_transaction(params)
    except REVERT_ERRORS as exc:
        raise decode_revert(exc, all_errors_abi()) from exc
    except REFUSAL_ERRORS as exc:
        if is_insufficient_funds(exc):
            raise InsufficientFunds(sender.address, balance_wei, value_wei) from exc
        raise ChainError(f"the chain refused to simulate the transaction: {exc}") from exc
    return send_transaction(w3, sender, tx)


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
    #: What the run trains (``gwtf.node.chain.actions.model_config_hash``).
    model_config_hash: bytes
    #: What a certified hop of ``units_per_hop`` units earns (a backward, twice the units, twice).
    hop_price_wei: int
    #: What it trains on (``gwtf.node.chain.actions.dataset_hash_of``).
    dataset_hash: bytes


class ChainPort(Protocol):
    """What a node needs to know from the chain; every answer is a snapshot at call time."""

    def run_info(self, run_id: int) -> RunInfo | None: ...

    def node_info(self, node_address: str) -> NodeInfo | None: ...

    def is_admitted(self, run_id: int, node_address: str) -> bool:
        """True iff ``node_address`` is a member or a data node of run ``run_id`` now, active,
        with at least the run's minimum stake."""
        ...

    def is_data_node(self, run_id: int, node_address: str) -> bool:
        """True iff the sponsor named ``node_address`` a data node of run ``run_id`` (for good:
        the ledger never takes it back), whatever its stake now."""
        ...


class FakeChain:
    """In-memory ``ChainPort`` for unit tests; shares a conformance suite with ``Web3Chain``."""

    def __init__(self) -> None:
        self._runs: dict[int, RunInfo] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._members: set[tuple[int, str]] = set()
        self._data_nodes: set[tuple[int, str]] = set()

    # -- set-up, mirroring the contracts' state changes --
    def add_run(self, run: RunInfo) -> None:
        self._runs[run.run_id] = run

    def add_node(self, node: NodeInfo) -> None:
        self._nodes[node.node_address.lower()] = node

    def join_run(self, run_id: int, node_address: str) -> None:
        self._members.add((run_id, node_address.lower()))

    def leave_run(self, run_id: int, node_address: str) -> None:
        self._members.discard((run_id, node_address.lower()))

    def add_data_node(self, run_id: int, node_address: str) -> None:
        self._data_nodes.add((run_id, node_address.lower()))

    def deactivate(self, node_address: str) -> None:
        key = node_address.lower()
        self._nodes[key] = replace(self._nodes[key], active=False)

    # -- the port --
    def run_info(self, run_id: int) -> RunInfo | None:
        return self._runs.get(run_id)

    def node_info(self, node_address: str) -> NodeInfo | None:
        return self._nodes.get(node_address.lower())

    def is_admitted(self, run_id: int, node_address: str) -> bool:
        node = self.node_info(node_address)
        run = self._runs.get(run_id)
        if node is None or run is None or not node.active:
            return False
        key = (run_id, node_address.lower())
        takes_part = key in self._members or key in self._data_nodes
        return takes_part and node.stake_wei >= run.min_stake_wei

    def is_data_node(self, run_id: int, node_address: str) -> bool:
        return (run_id, node_address.lower()) in self._data_nodes


# Order of NodeRegistry.NodeStatus.
NODE_STATUS_ACTIVE = 1
NODE_STATUS_SLASHED = 4
ZERO_ADDRESS = "0x" + "00" * 20


class Web3Chain:
    """``ChainPort`` over the deployed NodeRegistry and WorkLedger (views only, no gas)."""

    def __init__(self, registry: Any, ledger: Any) -> None:
        self.registry = registry
        self.ledger = ledger

    def run_info(self, run_id: int) -> RunInfo | None:
        run = self._call(self.ledger.functions.getRun(run_id))
        # Run struct: sponsor, startTime, epochLengthS, stageCount, closed, availableWei,
        # rewardPerEpochWei, unitsPerHop, minStakeWei, lastEpoch, challengeWindowS,
        # modelConfigHash, datasetHash, hopPriceWei
        if run[0] == ZERO_ADDRESS:
            return None
        return RunInfo(
            run_id=run_id,
            sponsor=run[0],
            stage_count=run[3],
            epoch_length_s=run[2],
            units_per_hop=run[7],
            reward_per_epoch_wei=run[6],
            challenge_window_s=run[10],
            min_stake_wei=run[8],
            balance_wei=run[5],
            closed=run[4],
            model_config_hash=bytes(run[11]),
            hop_price_wei=run[13],
            dataset_hash=bytes(run[12]),
        )

    def node_info(self, node_address: str) -> NodeInfo | None:
        if not Web3.is_address(node_address):
            return None
        address = Web3.to_checksum_address(node_address)
        # Node struct: wallet, stakeWei, status, registeredAt, unbondingAt, slashedAt, capacity.
        record = self._call(self.registry.functions.getNode(address))
        if record[0] == ZERO_ADDRESS:
            return None
        gpu_model, memory_mib, throughput, max_in_flight = record[6]
        return NodeInfo(
            node_address=address,
            operator=record[0],
            peer_id=self._peer_id_of(address),
            stake_wei=record[1],
            active=record[2] == NODE_STATUS_ACTIVE,
            gpu_model=gpu_model,
            memory_mib=memory_mib,
            throughput=throughput,
            max_in_flight=max_in_flight,
        )

    def is_admitted(self, run_id: int, node_address: str) -> bool:
        if not Web3.is_address(node_address):
            return False
        address = Web3.to_checksum_address(node_address)
        return bool(self._call(self.ledger.functions.isAdmitted(run_id, address)))

    def is_data_node(self, run_id: int, node_address: str) -> bool:
        if not Web3.is_address(node_address):
            return False
        address = Web3.to_checksum_address(node_address)
        # Named at some time before the end of time: named at all.
        named = self.ledger.functions.wasDataNodeBefore(run_id, address, 2**256 - 1)
        return bool(self._call(named))

    def _peer_id_of(self, address: str) -> bytes:
        # The registry keeps no peer id (it follows from the node's key); its event has it.
        try:
            logs = self.registry.events.NodeRegistered.get_logs(
                argument_filters={"node": address}, from_block=0
            )
        except (requests.RequestException, OSError) as exc:
            raise ChainUnavailable(
                str(getattr(self.registry.w3.provider, "endpoint_uri", "?"))
            ) from exc
        return bytes(logs[-1]["args"]["peerId"]) if logs else b""

    @staticmethod
    def _call(fn: Any) -> Any:
        try:
            return call_contract(fn)
        except (requests.RequestException, OSError) as exc:
            raise ChainUnavailable(str(getattr(fn.w3.provider, "endpoint_uri", "?"))) from exc


def advance_time(w3: Web3, seconds: int) -> int:
    """Move a development chain's clock forward and mine a block; returns the new timestamp.

    Works in process (eth-tester) and over JSON-RPC (`gwtf-node devnet`, anvil, hardhat).
    """
    latest = int(w3.eth.get_block("latest")["timestamp"])
    tester = getattr(w3.provider, "ethereum_tester", None)
    if tester is not None:
        tester.time_travel(latest + seconds)
    else:
        response = w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
        if "error" in response:
            raise ChainError(
                f"this chain cannot move its clock ({response['error']}); use a devnet or anvil"
            )
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    return int(w3.eth.get_block("latest")["timestamp"])


def mine_blocks(w3: Web3, count: int) -> None:
    """Mine ``count`` blocks on a development chain, its clock moving as it does for any block
    (in process on eth-tester, over JSON-RPC on `gwtf-node devnet`'s chains)."""
    tester = getattr(w3.provider, "ethereum_tester", None)
    if tester is not None:
        tester.mine_blocks(count)
        return
    for _ in range(count):
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]


def advance_time_to(w3: Web3, timestamp: int) -> int:
    """Move the clock so that the next block is at or after ``timestamp``."""
    latest = int(w3.eth.get_block("latest")["timestamp"])
    return advance_time(w3, timestamp - latest) if timestamp > latest else latest
