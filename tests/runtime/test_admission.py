"""Only peers bound on chain to a staked node of the run are served (real libp2p, eth-tester)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from eth_account import Account

from contracts.bindings import SuiteParams, deploy_suite
from node.chain import Sender, connect
from node.chain_actions import Capacity, Contracts, RunConfig, join_run, open_run, register_node
from node.p2p.host import full_address, peer_info, running_host
from node.p2p.identity import load_or_create_identity, peer_id_of
from node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from node.runtime.admission import RunAdmission
from tests.node.conftest import TEST_GAS_LIMIT

ETH = 10**18
ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(1024, 1024, 5.0)


@pytest.fixture(scope="module")
def chain() -> tuple[Contracts, int]:
    w3 = connect(None)
    suite = deploy_suite(w3, w3.eth.accounts[0], SuiteParams(min_stake_wei=ETH))
    contracts = Contracts.at(w3, suite.addresses, gas_limit=TEST_GAS_LIMIT)
    run = RunConfig(b"\x01" * 32, b"\x02" * 32, 2, 600, 10, ETH, 600, 2 * ETH)
    run_id = open_run(contracts, Sender.unlocked(w3.eth.accounts[1]), run, 5 * ETH)
    return contracts, run_id


def register_and_join(contracts: Contracts, run_id: int, peer_id: bytes, stake_wei: int) -> None:
    wallet = Sender.unlocked(contracts.w3.eth.accounts[2])
    node = Account.create()
    capacity = Capacity("cpu", 1024, 10, 2)
    register_node(contracts, wallet, node.key, peer_id, capacity, stake_wei)
    join_run(contracts, wallet, run_id, node.address)


def test_staked_member_is_served_and_strangers_are_refused(
    tmp_path: Path, chain: tuple[Contracts, int]
) -> None:
    contracts, run_id = chain
    member_key = load_or_create_identity(tmp_path / "member.key")
    stranger_key = load_or_create_identity(tmp_path / "stranger.key")
    register_and_join(contracts, run_id, peer_id_of(member_key).to_bytes(), 2 * ETH)
    admission = RunAdmission(contracts.port(), run_id)

    async def echo(_peer: str, request: bytes) -> bytes:
        return request

    async def main() -> None:
        server_key = load_or_create_identity(tmp_path / "server.key")
        async with (
            running_host(server_key) as server_host,
            running_host(member_key) as member_host,
            running_host(stranger_key) as stranger_host,
        ):
            server = RequestResponse(server_host, admit=admission)
            server.serve(ECHO, echo, LIMITS)
            for client in (member_host, stranger_host):
                await client.connect(peer_info(full_address(server_host)))
            member, stranger = RequestResponse(member_host), RequestResponse(stranger_host)
            with trio.fail_after(30):
                assert await member.request(server_host.get_id(), ECHO, b"hi", LIMITS) == b"hi"
                with pytest.raises(PeerUnavailable):
                    await stranger.request(server_host.get_id(), ECHO, b"hi", LIMITS)
            assert server.refused == {str(stranger_host.get_id()): 1}

    trio.run(main)
