"""A court reader whose provider fails (web3's own errors: an RPC error reply, a range cap)
keeps the seats it had and still reads at most once a period: the failure never reaches the
asking peer's stream, where it would be charged to that peer (a run member's evidence read
included) with every request asking the chain again. The provider is a stand-in that fails:
a real one fails this way only under load or limits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
from web3.exceptions import Web3RPCError

from gwtf.node.chain.seats import CourtSeats
from gwtf.node.p2p.identity import new_identity, peer_id_of


class FailingCall:
    def __init__(self, calls: list[int]) -> None:
        self.calls = calls

    def call(self) -> Any:
        self.calls.append(1)
        raise Web3RPCError("query exceeds the provider's limit")


def test_a_failing_provider_is_no_peers_fault_and_is_asked_once_a_period() -> None:
    calls: list[int] = []
    court = SimpleNamespace(functions=SimpleNamespace(phaseBlocks=lambda: FailingCall(calls)))
    seats = CourtSeats(SimpleNamespace(court=court, w3=None, ledger=None), None, 1)  # type: ignore[arg-type]

    async def ask() -> list[bool]:
        return [await seats.holds(peer_id_of(new_identity()).to_base58()) for _ in range(50)]

    assert trio.run(ask) == [False] * 50
    assert len(calls) == 1
