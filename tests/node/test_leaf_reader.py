"""Sampled leaves a certificate's reading lacks are read in runs of consecutive indices, within a
budget that grows with the runs asked, and the data node is named ``withheld`` only for indices
it answered directly without a valid leaf (an empty or short reading that ended whole, or a
malformed page): leaves it declined (busy), never answered, or never got asked before the
budget ran out are ``unchecked``, accusing nobody. Pure trio on a mock clock, with the page
fetch and the root check replaced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from gwtf.node.audit import runner
from gwtf.node.audit.checks import UNCHECKED, WITHHELD
from gwtf.node.receipts.serving import Fetched

DATA = "0x" + "33" * 20
CERT = SimpleNamespace(runId=1, epoch=0, dataNode=DATA, count=64)


class Rpc:
    async def request(self, *args: Any) -> bytes:
        return b""


def page(first: int, last: int) -> Any:
    indices = range(first, last + 1)
    leaves = [SimpleNamespace(hop=SimpleNamespace(index=i)) for i in indices]
    return SimpleNamespace(offset=first, entries=[f"entry {i}" for i in indices], leaves=leaves)


def read(monkeypatch: pytest.MonkeyPatch, serve: Any, indices: list[int]) -> Any:
    asked: list[tuple[int, int, str | None]] = []

    async def fetch(rpc, peer, run_id, epoch, which, timeout_s, limit, start, via):  # type: ignore[no-untyped-def]
        asked.append((start, start + limit - 1, via))
        return await serve(rpc, start, start + limit - 1, via)

    monkeypatch.setattr(runner, "fetch_receipts", fetch)
    monkeypatch.setattr(runner, "verifying_leaves", lambda cert, served, domain: served)
    reader = runner.LeafReader(Rpc(), "data", True, ("forwarder",), 1.0)  # type: ignore[arg-type]

    async def main() -> Any:
        return await reader.leaves(CERT, indices, None)  # type: ignore[arg-type]

    # The jump waits a moment of real time: the root check runs in a worker thread.
    reading = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.05))
    return reading, reader.findings(CERT, reading, len(indices)), asked  # type: ignore[arg-type]


def test_consecutive_indices_are_one_request(monkeypatch: pytest.MonkeyPatch) -> None:
    async def serves(rpc: Any, first: int, last: int, via: Any) -> Fetched:
        return Fetched((page(first, last),))

    reading, found, asked = read(monkeypatch, serves, [3, 4, 5, 9])
    assert asked == [(3, 5, None), (9, 9, None)]
    assert len(reading.read) == 4 and found == []


def test_a_slow_honest_data_node_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    async def slowly(rpc: Any, first: int, last: int, via: Any) -> Fetched:
        await trio.sleep(0.6)  # 0.6 request timeouts a request
        return Fetched((page(first, last),))

    indices = list(range(0, 40, 2))  # 20 runs of one
    reading, found, _ = read(monkeypatch, slowly, indices)
    assert len(reading.read) == 20 and found == []


def test_declines_and_silence_are_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    async def declines(rpc: Any, first: int, last: int, via: Any) -> Fetched:
        if via is None:
            return Fetched((), "declined: busy")
        await trio.sleep_forever()
        raise AssertionError

    reading, found, _ = read(monkeypatch, declines, [1, 5, 9])
    assert reading.withheld == [] and reading.unanswered == [1] and reading.unasked == [5, 9]
    (f,) = found
    assert f.kind == UNCHECKED and f.accused == ""
    assert "1 of 3 sampled leaves asked and not answered" in f.detail
    assert "2 not asked in time" in f.detail


def test_answered_directly_without_the_leaf_is_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    async def cuts(rpc: Any, first: int, last: int, via: Any) -> Fetched:
        if via is not None:
            return Fetched((), "forwarder: not connected")
        if first == 1:
            return Fetched(())  # a reading that ended whole, without the leaf
        await rpc.request(None, "", b"", None)  # answered, a page failing the checks
        return Fetched((), "a page from 0")

    reading, found, _ = read(monkeypatch, cuts, [1, 5])
    assert reading.withheld == [1, 5] and not reading.unanswered and not reading.unasked
    (f,) = found
    assert f.kind == WITHHELD and f.accused == DATA and "2 of 2 sampled leaves" in f.detail


def test_a_run_request_stalled_is_asked_leaf_by_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    async def stalls_runs(rpc: Any, first: int, last: int, via: Any) -> Fetched:
        if last > first:  # a data node cutting any request that reaches into a span
            await trio.sleep(1.0)
            return Fetched((), "did not answer within 1 s")
        return Fetched((page(first, last),))

    reading, found, asked = read(monkeypatch, stalls_runs, [3, 4, 5])
    assert len(reading.read) == 3 and found == []
    assert asked[0] == (3, 5, None) and (4, 4, None) in asked
