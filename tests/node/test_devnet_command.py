"""`gwtf-node devnet` as a process: anvil with the contracts, trusted by a plain web3 client
(chain id, reverts as custom errors, logs by block hash, blocks with standard keys, time moved
on), anvil ending with the command however it ends, the eth-tester fallback, and bad input.

Tests here need the anvil that `make install` installs: where it is missing they fail."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from gwtf.contracts.bindings import ContractRevert
from gwtf.errors import ChainError
from gwtf.node.chain.actions import (
    Capacity,
    Contracts,
    register_node,
    request_unstake,
    withdraw_stake,
)
from gwtf.node.chain.adapter import Sender, advance_time, connect
from gwtf.node.devnet.anvil import CHAIN_ID, DEFAULT_ANVIL, is_runnable, start_anvil
from tests.node.test_cli import REPO, assert_one_line_error, subprocess_env

START_TIMEOUT_S = 60.0
ETH = 10**18
NODE_STATUS_ACTIVE = 1
UNBONDING_DELAY_S = 7 * 24 * 3600  # SuiteParams' default, which the devnet deploys with


def devnet_argv(devnet_file: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gwtf.node.cli", "--devnet-file", str(devnet_file), "devnet",
            "--port", "0", *extra]  # fmt: skip


def start_command(devnet_file: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start `gwtf-node devnet --json` in its own session (as a terminal would) and read the
    devnet's JSON line."""
    proc = subprocess.Popen(
        devnet_argv(devnet_file, "--json", *extra), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=REPO, env=subprocess_env(),
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"the devnet printed nothing within {START_TIMEOUT_S:g} s: {err}")
    return proc, json.loads(line)


