"""Only peers whose key is a staked node of the run on chain are served (real libp2p,
eth-tester); a peer whose id embeds no node key is refused without asking the chain."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from eth_account import Account
from trio.testing import MockClock

from gwtf.errors import ChainError
from gwtf.node.chain.actions import (
    Capacity,
    Contracts,
    add_data_node,
    join_run,
    register_node,
    request_unstake,
)
from gwtf.node.chain.adapter import FakeChain, Sender
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import identity_from_key, new_identity, node_address_of_peer, peer_id_of
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.runtime.discovery.admission import RunAdmission
from tests.runtime.conftest import ETH

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(1024, 1024, 5.0)


def register_and_join(contracts: Contracts, run_id: int, node_key: bytes, stake_wei: int) -> None:
    wallet = Sender.unlocked(contracts.w3.eth.accounts[2])
    node = Account.from_key(node_key)
    capacity = Capacity("cpu", 1024, 10, 2)
    register_node(contracts, wallet, node_key, capacity, stake_wei)
    join_run(contracts, wallet, run_id, node.address)


def test_staked_member_is_served_and_strangers_are_refused(
    tmp_path: Path, chain: tuple[Contracts, int]
) -> None:
    contracts, run_id = chain
    member = Account.create()
    member_key = identity_from_key(bytes(member.key))
    stranger_key = new_identity()
    register_and_join(contracts, run_id, bytes(member.key), 2 * ETH)
    admission = RunAdmission(contracts.port(), run_id)

    async def echo(_peer: str, request: bytes) -> bytes:
        return request

    async def main() -> None:
        server_key = new_identity()
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


def test_a_node_that_unstakes_loses_access_once_the_cache_expires(
    tmp_path: Path, chain: tuple[Contracts, int]
) -> None:
    contracts, run_id = chain
    wallet = Sender.unlocked(contracts.w3.eth.accounts[3])
    node = Account.create()
    peer = peer_id_of(identity_from_key(bytes(node.key)))
    register_node(contracts, wallet, node.key, Capacity("cpu", 1, 1, 1), 2 * ETH)
    join_run(contracts, wallet, run_id, node.address)
    admission = RunAdmission(contracts.port(), run_id, cache_s=30.0)
    clock = MockClock()  # trio's time stands still until the test moves it

    async def main() -> None:
        assert await admission(str(peer))
        request_unstake(contracts, wallet, node.address)
        assert await admission(str(peer)), "within the cache period the answer is reused"
        clock.jump(31.0)
        # The aged admission still serves this request; a lookup in the background renews it.
        assert await admission(str(peer)), "a hop never waits for the chain once admitted"
        assert await refused_soon(admission, str(peer)), "an unbonding node loses access"

    trio.run(main, clock=clock)


async def refused_soon(admission: RunAdmission, peer: str, within_s: float = 30.0) -> bool:
    """Whether the admission turns ``peer`` away within ``within_s`` of real time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not await admission(peer):
            return True
        await trio.sleep(0)
        time.sleep(0.01)  # the background lookup runs in a worker thread
    return False


