"""What a node's chain reads cost in JSON-RPC requests: one ``eth_call`` a view, nothing besides
(web3 asks for the chain id once per connection, and never for the accounts)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from gwtf.contracts.bindings import deploy_suite
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import connect
from gwtf.node.devnet.rpc import DevnetHttpServer, EthTesterRpc
from gwtf.node.devnet.server import DEVNET_PARAMS


class CountingRpc(EthTesterRpc):
    """The devnet's eth-tester JSON-RPC, counting the methods it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: Counter[str] = Counter()

    def call(self, method: str, params: list[Any]) -> Any:
        self.asked[method] += 1
        return super().call(method, params)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[CountingRpc, Contracts]]:
    rpc = CountingRpc()
    server = DevnetHttpServer(rpc).start_background()
    try:
        w3 = connect(server.url)
        suite = deploy_suite(w3, w3.eth.accounts[0], DEVNET_PARAMS)
        addresses = {
            "NodeRegistry": suite.registry.address,
            "WorkLedger": suite.ledger.address,
            "Disputes": suite.disputes.address,
            "Court": suite.court.address,
        }
        yield rpc, Contracts.at(connect(server.url), addresses)
    finally:
        server.shutdown()


def test_a_view_over_http_is_one_eth_call(served: tuple[CountingRpc, Contracts]) -> None:
    rpc, contracts = served
    contracts.registry.functions.slasher().call()  # the connection's first read
    rpc.asked.clear()
    contracts.check_wiring()  # eight views
    assert rpc.asked == Counter({"eth_call": 8})


def test_the_chain_id_is_asked_once_a_connection(served: tuple[CountingRpc, Contracts]) -> None:
    rpc, contracts = served
    rpc.asked.clear()
    fresh = Contracts(
        connect(contracts.w3.provider.endpoint_uri),  # type: ignore[attr-defined]
        contracts.registry, contracts.ledger, contracts.disputes, contracts.court,
    )  # fmt: skip
    assert fresh.w3.eth.chain_id == contracts.w3.eth.chain_id
    registry = fresh.w3.eth.contract(contracts.registry.address, abi=contracts.registry.abi)
    registry.functions.slasher().call()
    registry.functions.slasher().call()
    assert rpc.asked == Counter({"eth_chainId": 1, "eth_call": 2})


def test_the_embedded_chain_reads_without_asking_for_its_accounts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w3 = connect(None)
    suite = deploy_suite(w3, w3.eth.accounts[0], DEVNET_PARAMS)
    asked: list[str] = []
    request = w3.manager.request_blocking

    def counted(method: str, params: object, *args: object, **kwargs: object) -> object:
        asked.append(method)
        return request(method, params, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(w3.manager, "request_blocking", counted)
    suite.registry.functions.slasher().call()
    assert "eth_accounts" not in asked and asked.count("eth_call") == 1


def _proxied_by(monkeypatch: pytest.MonkeyPatch, proxy: str) -> None:
    """The environment names ``proxy`` for every plain HTTP request, and no exception."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)


def test_a_chain_on_this_machine_is_asked_past_the_environments_proxy(
    served: tuple[CountingRpc, Contracts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain HTTP to a loopback RPC reads nothing of the environment (``requests`` would look
    up its proxies, ``~/.netrc`` and CA bundle on every request): a proxy could not reach
    this machine's chain anyway."""
    _, contracts = served
    _proxied_by(monkeypatch, "http://127.0.0.1:9")  # the discard port: nothing answers
    url = contracts.w3.provider.endpoint_uri  # type: ignore[attr-defined]
    assert connect(url).eth.block_number == contracts.w3.eth.block_number


def test_a_remote_rpc_is_asked_through_the_environments_proxy(
    served: tuple[CountingRpc, Contracts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A volunteer behind a corporate proxy reaches a remote RPC through it: here the devnet's
    own server stands in as that proxy, for a name that resolves nowhere."""
    rpc, contracts = served
    _proxied_by(monkeypatch, contracts.w3.provider.endpoint_uri)  # type: ignore[attr-defined]
    rpc.asked.clear()
    assert connect("http://rpc.gwtf.invalid:8545").eth.chain_id == contracts.w3.eth.chain_id
    assert rpc.asked["eth_chainId"] == 1
