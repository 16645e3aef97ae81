"""A juror's evidence tries end at its deadline, first tries too, and the accused's evidence
counts as missing (WRONG) only when it had its whole retry schedule: a schedule the juror's
window cut short leaves it not shown wrong in time (RIGHT); busy to the end is missing. Pure
trio on a mock clock, with the fetch replaced by a peer that stalls or declines."""

from __future__ import annotations

import trio
import trio.testing

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import FORWARD, HopReceipt
from gwtf.node.audit import jury, replays
from gwtf.node.p2p.rpc import RequestDeclined

WORKER = "0x" + "11" * 20
PEERS = {f"0x{i:040x}": f"peer{i}" for i in range(1, 11)}


def _fetch(monkeypatch, answer):  # type: ignore[no-untyped-def]
    asked: list[str] = []

    async def fetch(rpc, peer, run_id, epoch, digest, timeout_s, via=None):  # type: ignore[no-untyped-def]
        asked.append(peer)
        await answer()

    monkeypatch.setattr(replays, "fetch_frame", fetch)
    return asked


async def _stall() -> None:
    await trio.sleep_forever()


def _run(peers: dict[str, str], retry_s: float | None) -> tuple[replays.EvidenceSource, float]:
    async def main() -> tuple[replays.EvidenceSource, float]:
        start = trio.current_time()
        until = None if retry_s is None else start + retry_s
        source = replays.EvidenceSource(None, peers, 1, 1.0, retry_until=until)  # type: ignore[arg-type]
        assert await source.frame(0, b"\0" * 32, []) is None
        return source, trio.current_time() - start

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_first_tries_end_at_the_deadline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    asked = _fetch(monkeypatch, _stall)
    source, took = _run(PEERS, 1.0)
    assert took <= 1.0 + 1e-6, took  # not 10 silent peers x 4 request timeouts
    assert asked == ["peer1"]
    assert not source.had_full_schedule("0x" + f"{1:040x}")


def test_a_silent_accused_with_its_whole_schedule_is_missing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    asked = _fetch(monkeypatch, _stall)
    node = f"0x{1:040x}"
    source, _ = _run({node: "peer1"}, 60.0)
    assert len(asked) == 2  # first try, then a round its own budget ends
    assert source.had_full_schedule(node)


def test_a_schedule_the_deadline_cut_short_is_not_missing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    asked = _fetch(monkeypatch, _stall)
    node = f"0x{1:040x}"
    source, took = _run({node: "peer1"}, 5.5)  # first try 4 s, wait 1 s, retry cut
    assert len(asked) == 2 and took <= 5.5 + 1e-6
    assert not source.had_full_schedule(node)


def test_an_accused_busy_through_its_whole_schedule_is_missing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Busy declines are asked again; an accused that answers "busy" to every try had its
    schedule (else "busy" would be every cheater's answer)."""

    async def busy() -> None:
        raise RequestDeclined("declined: busy: peers outside the run get 1 requests/s here")

    asked = _fetch(monkeypatch, busy)
    node = f"0x{1:040x}"
    source, _ = _run({node: "peer1"}, None)
    assert len(asked) > 1
    assert source.had_full_schedule(node)


def test_missing_evidence_is_wrong_only_after_the_whole_schedule() -> None:
    r = HopReceipt(1, 0, "0x" + "33" * 20, 3, 7, 1, FORWARD, 0, WORKER, "0x" + "22" * 20,
                   b"\1" * 32, b"\2" * 32, 1)  # fmt: skip
    missing = replays.Replayed(SignedReceipt(r, b"", b""), None, None, "nobody served its input")
    assert jury._vote_of(missing, full_schedule=True)[0] == jury.WRONG
    vote, why = jury._vote_of(missing, full_schedule=False)
    assert vote == jury.RIGHT and why.startswith("not shown wrong in time"), why


def test_the_chain_s_blocks_end_retries_then_the_phase() -> None:
    """The juror's clock is its window's blocks, read while it fetches: retries stop at one
    block, the whole evidence phase ends at a later one, however fast past blocks came."""
    seen: list[tuple[float, float | None]] = []

    def block_of() -> int:  # a block every 2 s of the mock clock
        return 100 + int(trio.from_thread.run_sync(trio.current_time) // 2)  # read in a thread

    async def main() -> bool:
        deadline = jury._Deadline(float("inf"))
        deadline.source = replays.EvidenceSource(None, {}, 1, 1.0)  # type: ignore[arg-type]
        with trio.CancelScope() as phase:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(jury._watch_blocks, jury.ChainStop(block_of, 103, 106),
                                   deadline, phase)  # fmt: skip
                while True:
                    seen.append((trio.current_time(), deadline.source.retry_until))
                    await trio.sleep(0.5)
        return phase.cancelled_caught

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.05))
    stopped = [t for t, until in seen if until is not None]
    assert 6.0 <= stopped[0] <= 7.0  # block 103 at 6 s, read within a poll
    assert 12.0 <= seen[-1][0] <= 13.0  # block 106 at 12 s ends the phase
