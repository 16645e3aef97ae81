"""The devnet in process, on anvil and on its fallback (eth-tester served over HTTP JSON-RPC):
contracts deployed, the devnet file for other clients, transactions (from several processes at
once) and time over RPC; and the fallback server's own JSON-RPC handling."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from gwtf.contracts.bindings import attach
from gwtf.node.chain.adapter import advance_time, connect
from gwtf.node.chain.deployment import read_devnet_file, write_devnet_file
from gwtf.node.devnet.rpc import EthTesterRpc, to_json_rpc
from gwtf.node.devnet.server import RunningDevnet, start_devnet

REPO = Path(__file__).resolve().parents[2]


def post(url: str, body: bytes) -> Any:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDevnet]:
    """The fallback: eth-tester in this process, served over HTTP."""
    out = tmp_path_factory.mktemp("embedded") / "devnet.json"
    running = start_devnet("127.0.0.1", 0, None, out, backend="eth-tester")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(params=["devnet", "embedded"], ids=["anvil", "eth-tester"])
def either(request: pytest.FixtureRequest) -> RunningDevnet:
    """Each backend in turn: the session's anvil devnet, then the embedded fallback."""
    running: RunningDevnet = request.getfixturevalue(request.param)
    return running


def test_the_session_devnet_is_anvil_and_the_fallback_is_eth_tester(
    devnet: RunningDevnet, embedded: RunningDevnet
) -> None:
    assert devnet.chain is not None and devnet.chain.name == "anvil", (
        "the devnet fell back to eth-tester: anvil is not installed (run `make install`)"
    )
    assert connect(devnet.info.rpc_url).client_version.startswith("anvil/")
    assert embedded.chain is not None and embedded.chain.name == "embedded eth-tester"
    assert "EthereumTester" in connect(embedded.info.rpc_url).client_version


def test_second_client_sees_the_deployed_contracts(either: RunningDevnet) -> None:
    info = either.info
    rpc_w3 = connect(info.rpc_url)
    assert info.rpc_url.startswith("http://127.0.0.1:")
    assert set(info.contracts) == {"NodeRegistry", "WorkLedger", "Disputes", "Court"}
    assert rpc_w3.eth.chain_id == info.chain_id
    for name, address in info.contracts.items():
        assert len(rpc_w3.eth.get_code(Web3.to_checksum_address(address))) > 100
        assert attach(rpc_w3, name, address).address == address
    registry = attach(rpc_w3, "NodeRegistry", info.contracts["NodeRegistry"])
    ledger = attach(rpc_w3, "WorkLedger", info.contracts["WorkLedger"])
    assert registry.functions.slasher().call() == info.contracts["Disputes"]
    assert ledger.functions.disputes().call() == info.contracts["Disputes"]
    court = attach(rpc_w3, "Court", info.contracts["Court"])
    assert court.functions.arbitrable().call() == info.contracts["Disputes"]
    assert registry.functions.minStakeWei().call() > 0


def test_devnet_file_round_trips_and_lists_funded_dev_accounts(
    either: RunningDevnet, tmp_path: Path
) -> None:
    rpc_w3 = connect(either.info.rpc_url)
    assert read_devnet_file(either.out_file) == either.info
    assert read_devnet_file(write_devnet_file(tmp_path / "copy.json", either.info)) == either.info
    accounts = either.info.accounts
    assert len(accounts) == 10
    for account in accounts:
        assert Account.from_key(account.private_key).address == account.address
        assert rpc_w3.eth.get_balance(account.address) > 10**20


def test_signed_raw_transactions_and_receipts_over_http(either: RunningDevnet) -> None:
    rpc_w3 = connect(either.info.rpc_url)
    sender = Account.from_key(either.info.accounts[5].private_key)
    receiver = Account.create().address
    tx = {
        "to": receiver,
        "value": 12345,
        "gas": 21_000,
        "maxFeePerGas": 3 * 10**9,
        "maxPriorityFeePerGas": 10**9,
        "nonce": rpc_w3.eth.get_transaction_count(sender.address),
        "chainId": rpc_w3.eth.chain_id,
    }
    tx_hash = rpc_w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
    receipt = rpc_w3.eth.wait_for_transaction_receipt(tx_hash)
    assert receipt["status"] == 1 and receipt["gasUsed"] == 21_000
    assert rpc_w3.eth.get_balance(receiver) == 12345


