"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import pytest

from gwtf.contracts.bindings import SuiteParams, deploy_suite
from gwtf.node.chain.actions import Contracts, RunConfig, open_run
from gwtf.node.chain.adapter import Sender, connect
from tests.node.conftest import TEST_GAS_LIMIT

ETH = 10**18


@pytest.fixture(scope="module")
def chain() -> tuple[Contracts, int]:
    """eth-tester with the contracts deployed and a run open: (contracts, run id)."""
    w3 = connect(None)
    suite = deploy_suite(w3, w3.eth.accounts[0], SuiteParams(min_stake_wei=ETH))
    contracts = Contracts.at(w3, suite.addresses, gas_limit=TEST_GAS_LIMIT)
    run = RunConfig(b"\x01" * 32, b"\x02" * 32, 2, 600, 10, ETH, 600, 2 * ETH, 10**14)
    run_id = open_run(contracts, Sender.unlocked(w3.eth.accounts[1]), run, 5 * ETH)
    return contracts, run_id
