"""The chain adapter: one conformance suite for the web3 ChainPort and the in-memory fake, and
the boundary errors (unreachable RPC, unfunded wallet, reverts over JSON-RPC)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from gwtf.contracts.bindings import ContractRevert, SuiteParams, call, deploy_suite
from gwtf.contracts.encoding import node_public_key, peer_id_of_public_key
from gwtf.node.chain.actions import (
    Capacity,
    Contracts,
    RunConfig,
    add_data_node,
    join_run,
    open_run,
    register_node,
    request_unstake,
)
from gwtf.node.chain.adapter import (
    ChainPort,
    ChainUnavailable,
    FakeChain,
    InsufficientFunds,
    NodeInfo,
    RunInfo,
    Sender,
    connect,
)
from tests.node.conftest import TEST_GAS_LIMIT

ETH = 10**18
CAPACITY = Capacity("RTX 4090", 24_576, 1_200, 4)
RUN = RunConfig(b"\x01" * 32, b"\x02" * 32, 3, 600, 10, ETH, 600, 2 * ETH, 10**14)


class World(Protocol):
    """Drives the same story on a backend; the port under test answers questions about it."""

    port: ChainPort
    sponsor: str

    def open_run(self, funding_wei: int) -> int: ...
    def register(self, key: LocalAccount, stake_wei: int, *, by_sponsor: bool = False) -> str: ...
    def join(self, run_id: int, node: str) -> None: ...
    def leave(self, run_id: int, node: str) -> None: ...
    def add_data_node(self, run_id: int, node: str) -> None: ...
    def unstake(self, node: str) -> None: ...


@dataclass
class FakeWorld:
    sponsor: str = "0x" + "5" * 40
    port: FakeChain = field(default_factory=FakeChain)
    wallet: str = "0x" + "6" * 40
    runs: int = 0

    def open_run(self, funding_wei: int) -> int:
        self.runs += 1
        self.port.add_run(
            RunInfo(self.runs, self.sponsor, RUN.stage_count, RUN.epoch_length_s,
                    RUN.units_per_hop, RUN.reward_per_epoch_wei, RUN.challenge_window_s,
                    RUN.min_stake_wei, funding_wei, False, RUN.model_config_hash,
                    RUN.hop_price_wei, RUN.dataset_hash)
        )  # fmt: skip
        return self.runs

    def register(self, key: LocalAccount, stake_wei: int, *, by_sponsor: bool = False) -> str:
        peer_id = peer_id_of_public_key(node_public_key(key.key))
        wallet = self.sponsor if by_sponsor else self.wallet
        self.port.add_node(
            NodeInfo(key.address, wallet, peer_id, stake_wei, True, *CAPACITY.as_tuple())
        )
        return str(key.address)

    def join(self, run_id: int, node: str) -> None:
        self.port.join_run(run_id, node)

    def leave(self, run_id: int, node: str) -> None:
        self.port.leave_run(run_id, node)

    def add_data_node(self, run_id: int, node: str) -> None:
        self.port.add_data_node(run_id, node)

    def unstake(self, node: str) -> None:
        self.port.deactivate(node)


class Web3World:
    def __init__(self, contracts: Contracts) -> None:
        accounts = contracts.w3.eth.accounts
        self.c = contracts
        self.sponsor = accounts[1]
        self.wallet = Sender.unlocked(accounts[2])
        self.port = contracts.port()

    def open_run(self, funding_wei: int) -> int:
        return open_run(self.c, Sender.unlocked(self.sponsor), RUN, funding_wei)

    def register(self, key: LocalAccount, stake_wei: int, *, by_sponsor: bool = False) -> str:
        wallet = Sender.unlocked(self.sponsor) if by_sponsor else self.wallet
        register_node(self.c, wallet, key.key, CAPACITY, stake_wei)
        return str(key.address)

    def join(self, run_id: int, node: str) -> None:
        join_run(self.c, self.wallet, run_id, node)

    def leave(self, run_id: int, node: str) -> None:
        self.c.send(self.wallet, self.c.ledger.functions.leaveRun(run_id, node))

    def add_data_node(self, run_id: int, node: str) -> None:
        add_data_node(self.c, Sender.unlocked(self.sponsor), run_id, node)

    def unstake(self, node: str) -> None:
        request_unstake(self.c, self.wallet, node)


@pytest.fixture(scope="module")
def in_process_contracts() -> Contracts:
    w3 = connect(None)
    suite = deploy_suite(w3, w3.eth.accounts[0], SuiteParams(min_stake_wei=ETH))
    return Contracts.at(w3, suite.addresses, gas_limit=TEST_GAS_LIMIT)


@pytest.fixture(params=["fake", "web3"])
def world(request: pytest.FixtureRequest, in_process_contracts: Contracts) -> Iterator[World]:
    if request.param == "fake":
        yield FakeWorld()
        return
    tester = in_process_contracts.w3.provider.ethereum_tester  # type: ignore[attr-defined]
    snapshot = tester.take_snapshot()
    try:
        yield Web3World(in_process_contracts)
    finally:
        tester.revert_to_snapshot(snapshot)


# ------------------------------------------------------------------ the conformance suite


def test_run_info_reports_the_opened_run(world: World) -> None:
    run_id = world.open_run(5 * ETH)
    run = world.port.run_info(run_id)
    assert run == RunInfo(
        run_id, world.sponsor, 3, 600, 10, ETH, 600, 2 * ETH, 5 * ETH, False,
        RUN.model_config_hash, 10**14, RUN.dataset_hash,
    )  # fmt: skip
    assert world.port.run_info(run_id + 1) is None


def test_node_info_by_address_carries_the_peer_id_of_its_key(world: World) -> None:
    key: LocalAccount = Account.create()
    node = world.register(key, 3 * ETH)
    info = world.port.node_info(node)
    assert info is not None
    assert (info.node_address, info.peer_id, info.stake_wei, info.active) == (
        node, peer_id_of_public_key(node_public_key(key.key)), 3 * ETH, True
    )  # fmt: skip
    assert (info.gpu_model, info.memory_mib, info.throughput, info.max_in_flight) == (
        CAPACITY.as_tuple()
    )
    assert world.port.node_info(node.lower()) == info
    assert world.port.node_info(Account.create().address) is None


def test_admission_needs_a_run_member_or_data_node_active_and_staked(world: World) -> None:
    run_id = world.open_run(ETH)
    staked = world.register(Account.create(), 2 * ETH)
    assert not world.port.is_admitted(run_id, staked)  # registered, not joined
    world.join(run_id, staked)
    assert world.port.is_admitted(run_id, staked)
    assert not world.port.is_admitted(run_id + 1, staked)  # no such run
    assert not world.port.is_admitted(run_id, Account.create().address)  # unknown node
    data = world.register(Account.create(), 2 * ETH, by_sponsor=True)
    assert not world.port.is_admitted(run_id, data)
    world.add_data_node(run_id, data)
    assert world.port.is_admitted(run_id, data)
    leaver = world.register(Account.create(), 2 * ETH)
    world.join(run_id, leaver)
    world.leave(run_id, leaver)
    assert not world.port.is_admitted(run_id, leaver)  # left the run
    world.unstake(staked)
    assert not world.port.is_admitted(run_id, staked)  # left the active set
    assert world.port.node_info(staked).active is False  # type: ignore[union-attr]


def test_a_data_node_is_one_the_sponsor_named_whatever_its_stake(world: World) -> None:
    run_id = world.open_run(ETH)
    member = world.register(Account.create(), 2 * ETH)
    world.join(run_id, member)
    data = world.register(Account.create(), 2 * ETH, by_sponsor=True)
    assert not world.port.is_data_node(run_id, data)
    world.add_data_node(run_id, data)
    assert world.port.is_data_node(run_id, data)
    assert world.port.is_data_node(run_id, data.lower())
    assert not world.port.is_data_node(run_id, member)  # a member is no data node
    assert not world.port.is_data_node(run_id + 1, data)  # of its own run only
    assert not world.port.is_data_node(run_id, "not an address")


# ------------------------------------------------------------------ boundary errors


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_rpc_is_one_actionable_chain_error() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ChainUnavailable) as info:
        connect(url, timeout_s=2)
    assert str(info.value) == (
        f"cannot reach chain RPC at {url}; start `gwtf-node devnet` or pass --rpc-url"
    )
    assert info.value.exit_code == 3


def test_unfunded_wallet_is_a_wallet_error_in_process_and_over_rpc(
    in_process_contracts: Contracts, rpc_contracts: Contracts
) -> None:
    for contracts in (in_process_contracts, rpc_contracts):
        pauper = Sender.from_account(Account.create())
        with pytest.raises(InsufficientFunds) as info:
            register_node(contracts, pauper, Account.create().key, CAPACITY, ETH)
        assert info.value.exit_code == 4
        assert "holds 0 ETH" in str(info.value) and "gwtf-node fund" in str(info.value)
        # Gas alone: a zero-value transaction from an empty wallet.
        with pytest.raises(InsufficientFunds):
            join_run(contracts, pauper, 1, Account.create().address)


def test_revert_over_json_rpc_decodes_to_the_custom_error(
    rpc_contracts: Contracts, devnet_file: object
) -> None:
    wallet = Sender.unlocked(rpc_contracts.w3.eth.accounts[3])
    key = Account.create()
    minimum = call(rpc_contracts.registry.functions.minStakeWei())
    with pytest.raises(ContractRevert) as info:
        register_node(rpc_contracts, wallet, key.key, CAPACITY, minimum // 2)
    assert info.value.name == "InsufficientStake"
    node, staked, required = info.value.args
    assert (Web3.to_checksum_address(node), staked, required) == (
        key.address,
        minimum // 2,
        minimum,
    )
    assert "send at least the minimum stake" in str(info.value)
    # A view that reverts takes web3's ContractLogicError path over HTTP.
    with pytest.raises(ContractRevert) as view:
        call(rpc_contracts.ledger.functions.currentEpoch(999))
    assert (view.value.name, view.value.args) == ("UnknownRun", (999,))


def test_revert_at_estimation_is_decoded_too(rpc_contracts: Contracts) -> None:
    c = rpc_contracts
    estimating = Contracts(c.w3, c.registry, c.ledger, c.disputes, c.court)
    wallet = Sender.unlocked(rpc_contracts.w3.eth.accounts[4])
    with pytest.raises(ContractRevert) as info:
        join_run(estimating, wallet, 12345, Account.create().address)
    assert info.value.name == "UnknownRun"


def test_local_key_wallet_signs_over_rpc(rpc_contracts: Contracts, devnet: object) -> None:
    faucet = Sender.unlocked(rpc_contracts.w3.eth.accounts[6])
    volunteer = Sender.from_account(Account.create())
    from gwtf.node.chain.actions import transfer_eth

    transfer_eth(rpc_contracts.w3, faucet, volunteer.address, 3 * ETH)
    key = Account.create()
    receipt = register_node(rpc_contracts, volunteer, key.key, CAPACITY, 2 * ETH)
    assert receipt["status"] == 1
    info = rpc_contracts.port().node_info(key.address)
    assert info is not None and info.operator == volunteer.address
    assert Web3.to_checksum_address(receipt["from"]) == volunteer.address


def test_contracts_not_wired_to_each_other_are_refused() -> None:
    """A registry whose slasher is not the suite's Disputes could let anyone slash, a court
    that takes cases from someone else could rule for them: the node refuses to work with
    either."""
    from gwtf.contracts.bindings import SuiteParams, deploy_contract, deploy_court
    from gwtf.errors import ChainError

    w3 = connect(None)
    deployer = w3.eth.accounts[0]
    registry = deploy_contract(w3, "NodeRegistry", deployer, ETH, 10_000, deployer)
    ledger = deploy_contract(w3, "WorkLedger", deployer, registry.address, deployer)
    court = deploy_court(w3, deployer, registry.address, SuiteParams())
    disputes = deploy_contract(
        w3, "Disputes", deployer, registry.address, ledger.address, court.address, 500, 10**17,
        20,
    )  # fmt: skip
    addresses = {
        "NodeRegistry": registry.address, "WorkLedger": ledger.address,
        "Disputes": disputes.address, "Court": court.address,
    }  # fmt: skip
    with pytest.raises(
        ChainError, match=r"Court\.arbitrable, NodeRegistry\.slasher, WorkLedger\.disputes"
    ):
        Contracts.at(w3, addresses)
