"""The chain watcher reads each event's logs incrementally: only the blocks since its last
reading (and a margin before, which a reorganisation may have replaced)."""

from __future__ import annotations

from dataclasses import dataclass

from gwtf.node.chain.adapter import advance_time, connect
from gwtf.node.local_api.watcher import (
    CHUNKS_PER_READING,
    LOG_CHUNK_BLOCKS,
    REORG_BLOCKS,
    EventTail,
    first_block_at,
)


@dataclass(frozen=True)
class Log:
    block: int
    name: str


def test_each_reading_asks_for_the_new_blocks_and_a_margin_only() -> None:
    chain = {5: Log(5, "a"), 200: Log(200, "b")}
    asked: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> list[Log]:
        asked.append((start, end))
        return [log for block, log in sorted(chain.items()) if start <= block <= end]

    tail = EventTail(fetch)
    assert [log.name for log in tail.read(100)] == ["a"]
    assert [log.name for log in tail.read(300)] == ["a", "b"]
    assert tail.read(300) == [Log(5, "a"), Log(200, "b")]
    assert asked == [(0, 100), (101 - REORG_BLOCKS, 300), (301 - REORG_BLOCKS, 300)]


def test_a_log_of_a_replaced_block_goes_away() -> None:
    chain = {100: Log(100, "old")}
    tail = EventTail(lambda s, e: [log for b, log in chain.items() if s <= b <= e])
    assert tail.read(100) == [Log(100, "old")]
    chain = {101: Log(101, "new")}  # block 100 reorganised away, its event in block 101
    assert tail.read(101) == [Log(101, "new")]


def test_a_reader_far_behind_catches_up_in_bounded_chunks() -> None:
    asked: list[tuple[int, int]] = []
    tail = EventTail(lambda s, e: asked.append((s, e)) or [])
    readings = []
    for _ in range(3):
        asked.clear()
        tail.read(250_000)
        readings.append((asked[0][0], asked[-1][1], len(asked)))
    per_reading = LOG_CHUNK_BLOCKS * CHUNKS_PER_READING
    assert readings == [
        (0, per_reading - 1, CHUNKS_PER_READING),
        (per_reading, 2 * per_reading - 1, CHUNKS_PER_READING),
        (2 * per_reading, 250_000, 11),
    ]
    assert all(end - start < LOG_CHUNK_BLOCKS for start, end in asked)


def test_the_run_opens_in_the_first_block_of_its_time() -> None:
    w3 = connect(None)
    times = [int(w3.eth.get_block("latest")["timestamp"])]
    for _ in range(6):
        times.append(advance_time(w3, 100))
    blocks = [int(w3.eth.get_block(n)["timestamp"]) for n in range(w3.eth.block_number + 1)]
    for t in (times[0], times[3], times[3] + 1, times[-1]):
        found = first_block_at(w3, t)
        assert blocks[found] >= t and (found == 0 or blocks[found - 1] < t)
