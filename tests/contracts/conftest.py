"""A real eth-tester (py-evm) chain with the GWTF suite deployed once per session; every test
starts from a snapshot of that state and the chain is rolled back after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eth_tester import EthereumTester
from web3 import EthereumTesterProvider, Web3

from contracts.bindings import SuiteParams, deploy_suite
from tests.contracts.world import ETH, NodeKey, World


@pytest.fixture(scope="session")
def deployed_world() -> World:
    tester = EthereumTester()
    w3 = Web3(EthereumTesterProvider(tester))
    params = SuiteParams(
        min_stake_wei=10**18,
        unbonding_delay_s=10_000,
        reveal_period_s=600,
        index_challenge_bond_wei=10**16,
        bounty_bps=5_000,
    )
    suite = deploy_suite(w3, w3.eth.accounts[0], params)
    return World(tester=tester, w3=w3, suite=suite, params=params)


@pytest.fixture
def world(deployed_world: World) -> Iterator[World]:
    snapshot = deployed_world.tester.take_snapshot()
    try:
        yield deployed_world
    finally:
        deployed_world.tester.revert_to_snapshot(snapshot)


@pytest.fixture
def pair(world: World) -> tuple[World, int, NodeKey, NodeKey]:
    """Nodes a (stake 2 ETH, wallet 0) and b (stake 4 ETH, wallet 1) in a fresh run, epoch 0."""

    def build() -> tuple[int, NodeKey, NodeKey]:
        a = world.register("a", world.wallet(0), 2 * ETH)
        b = world.register("b", world.wallet(1), 4 * ETH)
        run = world.open_run()
        world.join(run, a, world.wallet(0))
        world.join(run, b, world.wallet(1))
        return run, a, b

    run, a, b = world.scenario("pair", build)
    return world, run, a, b
