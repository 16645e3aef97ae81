"""The swarm's chain: its run opened, each relay staked and in the run and the data node named
by the sponsor, admission from the node's settings file (the devnet served over real HTTP
JSON-RPC, as the node processes see it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
import trio
from libp2p.peer.id import ID

from gwtf.errors import ConfigError
from gwtf.node.chain.actions import DATASET_HASH, Contracts, RunModel
from gwtf.node.chain.adapter import Sender, connect
from gwtf.node.chain.wallet import open_wallet, read_keystore_address
from gwtf.node.composition import admission_from_settings, try_domain_from_settings
from gwtf.node.devnet.server import RunningDevnet
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN, try_token_domain
from gwtf.node.settings import load_settings
from gwtf.node.swarm.chain import (
    ChainPlan,
    SwarmChain,
    chain_facts,
    child_env,
    open_swarm_run,
    start_swarm_chain,
)
from gwtf.node.training.settings import TrainingSettings
from tests.node.conftest import TEST_GAS_LIMIT

ETH = 10**18


def run_model(stages: int) -> RunModel:
    return RunModel.of(TrainingSettings(model="gpt-tiny", stages=stages))


@pytest.fixture(scope="module")
def swarm_chain(devnet: RunningDevnet, tmp_path_factory: pytest.TempPathFactory) -> SwarmChain:
    w3 = connect(devnet.info.rpc_url)
    rpc_contracts = Contracts.at(w3, devnet.info.contracts, gas_limit=TEST_GAS_LIMIT)
    sponsor = Sender.unlocked(devnet.info.accounts[0].address)
    out = tmp_path_factory.mktemp("swarm")
    plan = ChainPlan(stake_eth=1.5, reward_pool_eth=4.0)
    chain = open_swarm_run(rpc_contracts, sponsor, plan, out, run_model(2))
    chain.rpc_url = devnet.info.rpc_url
    chain.register("data", capacity=2, data_node=True)
    chain.register("relay-1-0", capacity=2)
    return chain


def test_the_run_is_open_with_its_pool_and_every_node_is_a_staked_member(
    swarm_chain: SwarmChain,
) -> None:
    port = swarm_chain.contracts.port()
    run = port.run_info(swarm_chain.run_id)
    assert run is not None and run.stage_count == 2 and run.balance_wei == 4 * ETH
    assert run.min_stake_wei == 3 * ETH // 2
    for node in swarm_chain.registered.values():
        assert swarm_chain.is_member(node.peer_id)
        info = port.node_info(node.node_address)
        assert info is not None and info.active and info.stake_wei == 3 * ETH // 2
        assert info.operator == node.wallet
        assert ID(info.peer_id).to_base58() == node.peer_id
    # The data node is the sponsor's: its wallet is the sponsor's, and it is named in the run.
    assert swarm_chain.registered["data"].wallet == swarm_chain.sponsor.address
    ledger = swarm_chain.contracts.ledger
    assert ledger.functions.wasDataNodeBefore(
        swarm_chain.run_id, swarm_chain.registered["data"].node_address, 2**40
    ).call()
    assert not swarm_chain.is_member(swarm_chain.peer_id_of("stranger"))


def test_wallets_are_encrypted_keystores_under_a_private_password_file(
    swarm_chain: SwarmChain,
) -> None:
    wallets = swarm_chain.wallets_dir
    password_file = wallets / "password"
    assert password_file.stat().st_mode & 0o077 == 0, "the password file is private"
    password = password_file.read_text().strip()
    node = swarm_chain.registered["relay-1-0"]
    keystore = wallets / "relay-1-0.json"
    assert password not in keystore.read_text()
    assert read_keystore_address(keystore) == node.wallet
    assert open_wallet(keystore, password).address == node.wallet
    assert password not in repr(swarm_chain)


def test_a_node_with_admission_on_admits_members_and_refuses_strangers(
    swarm_chain: SwarmChain, devnet_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "node.toml"
    chain = {"admission": True, "run_id": swarm_chain.run_id, "devnet_file": str(devnet_file)}
    config.write_text(tomli_w.dumps({"chain": chain}))
    admission = admission_from_settings(load_settings(env={}, config_file=config))
    assert admission is not None
    member = swarm_chain.registered["data"].peer_id
    stranger = swarm_chain.peer_id_of("stranger")

    async def ask() -> tuple[bool, bool]:
        return await admission(member), await admission(stranger)

    assert trio.run(ask) == (True, False)


def test_a_node_on_the_chain_signs_and_checks_try_tokens_under_its_chain_and_ledger(
    swarm_chain: SwarmChain, devnet_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "node.toml"
    for on in ("admission", "receipts"):
        chain = {on: True, "run_id": swarm_chain.run_id, "devnet_file": str(devnet_file)}
        config.write_text(tomli_w.dumps({"chain": chain}))
        domain = try_domain_from_settings(load_settings(env={}, config_file=config))
        contracts = swarm_chain.contracts
        assert domain == try_token_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
    config.write_text(tomli_w.dumps({"chain": {"run_id": swarm_chain.run_id}}))
    assert try_domain_from_settings(load_settings(env={}, config_file=config)) == (
        NO_CHAIN_TRY_DOMAIN
    )


def test_chain_facts_name_the_refused_peers(swarm_chain: SwarmChain) -> None:
    stranger = swarm_chain.peer_id_of("stranger")
    statuses = {
        "data": {"refused": {stranger: 3}},
        "relay-1-0": {"refused": {stranger: 1}},
        "stranger-1-0": {"refused": {}, "hops_recorded": 0},
    }
    facts = chain_facts(swarm_chain, {"stranger-1-0": stranger}, statuses)  # type: ignore[arg-type]
    assert facts["run_id"] == swarm_chain.run_id and facts["enabled"] is True
    assert {n["node"] for n in facts["registered_nodes"]} == {"data", "relay-1-0"}
    assert facts["refused_peers"] == [
        {
            "peer_id": stranger,
            "node": "stranger-1-0",
            "registered": False,
            "refused_by": {"data": 3, "relay-1-0": 1},
        }
    ]
    assert facts["strangers"] == {"stranger-1-0": {"peer_id": stranger, "hops_recorded": 0}}
    assert chain_facts(None, {}, {}) == {"enabled": False}


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({"enabled": "yes"}, "[chain] enabled='yes'"),
        ({"rpc_url": "localhost:8545"}, "[chain] rpc_url='localhost:8545'"),
        ({"devnet_file": "d.json"}, "[chain] devnet_file needs rpc_url"),
        ({"stake_eth": 0}, "[chain] stake_eth=0"),
        ({"stake_eth": 5.0, "fund_eth": 5.0}, "[chain] fund_eth=5.0 must exceed"),
        ({"host": "0.0.0.0"}, "[chain] host='0.0.0.0' must be an IP address"),
        ({"host": "chain.example"}, "[chain] host='chain.example' must be an IP address"),
    ],
)
def test_bad_chain_sections_are_refused(section: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        ChainPlan.from_section(section)
    assert fragment in str(info.value)


def test_a_swarm_can_use_a_running_chain_and_its_contracts(
    devnet: RunningDevnet, devnet_file: Path, tmp_path: Path
) -> None:
    plan = ChainPlan(rpc_url=devnet.info.rpc_url, devnet_file=str(devnet_file))
    chain = start_swarm_chain(plan, tmp_path, run_model(3), DATASET_HASH, log=None)
    assert chain.devnet is None, "no devnet of its own"
    assert chain.contracts.registry.address == devnet.info.contracts["NodeRegistry"]
    run = chain.contracts.port().run_info(chain.run_id)
    assert run is not None and run.stage_count == 3
    assert (tmp_path / "devnet.json").read_text() == devnet_file.read_text()
    assert chain.scrypt_n is None, "keystores for a chain not of our making keep full scrypt"


def test_a_swarm_deploys_the_contracts_on_a_running_chain_without_a_devnet_file(
    devnet: RunningDevnet, tmp_path: Path
) -> None:
    chain = start_swarm_chain(
        ChainPlan(rpc_url=devnet.info.rpc_url), tmp_path, run_model(2), DATASET_HASH, None
    )
    assert chain.contracts.registry.address != devnet.info.contracts["NodeRegistry"]
    assert chain.contracts.port().run_info(chain.run_id) is not None


def test_the_swarm_command_refuses_a_bad_swarm_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gwtf.node.cli.main import main

    swarm_file = tmp_path / "swarm.toml"
    swarm_file.write_text("[chain]\nstake_eth = 3.0\nfund_eth = 1.0\n")
    code = main(["swarm", "--swarm-file", str(swarm_file), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gwtf-node: error: [chain] fund_eth=1.0 must exceed stake_eth=3.0")
    assert err.count("\n") == 1


def test_swarm_processes_do_not_inherit_the_callers_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GWTF_CHAIN_RUN_ID", "9")
    monkeypatch.setenv("GWTF_RPC_TOKEN", "t0ken")
    monkeypatch.setenv("GWTF_LOG_LEVEL", "DEBUG")
    env = child_env()
    assert "GWTF_CHAIN_RUN_ID" not in env, "it would outrank the node's settings file"
    assert env["GWTF_RPC_TOKEN"] == "t0ken" and env["OMP_NUM_THREADS"] == "1"
    assert env["GWTF_LOG_LEVEL"] == "DEBUG", "the caller chooses how much the nodes log"


def test_a_swarm_serves_its_devnet_on_the_host_its_plan_names(tmp_path: Path) -> None:
    chain = start_swarm_chain(
        ChainPlan(host="127.0.0.2"), tmp_path, run_model(2), DATASET_HASH, None
    )
    try:
        assert chain.rpc_url.startswith("http://127.0.0.2:"), chain.rpc_url
        assert chain.contracts.port().run_info(chain.run_id) is not None
    finally:
        chain.stop()