def test_the_network_id_is_the_chain_id(either: RunningDevnet) -> None:
    rpc_w3 = connect(either.info.rpc_url)
    assert int(rpc_w3.net.version) == rpc_w3.eth.chain_id == either.info.chain_id


def test_time_can_be_moved_forward_over_rpc(either: RunningDevnet) -> None:
    rpc_w3 = connect(either.info.rpc_url)
    before = rpc_w3.eth.get_block("latest")["timestamp"]
    after = advance_time(rpc_w3, 3_600)
    assert after >= before + 3_599


def test_the_fallback_answers_malformed_requests_with_json_rpc_errors(
    embedded: RunningDevnet,
) -> None:
    url = embedded.info.rpc_url
    assert post(url, b"{not json")["error"]["code"] == -32700
    unknown = post(url, b'{"jsonrpc":"2.0","id":1,"method":"eth_mineGold","params":[]}')
    assert unknown["error"]["code"] == -32601
    bad_params = post(url, b'{"jsonrpc":"2.0","id":2,"method":"eth_chainId","params":{}}')
    assert bad_params["error"]["code"] == -32602
    batch = post(
        url,
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]},'
        b'{"jsonrpc":"2.0","id":2,"method":"eth_blockNumber","params":[]}]',
    )
    assert [answer["id"] for answer in batch] == [1, 2]
    assert int(batch[0]["result"], 16) == embedded.info.chain_id


def test_results_are_standard_quantities() -> None:
    assert to_json_rpc({"n": 255, "ok": True, "b": b"\x01", "l": [None, "0xab"]}) == {
        "n": "0xff",
        "ok": True,
        "b": "0x01",
        "l": [None, "0xab"],
    }
    with pytest.raises(TypeError):
        to_json_rpc(object())


def test_dispatcher_serves_without_http() -> None:
    rpc = EthTesterRpc()
    answer = rpc.handle({"jsonrpc": "2.0", "id": 7, "method": "eth_accounts", "params": []})
    assert answer["id"] == 7 and len(answer["result"]) == 10
    assert rpc.handle({"jsonrpc": "2.0", "method": "eth_chainId", "params": []}) is None
    assert rpc.handle([])["error"]["code"] == -32600


SENDER = """
import sys
from eth_account import Account
from gwtf.node.chain.adapter import Sender, connect, send_transaction
w3, sender = connect(sys.argv[1]), Sender.from_account(Account.from_key(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    send_transaction(w3, sender, {"to": Account.create().address, "value": 1, "gas": 21_000})
"""


# Three processes importing the node each: the embedded server (this repository's own nonce
# handling) by default, anvil in the slow run.
@pytest.mark.parametrize(
    "either",
    [
        pytest.param("devnet", id="anvil", marks=pytest.mark.slow),
        pytest.param("embedded", id="eth-tester"),
    ],
    indirect=True,
)
def test_processes_sending_at_once_from_their_own_wallets_all_land(either: RunningDevnet) -> None:
    """Each process picks its nonces from the chain ("pending") while the others send."""
    rpc_w3 = connect(either.info.rpc_url)
    wallets = [account.private_key for account in either.info.accounts[6:9]]
    nonces = [rpc_w3.eth.get_transaction_count(Account.from_key(k).address) for k in wallets]
    senders = [
        subprocess.Popen([sys.executable, "-c", SENDER, either.info.rpc_url, key, "8"], cwd=REPO)
        for key in wallets
    ]
    assert [sender.wait(timeout=120) for sender in senders] == [0, 0, 0]
    for key, nonce in zip(wallets, nonces, strict=True):
        assert rpc_w3.eth.get_transaction_count(Account.from_key(key).address) == nonce + 8
