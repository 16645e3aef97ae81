"""A real eth-tester (py-evm) chain with the GWTF suite deployed once per session; every test
starts from a snapshot of that state and the chain is rolled back after it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from eth_tester import EthereumTester
from web3 import EthereumTesterProvider, Web3

from gwtf.contracts.bindings import SuiteParams, deploy_suite
from gwtf.contracts.certificate_tree import CertificateTree
from gwtf.contracts.encoding import CertRef
from tests.contracts.jury import Juror, seat_jurors
from tests.contracts.world import ETH, NodeKey, World

# 2 epochs + the challenge window (4,000 s) fit in the unbonding delay, as openRun requires.
# The court's windows are a few blocks, so that a test mines through a whole case.
TEST_PARAMS = SuiteParams(
    min_stake_wei=ETH, unbonding_delay_s=10_000, bounty_bps=500, court_fee_wei=10**15,
    court_phase_blocks=20, court_draw_delay_blocks=2, court_min_pool=7,
)  # fmt: skip


@pytest.fixture(scope="session")
def deployed_world() -> World:
    tester = EthereumTester()
    w3 = Web3(EthereumTesterProvider(tester))
    suite = deploy_suite(w3, w3.eth.accounts[0], TEST_PARAMS)
    return World(tester=tester, w3=w3, suite=suite, params=TEST_PARAMS)


@pytest.fixture
def world(deployed_world: World) -> Iterator[World]:
    snapshot = deployed_world.tester.take_snapshot()
    try:
        yield deployed_world
    finally:
        deployed_world.tester.revert_to_snapshot(snapshot)


@dataclass(frozen=True)
class Staffed:
    """A run in epoch 0 with its data node and three relays, all staked and in the run."""

    w: World
    run: int
    data: NodeKey  # the sponsor's data node, 2 ETH
    a: NodeKey  # wallet 0, 2 ETH
    b: NodeKey  # wallet 1, 4 ETH
    c: NodeKey  # wallet 2, 2 ETH


@pytest.fixture
def staffed(world: World) -> Staffed:
    def build() -> tuple[int, NodeKey, NodeKey, NodeKey, NodeKey]:
        data = world.register("data", world.sponsor, 2 * ETH)
        a = world.register("a", world.wallet(0), 2 * ETH)
        b = world.register("b", world.wallet(1), 4 * ETH)
        c = world.register("c", world.wallet(2), 2 * ETH)
        run = world.open_run()
        world.add_data_node(run, data)
        for key, i in ((a, 0), (b, 1), (c, 2)):
            world.join(run, key, world.wallet(i))
        return run, data, a, b, c

    run, data, a, b, c = world.scenario("staffed", build)
    return Staffed(world, run, data, a, b, c)


@dataclass(frozen=True)
class Certified(Staffed):
    """Staffed, with the data node's honest certificate of 4 microbatches through a (stage 1)
    and b (stage 2) submitted for epoch 0."""

    tree: CertificateTree
    cert: CertRef


@pytest.fixture
def certified(staffed: Staffed) -> Certified:
    w = staffed.w

    def build() -> tuple[CertificateTree, CertRef]:
        hops = w.pipeline_hops(staffed.run, 0, staffed.data, [staffed.a, staffed.b], range(4))
        tree = w.certificate_tree(hops)
        return tree, w.certify(tree, staffed.run, 0, staffed.data)

    tree, cert = w.scenario("certified", build)
    return Certified(w, staffed.run, staffed.data, staffed.a, staffed.b, staffed.c, tree, cert)


@dataclass(frozen=True)
class Juried(Certified):
    """Certified, with eight juror nodes (1 ETH stake, 0.1 ETH court deposit, each from a
    wallet of its own)."""

    jurors: list[Juror]


@pytest.fixture
def juried(certified: Certified) -> Juried:
    w = certified.w
    jurors = w.scenario("juried", lambda: seat_jurors(w))
    c = certified
    return Juried(w, c.run, c.data, c.a, c.b, c.c, c.tree, c.cert, jurors)