class CountingChain(FakeChain):
    """A slow chain port that says yes to everyone and counts how often it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def is_admitted(self, run_id: int, node_address: str) -> bool:
        self.calls += 1
        time.sleep(0.2)
        return True


def test_a_burst_of_requests_from_one_peer_costs_one_chain_call(tmp_path: Path) -> None:
    peer = str(peer_id_of(new_identity()))
    port = CountingChain()
    admission = RunAdmission(port, 1)
    answers: list[bool] = []

    async def ask() -> None:
        answers.append(await admission(peer))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(ask)

    trio.run(main)
    assert answers == [True] * 10 and port.calls == 1


class FlakyChain(FakeChain):
    """A chain port whose endpoint is down until ``up`` is set."""

    up = False

    def is_admitted(self, run_id: int, node_address: str) -> bool:
        if not self.up:
            raise ChainError("http://127.0.0.1:1 is unreachable")
        return True


def test_an_unreachable_chain_refuses_for_now_and_asks_again(tmp_path: Path) -> None:
    peer = str(peer_id_of(new_identity()))
    port = FlakyChain()
    admission = RunAdmission(port, 1)

    async def main() -> None:
        assert not await admission(peer), "fail closed while the chain cannot answer"
        port.up = True
        assert await admission(peer), "the refusal was not remembered"

    trio.run(main)


def test_a_peer_whose_id_embeds_no_node_key_is_refused_without_a_chain_call() -> None:
    from libp2p.crypto.ed25519 import create_new_key_pair

    peer = str(peer_id_of(create_new_key_pair()))
    port = CountingChain()
    admission = RunAdmission(port, 1)

    async def main() -> None:
        assert not await admission(peer)

    trio.run(main)
    assert port.calls == 0


class MembersChain(FakeChain):
    """A chain port that admits exactly ``members`` (node addresses) and counts its calls."""

    def __init__(self, members: set[str]) -> None:
        super().__init__()
        self.members, self.calls = members, 0

    def is_admitted(self, run_id: int, node_address: str) -> bool:
        self.calls += 1
        return node_address in self.members


def test_a_flood_of_fresh_identities_costs_a_bounded_number_of_chain_calls() -> None:
    """1,000 fresh peer ids within 10 s: the chain is asked about at most the lookup budget's
    burst plus its rate over those seconds; a member admitted before the flood is served
    throughout without a lookup, and a member arriving during it gets in once it passes."""
    keys = [new_identity() for _ in range(1002)]
    peers = [str(peer_id_of(key)) for key in keys]
    old, late, flood = peers[0], peers[1], peers[2:]
    members = {node_address_of_peer(peer_id_of(keys[i])) for i in (0, 1)}
    port = MembersChain(members)
    admission = RunAdmission(port, 1)
    budget = admission.lookups

    async def main() -> None:
        assert await admission(old)
        started = trio.current_time()
        calls_before = port.calls
        refused_unchecked = 0
        for i, peer in enumerate(flood):
            await trio.sleep(0.01)  # 100 fresh identities a second
            before = port.calls
            assert not await admission(peer)
            refused_unchecked += port.calls == before
            if i % 100 == 0:
                assert await admission(old), "a member is never held up by the flood"
        elapsed = trio.current_time() - started
        flood_calls = port.calls - calls_before
        assert flood_calls <= budget.burst + budget.per_s * elapsed + 1, flood_calls
        assert refused_unchecked >= len(flood) - flood_calls
        await trio.sleep(1.0)  # the flood is over: the budget refills
        assert await admission(late)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert port.calls < 100, f"{port.calls} chain calls for 1,000 fresh identities"


def test_a_data_node_is_known_for_good_and_a_member_is_none(chain: tuple[Contracts, int]) -> None:
    contracts, run_id = chain
    data, member = Account.create(), Account.create()
    sponsor = Sender.unlocked(contracts.w3.eth.accounts[1])
    register_node(contracts, sponsor, bytes(data.key), Capacity("cpu", 1, 1, 1), 2 * ETH)
    add_data_node(contracts, sponsor, run_id, data.address)
    register_and_join(contracts, run_id, bytes(member.key), 2 * ETH)
    port = CountingChain()  # never asked: the real chain below answers
    admission = RunAdmission(contracts.port(), run_id)
    data_peer = str(peer_id_of(identity_from_key(bytes(data.key))))
    member_peer = str(peer_id_of(identity_from_key(bytes(member.key))))

    async def main() -> None:
        assert await admission.is_data_node(data_peer) is True
        assert await admission.is_data_node(member_peer) is False
        assert await admission.is_data_node("not a peer id") is False
        admission.chain = port  # a named data node is not asked again
        assert await admission.is_data_node(data_peer) is True
        assert port.calls == 0

    trio.run(main)


class DataNodesChain(FakeChain):
    """A chain port whose endpoint is down until ``up`` is set, and counts its data-node calls."""

    up = False
    calls = 0

    def is_data_node(self, run_id: int, node_address: str) -> bool:
        self.calls += 1
        if not self.up:
            raise ChainError("http://127.0.0.1:1 is unreachable")
        time.sleep(0.2)
        return True


def test_an_origin_is_unknown_while_the_chain_is_down_and_one_lookup_serves_a_burst() -> None:
    peer = str(peer_id_of(new_identity()))
    port = DataNodesChain()
    admission = RunAdmission(port, 1)
    answers: list[bool | None] = []

    async def ask() -> None:
        answers.append(await admission.is_data_node(peer))

    async def main() -> None:
        assert await admission.is_data_node(peer) is None, "unknown, not false, while down"
        port.up = True
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(ask)

    trio.run(main)
    assert answers == [True] * 10 and port.calls == 2
