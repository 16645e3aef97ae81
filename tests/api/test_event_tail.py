"""The chain watcher reads each event's logs incrementally: only the blocks since its last
reading (and a margin before, which a reorganisation may have replaced)."""

from __future__ import annotations

from dataclasses import dataclass

from node.local_api.watcher import REORG_BLOCKS, EventTail


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
