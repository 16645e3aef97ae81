"""Shared fixtures of the node tests: one devnet (anvil, as `gwtf-node devnet` starts it) over
real HTTP JSON-RPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from web3 import Web3

from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import connect
from gwtf.node.devnet.server import RunningDevnet, start_devnet

# Low scrypt cost keeps keystore tests in milliseconds; the file format is unchanged.
FAST_SCRYPT_N = 2**4
# A fixed gas limit skips gas estimation, slow on eth-tester (see transact_as).
TEST_GAS_LIMIT = 1_500_000


@pytest.fixture(scope="session")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDevnet]:
    """`gwtf-node devnet`'s chain on an ephemeral port, contracts deployed, file written."""
    out = tmp_path_factory.mktemp("devnet") / "devnet.json"
    running = start_devnet("127.0.0.1", 0, None, out)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def devnet_file(devnet: RunningDevnet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gwtf.node.chain.deployment import write_devnet_file

    return write_devnet_file(tmp_path_factory.mktemp("devnet-copy") / "devnet.json", devnet.info)


@pytest.fixture
def rpc_w3(devnet: RunningDevnet) -> Web3:
    """A second, independent client of the devnet, over HTTP."""
    return connect(devnet.info.rpc_url)


@pytest.fixture
def rpc_contracts(rpc_w3: Web3, devnet: RunningDevnet) -> Contracts:
    return Contracts.at(rpc_w3, devnet.info.contracts, gas_limit=TEST_GAS_LIMIT)
