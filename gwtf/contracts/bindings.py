"""Typed web3 bindings of the GWTF contracts: deploy the suite, call, transact, decode reverts.

Owns the boundary between web3 and the rest of GWTF: a reverted call or transaction becomes a
``ContractRevert`` (a ChainError) carrying the contract's custom error name and arguments, whether
it came from eth-tester in process (``TransactionFailed``) or from a JSON-RPC node
(``ContractLogicError``). Nothing here decides anything; the encoding lives in
``gwtf.contracts.encoding``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi.abi import decode
from eth_abi.exceptions import DecodingError
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractFunction
from web3.exceptions import ContractLogicError
from web3.types import TxParams, TxReceipt, Wei

from gwtf.contracts.artifacts import Artifacts, load_artifacts
from gwtf.contracts.certificate_tree import ranges_tree
from gwtf.contracts.encoding import CertRef, WorkerSpan
from gwtf.errors import ChainError

try:  # eth-tester is a test/devnet dependency; a node talking to a real RPC may lack it.
    from eth_tester.exceptions import TransactionFailed
except ImportError:  # pragma: no cover - exercised only without the dev extra

    class TransactionFailed(Exception):  # type: ignore[no-redef]
        """Stand-in so ``except`` clauses stay valid when eth-tester is absent."""


ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
REVERT_PREFIX = "execution reverted: "
# What a person can do about the reverts they will meet most; others get a generic hint.
HINTS: Mapping[str, str] = {
    "InsufficientStake": "send at least the minimum stake",
    "StakeBelowRunMinimum": "add stake to the node before joining or submitting",
    "NotNodeWallet": "send from the wallet that registered the node",
    "NotSponsor": "send from the run's sponsor account",
    "SubmissionClosed": "submit an epoch's certificates during the epoch after it",
    "StakeStillLocked": "wait until the unbonding delay has passed",
    "NotSettled": "wait until the epoch settles (see epochTimes)",
    "NothingToWithdraw": "there is nothing owed to this account",
    "NotDataNode": "the sponsor names a run's data nodes with addDataNode",
    "AlreadyClaimed": "this range was claimed already",
    "NoCommitment": "commit to the proof first and reveal it a block later",
    "CommitmentTooRecent": "reveal the proof in a later block than its commitment",
    "CommitmentExpired": "commit to the proof again and reveal it within revealWindowBlocks",
    "BountyNotFinal": "wait until the reveal window closes and the node's tensor disputes end",
    "WrongBond": "send Disputes.tensorBondWei plus Court.arbitrationCost with a tensor dispute",
    "NotCourt": "only the court rules on tensor disputes; see `gwtf-node audit jury`",
    "ClaimFrozen": "a tensor dispute about this node's hop awaits the court; claim after it",
    "StakeFrozen": "a tensor dispute about this node awaits the court; withdraw after it",
    "PoolTooSmall": "too few jurors hold a deposit; the case waits (`gwtf-node audit jury join`)",
    "OutsideWindow": "this court step is open only between the blocks given",
    "NodeAlreadyRegistered": "this node key is registered already; see `gwtf-node status`",
    "UnknownNode": "register the node first with `gwtf-node register`",
    "NodeNotActive": "the node is unbonding or slashed; see `gwtf-node status`",
    "NodeNotUnbonding": "request the unstake first with `gwtf-node unstake`",
    "UnknownRun": "there is no such run; see `gwtf-node runs list`",
    "RunIsClosed": "the run is closed; choose an open one from `gwtf-node runs list`",
    "RunNotClosed": "close the run first with `gwtf-node runs close`",
    "RefundNotYet": "the last epoch's claims are still open; try again after refundableAt",
    "AlreadyMember": "the node is a member of the run already",
}
DEFAULT_HINT = "check the arguments and the contract state (see gwtf/contracts/README.md)"


class ContractRevert(ChainError):
    """A call or transaction reverted; ``name`` and ``args`` are the contract's custom error."""

    def __init__(self, name: str, args: tuple[Any, ...], data: bytes) -> None:
        super().__init__(name)
        self.name = name
        self.args = args
        self.data = data

    def __str__(self) -> str:
        rendered = ", ".join(repr(arg) for arg in self.args)
        hint = HINTS.get(self.name, DEFAULT_HINT)
        return f"the contract rejected the transaction with {self.name}({rendered}); {hint}"


