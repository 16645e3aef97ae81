"""The devnet: eth-tester served over HTTP JSON-RPC, contracts deployed, file for other clients."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from contracts.bindings import attach
from node.chain.adapter import advance_time
from node.chain.deployment import read_devnet_file
from node.devnet.rpc import EthTesterRpc, to_json_rpc
from node.devnet.server import RunningDevnet


def post(url: str, body: bytes) -> Any:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_second_client_sees_the_deployed_contracts(devnet: RunningDevnet, rpc_w3: Web3) -> None:
    info = devnet.info
    assert info.rpc_url.startswith("http://127.0.0.1:")
    assert set(info.contracts) == {"NodeRegistry", "WorkLedger", "Disputes"}
    assert rpc_w3.eth.chain_id == info.chain_id
    for name, address in info.contracts.items():
        assert len(rpc_w3.eth.get_code(Web3.to_checksum_address(address))) > 100
        assert attach(rpc_w3, name, address).address == address
    registry = attach(rpc_w3, "NodeRegistry", info.contracts["NodeRegistry"])
    ledger = attach(rpc_w3, "WorkLedger", info.contracts["WorkLedger"])
    assert registry.functions.slasher().call() == info.contracts["Disputes"]
    assert ledger.functions.disputes().call() == info.contracts["Disputes"]
    assert registry.functions.minStakeWei().call() > 0


def test_devnet_file_round_trips_and_lists_funded_dev_accounts(
    devnet: RunningDevnet, rpc_w3: Web3, devnet_file: Path
) -> None:
    assert read_devnet_file(devnet_file) == devnet.info
    accounts = devnet.info.accounts
    assert len(accounts) == 10
    for account in accounts:
        assert Account.from_key(account.private_key).address == account.address
        assert rpc_w3.eth.get_balance(account.address) > 10**20


def test_signed_raw_transactions_and_receipts_over_http(
    rpc_w3: Web3, devnet: RunningDevnet
) -> None:
    sender = Account.from_key(devnet.info.accounts[5].private_key)
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


def test_time_can_be_moved_forward_over_rpc(rpc_w3: Web3) -> None:
    before = rpc_w3.eth.get_block("latest")["timestamp"]
    after = advance_time(rpc_w3, 3_600)
    assert after >= before + 3_599


def test_malformed_requests_get_json_rpc_errors(devnet: RunningDevnet) -> None:
    url = devnet.info.rpc_url
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
    assert int(batch[0]["result"], 16) == devnet.info.chain_id


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