def anvils_of(folder: Path) -> list[int]:
    """Live anvil processes writing their log into ``folder`` (a test's own), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            stdout = os.readlink(entry / "fd" / "1")
        except OSError:
            continue
        if name == "anvil" and state != "Z" and Path(stdout).parent == folder:
            found.append(int(entry.name))
    return found


def answers(url: str) -> bool:
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bool(response.read())
    except OSError:
        return False


def wait_until_gone(marker: Path, url: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not anvils_of(marker) and not answers(url):
            return
        time.sleep(0.1)
    pytest.fail(f"anvil outlived its devnet command: pids {anvils_of(marker)}")


def rpc(url: str, method: str, params: list[Any]) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["result"]


@pytest.fixture(autouse=True)
def anvil_is_installed() -> None:
    # Not a skip: CI runs `make install` first, so a missing binary is a broken install.
    assert is_runnable(DEFAULT_ANVIL), f"no anvil at {DEFAULT_ANVIL}: run `make install`"


def test_the_devnet_command_serves_anvil_that_a_plain_web3_client_trusts(tmp_path: Path) -> None:
    devnet_file = tmp_path / "devnet.json"
    proc, info = start_command(devnet_file)
    try:
        w3 = Web3(Web3.HTTPProvider(info["rpc_url"]))
        assert info["rpc_url"].startswith("http://127.0.0.1:")
        assert w3.client_version.startswith("anvil/")
        assert w3.eth.chain_id == CHAIN_ID == info["chain_id"] == int(w3.net.version)
        assert json.loads(devnet_file.read_text()) == info
        for address in info["contracts"].values():
            assert len(w3.eth.get_code(Web3.to_checksum_address(address))) > 100
        assert len(anvils_of(tmp_path)) == 1

        contracts = Contracts.at(connect(info["rpc_url"]), info["contracts"])  # gas estimated
        wallet = Sender.from_account(Account.from_key(info["accounts"][1]["private_key"]))
        node_key = Account.create()
        receipt = register_node(
            contracts, wallet, bytes(node_key.key), Capacity("cpu", 1024, 3600, 2), 2 * ETH
        )
        info_now = contracts.port().node_info(node_key.address)
        assert info_now is not None and info_now.stake_wei == 2 * ETH and info_now.active

        # Logs by the block's hash, and from "earliest" (the deployment's own events too).
        by_hash = w3.eth.get_logs({"blockHash": receipt["blockHash"]})
        assert [log["transactionHash"] for log in by_hash] == [
            log["transactionHash"] for log in receipt["logs"]
        ]
        everything = w3.eth.get_logs({"fromBlock": "earliest", "toBlock": "latest"})
        assert len(everything) > len(by_hash)
        # A block's full transactions come with the standard camelCase keys.
        block = rpc(info["rpc_url"], "eth_getBlockByHash", [receipt["blockHash"].to_0x_hex(), True])
        assert {"blockNumber", "gasPrice", "transactionIndex"} <= set(block["transactions"][0])

        # Reverts decode as the contract's custom error, estimated or with a fixed gas limit.
        with pytest.raises(ContractRevert) as not_unbonding:
            withdraw_stake(contracts, wallet, node_key.address)
        assert not_unbonding.value.name == "NodeNotUnbonding"
        assert not_unbonding.value.args == (node_key.address, NODE_STATUS_ACTIVE)
        request_unstake(contracts, wallet, node_key.address)
        fixed_gas = Contracts.at(contracts.w3, info["contracts"], gas_limit=1_500_000)
        with pytest.raises(ContractRevert) as locked:
            withdraw_stake(fixed_gas, wallet, node_key.address)
        assert locked.value.name == "StakeStillLocked"
        node, unlock_at, now = locked.value.args
        assert node == node_key.address and unlock_at - now > UNBONDING_DELAY_S - 60

        # The unbonding delay passes when the clock is moved on.
        before = w3.eth.get_balance(wallet.address)
        assert advance_time(contracts.w3, UNBONDING_DELAY_S) >= unlock_at
        withdraw_stake(fixed_gas, wallet, node_key.address)
        assert w3.eth.get_balance(wallet.address) > before + 2 * ETH - ETH // 100

        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until_gone(tmp_path, info["rpc_url"])
    assert not devnet_file.exists(), "the devnet file names a chain that is gone"


# SIGKILL (nothing of the command runs) by default; SIGTERM in the slow run.
@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGTERM, id="sigterm", marks=pytest.mark.slow),
        pytest.param(signal.SIGKILL, id="sigkill"),
    ],
)
def test_anvil_ends_with_the_devnet_command_however_it_ends(
    tmp_path: Path, signum: signal.Signals
) -> None:
    devnet_file = tmp_path / "devnet.json"
    proc, info = start_command(devnet_file)
    try:
        assert len(anvils_of(tmp_path)) == 1
        os.kill(proc.pid, signum)  # the command alone, not its children
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until_gone(tmp_path, info["rpc_url"])
    if signum == signal.SIGTERM:
        assert code == 0 and not devnet_file.exists()
    else:
        assert code == -signal.SIGKILL


def test_a_port_in_use_is_one_line_and_leaves_no_anvil(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*devnet_argv(tmp_path / "devnet.json")[:-2], "--port", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO,
                              env=subprocess_env())  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert_one_line_error(done.stderr, f"cannot listen on 127.0.0.1:{port} (anvil: ")
    assert "Address already in use" in done.stderr
    assert not (tmp_path / "devnet.json").exists()
    assert not anvils_of(tmp_path)


def test_a_missing_anvil_is_an_error_when_asked_for(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-anvil"
    done = subprocess.run(
        devnet_argv(tmp_path / "devnet.json", "--backend", "anvil", "--anvil", str(missing)),
        capture_output=True, text=True, timeout=120, cwd=REPO, env=subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert_one_line_error(done.stderr, f"no anvil binary at {missing}; `make install` installs")
    assert not (tmp_path / "devnet.json").exists()


def test_an_anvil_that_exits_at_once_is_named_with_its_last_words(tmp_path: Path) -> None:
    broken = tmp_path / "anvil"
    broken.write_text("#!/bin/sh\necho 'error: unsupported hardfork' >&2\nexit 2\n")
    broken.chmod(0o755)
    done = subprocess.run(
        devnet_argv(tmp_path / "devnet.json", "--anvil", str(broken)),
        capture_output=True, text=True, timeout=120, cwd=REPO, env=subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert_one_line_error(
        done.stderr, "anvil exited with code 2 before it served (error: unsupported hardfork)"
    )
    assert not (tmp_path / "devnet.json").exists()


def test_without_anvil_the_embedded_chain_stands_in_and_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-anvil"
    proc, info = start_command(tmp_path / "devnet.json", "--anvil", str(missing))
    try:
        w3 = connect(info["rpc_url"])
        assert "EthereumTester" in w3.client_version
        assert w3.eth.chain_id == info["chain_id"]
        sender = Account.from_key(info["accounts"][2]["private_key"])
        tx = {"to": Account.create().address, "value": 7, "gas": 21_000, "chainId": w3.eth.chain_id,
              "maxFeePerGas": 3 * 10**9, "maxPriorityFeePerGas": 10**9, "nonce": 0}  # fmt: skip
        receipt = w3.eth.wait_for_transaction_receipt(
            w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
        )
        assert receipt["status"] == 1
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert err.splitlines() == [
        f"gwtf-node: no anvil binary at {missing} (npm has it for Linux and macOS, x64 and arm64); "
        "serving the embedded eth-tester chain instead"
    ]


def test_an_anvil_that_never_serves_is_given_up_on_and_ended(tmp_path: Path) -> None:
    mute = tmp_path / "anvil"
    mute.write_text("#!/bin/sh\necho 'Listening on 127.0.0.1:9'\nexec sleep 600\n")
    mute.chmod(0o755)
    log = tmp_path / "devnet-anvil.log"
    began = time.monotonic()
    with pytest.raises(ChainError) as refused:
        start_anvil(mute, "127.0.0.1", 0, log, timeout_s=1.0)
    assert time.monotonic() - began < 20
    assert str(refused.value) == (
        f"anvil was not serving chain {CHAIN_ID} within 1 s (Listening on 127.0.0.1:9); see {log}"
    )
    sleepers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _writes_to(p, log)]
    assert not sleepers, "the tether ended what it started"


def _writes_to(process: Path, log: Path) -> bool:
    try:
        return os.readlink(process / "fd" / "1") == str(log)
    except OSError:
        return False