def _revert_data(exc: BaseException) -> bytes | None:
    """The raw revert bytes carried by an eth-tester or web3 exception, if any."""
    if isinstance(exc, ContractLogicError):
        data = exc.data
        if isinstance(data, Mapping):
            data = data.get("data")
        if isinstance(data, str) and data.startswith("0x"):
            return bytes.fromhex(data[2:])
        return None
    if isinstance(exc, TransactionFailed) and exc.args:
        first = exc.args[0]
        if isinstance(first, Exception) and first.args:
            first = first.args[0]
        if isinstance(first, bytes):
            return first
        if isinstance(first, str):
            text = first.removeprefix(REVERT_PREFIX)
            if text.startswith(("b'", 'b"')):
                try:
                    literal = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    return None
                return literal if isinstance(literal, bytes) else None
    return None


def _reason_text(exc: BaseException) -> str:
    if isinstance(exc, ContractLogicError) and exc.message:
        return str(exc.message).removeprefix(REVERT_PREFIX)
    return str(exc.args[0] if exc.args else exc).removeprefix(REVERT_PREFIX)


def decode_revert(exc: BaseException, abi: Sequence[Mapping[str, Any]]) -> ContractRevert:
    """Turns a revert from eth-tester (``TransactionFailed``) or a JSON-RPC node
    (``ContractLogicError``) into a ContractRevert with the custom error's name and decoded
    arguments; ``Error(string)`` and ``Panic(uint256)`` decode as ``Error`` and ``Panic``."""
    data = _revert_data(exc)
    if data is None:
        # A plain string reason (eth-tester decodes Error(string) itself) or no data at all.
        return ContractRevert("Error", (_reason_text(exc),), b"")
    selector, payload = data[:4], data[4:]
    try:
        if selector == ERROR_STRING_SELECTOR:
            return ContractRevert("Error", tuple(decode(["string"], payload)), data)
        if selector == PANIC_SELECTOR:
            return ContractRevert("Panic", tuple(decode(["uint256"], payload)), data)
        for entry in abi:
            if entry.get("type") != "error":
                continue
            if error_selector(error_signature(entry)) == selector:
                types = [_abi_type(item) for item in entry.get("inputs", [])]
                values = decode(types, payload)
                args = tuple(
                    to_checksum_address(value) if kind == "address" else value
                    for kind, value in zip(types, values, strict=True)
                )
                return ContractRevert(entry["name"], args, data)
    except DecodingError:
        pass
    return ContractRevert("UnknownError", ("0x" + data.hex(),), data)


def _abi_type(item: Mapping[str, Any]) -> str:
    """The canonical ABI type of one error input (tuples spelled out)."""
    kind = str(item["type"])
    if kind.startswith("tuple"):
        inner = ",".join(_abi_type(component) for component in item["components"])
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def all_errors_abi(artifacts: Artifacts | None = None) -> list[dict[str, Any]]:
    """Every custom error of every contract (a revert may bubble up from a called contract)."""
    artifacts = artifacts or load_artifacts()
    seen: dict[str, dict[str, Any]] = {}
    for compiled in artifacts.contracts.values():
        for entry in compiled.abi:
            if entry.get("type") == "error":
                seen.setdefault(error_signature(entry), entry)
    return list(seen.values())


def error_signature(entry: Mapping[str, Any]) -> str:
    """``Name(type1,type2)`` of an ABI error entry."""
    types = ",".join(_abi_type(item) for item in entry.get("inputs", []))
    return f"{entry['name']}({types})"


def error_selector(signature: str) -> bytes:
    """The 4-byte selector of an error signature."""
    return keccak(text=signature)[:4]


def call(fn: ContractFunction, sender: str | None = None, value_wei: int = 0) -> Any:
    """Runs a view (or simulates a transaction, with ``value_wei`` attached) and decodes a
    revert."""
    params: TxParams = {"value": Wei(value_wei)}
    if sender:
        params["from"] = sender
    try:
        return fn.call(params)
    except (TransactionFailed, ContractLogicError) as exc:
        raise decode_revert(exc, all_errors_abi()) from exc


def transact(
    w3: Web3, fn: ContractFunction, sender: str, value_wei: int = 0, gas: int | None = None
) -> TxReceipt:
    """Sends a transaction from ``sender`` (an unlocked account), waits for it and returns the
    receipt; a revert, at estimation or once mined, becomes a ContractRevert."""
    params: TxParams = {"from": sender, "value": Wei(value_wei)}
    if gas is not None:
        params["gas"] = gas
    try:
        tx_hash = fn.transact(params)
    except (TransactionFailed, ContractLogicError) as exc:
        raise decode_revert(exc, all_errors_abi()) from exc
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
    if receipt["status"] != 1:
        # Mined but reverted (an explicit gas limit skips estimation): replay it for the reason
        # on the state its block left, which a reverted transaction did not change.
        replay: TxParams = {"from": sender, "value": Wei(value_wei)}
        try:
            fn.call(replay, block_identifier=receipt["blockNumber"])
        except (TransactionFailed, ContractLogicError) as exc:
            raise decode_revert(exc, all_errors_abi()) from exc
        raise ChainError(
            f"transaction {tx_hash.hex()} failed without a revert reason; raise its gas limit"
        )
    return receipt


@dataclass(frozen=True)
class SuiteParams:
    """Deployment parameters of the contract suite."""

    min_stake_wei: int = 10**18
    unbonding_delay_s: int = 7 * 24 * 3600
    bounty_bps: int = 500
    tensor_bond_wei: int = 10**17
    #: Blocks within which a committed proof is revealed (about 4 minutes of 12 s blocks).
    reveal_window_blocks: int = 20
    #: The Court: a coherent juror seat's fee (a seat's penalty is 20 fees).
    court_fee_wei: int = 2 * 10**15
    #: Each of the court's windows (answer, salt, commit, reveal, appeal): an hour of 12 s blocks.
    court_phase_blocks: int = 300
    #: Blocks from the last party input to a draw's seed block (beyond RANDAO's lookahead).
    court_draw_delay_blocks: int = 132
    #: Fewest distinct jurors a jury is drawn from.
    court_min_pool: int = 7
    #: The draw's beacon: COURT_PREVRANDAO or COURT_BLOCKHASH.
    court_source: int = 1


#: Court.Source: the draw's beacon.
COURT_BLOCKHASH = 0
COURT_PREVRANDAO = 1


@dataclass(frozen=True)
class Suite:
    """The deployed contracts."""

    w3: Web3
    registry: Contract
    ledger: Contract
    disputes: Contract
    court: Contract

    @property
    def addresses(self) -> dict[str, str]:
        return {
            "NodeRegistry": self.registry.address,
            "WorkLedger": self.ledger.address,
            "Disputes": self.disputes.address,
            "Court": self.court.address,
        }


def deploy_contract(w3: Web3, name: str, sender: str, *args: Any) -> Contract:
    """Deploys contract ``name`` from the artifacts with constructor ``args``."""
    compiled = load_artifacts().get(name)
    factory = w3.eth.contract(abi=compiled.abi, bytecode=compiled.bytecode)
    try:
        tx_hash = factory.constructor(*args).transact({"from": sender})
    except (TransactionFailed, ContractLogicError) as exc:
        raise decode_revert(exc, all_errors_abi()) from exc
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
    if receipt["status"] != 1 or receipt["contractAddress"] is None:
        raise ChainError(f"deploying {name} failed; check the deployer's balance and gas limit")
    return w3.eth.contract(address=receipt["contractAddress"], abi=compiled.abi)


def attach(w3: Web3, name: str, address: str) -> Contract:
    """The contract ``name`` at ``address``."""
    abi = load_artifacts().get(name).abi
    return w3.eth.contract(address=Web3.to_checksum_address(address), abi=abi)


def deploy_court(w3: Web3, deployer: str, registry: str, params: SuiteParams) -> Contract:
    """Deploys a Court over ``registry`` with ``params``' court settings (its arbitrable unset)."""
    return deploy_contract(
        w3, "Court", deployer, registry, deployer, params.court_source, params.court_fee_wei,
        params.court_phase_blocks, params.court_draw_delay_blocks, params.court_min_pool,
    )  # fmt: skip


def deploy_suite(w3: Web3, deployer: str, params: SuiteParams | None = None) -> Suite:
    """Deploys NodeRegistry, WorkLedger, Court and Disputes, and names Disputes the registry's
    slasher, the ledger's disputes and the court's arbitrable."""
    params = params or SuiteParams()
    registry = deploy_contract(
        w3, "NodeRegistry", deployer, params.min_stake_wei, params.unbonding_delay_s, deployer
    )
    ledger = deploy_contract(w3, "WorkLedger", deployer, registry.address, deployer)
    court = deploy_court(w3, deployer, registry.address, params)
    disputes = deploy_contract(
        w3, "Disputes", deployer, registry.address, ledger.address, court.address,
        params.bounty_bps, params.tensor_bond_wei, params.reveal_window_blocks,
    )  # fmt: skip
    transact(w3, registry.functions.setSlasher(disputes.address), deployer)
    transact(w3, ledger.functions.setDisputes(disputes.address), deployer)
    transact(w3, court.functions.setArbitrable(disputes.address), deployer)
    return Suite(w3, registry, ledger, disputes, court)


def find_certificate(ledger: Contract, run_id: int, epoch: int, data_node: str) -> CertRef | None:
    """The certificate a data node submitted for an epoch, from its CertificatesSubmitted event."""
    logs = ledger.events.CertificatesSubmitted.get_logs(
        argument_filters={"runId": run_id, "epoch": epoch, "dataNode": data_node}, from_block=0
    )
    if not logs:
        return None
    args = logs[-1]["args"]
    return CertRef(
        run_id, epoch, args["dataNode"], bytes(args["root"]), args["count"], args["units"],
        bytes(args["rangesRoot"]),
    )  # fmt: skip


def committed_spans(ledger: Contract, cert: CertRef) -> tuple[WorkerSpan, ...] | None:
    """The spans ``cert``'s data node committed with it, read from its CertificatesSubmitted
    event: public, whatever wallet or contract submitted it, so that an auditor need not take
    them from the accused. None when the provider has no such event (it no longer serves logs
    that old)."""
    logs = ledger.events.CertificatesSubmitted.get_logs(
        argument_filters={"runId": cert.runId, "epoch": cert.epoch, "dataNode": cert.dataNode},
        from_block=0,
    )
    for log in logs:
        if bytes(log["args"]["rangesRoot"]) != cert.rangesRoot:
            continue
        spans = tuple(WorkerSpan(*_span_values(span)) for span in log["args"]["spans"])
        if spans and ranges_tree(spans).root == cert.rangesRoot:
            return spans
    return None


def _span_values(span: Any) -> tuple[Any, ...]:
    """A decoded ``WorkerSpan`` argument's values, in field order (web3 gives a tuple or a
    mapping)."""
    if isinstance(span, Mapping):
        return (span["worker"], span["lastIndex"], span["unitsEnd"])
    return tuple(span)
