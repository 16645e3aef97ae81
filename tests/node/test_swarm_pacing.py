"""The swarm's hold on its data nodes: the pace file a data node process reads before each
iteration, and the supervisor's holds that write it (the live swarms that need them are the
`slow` ones of tests/runtime/test_swarm_processes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf.node.process import pace_file_gate
from gwtf.node.swarm import pacing
from gwtf.node.swarm.pacing import Pacing


def test_a_data_node_starts_an_iteration_only_once_its_pace_file_allows_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "data.pace"
    gate = pace_file_gate(path)

    async def main() -> None:
        started: list[int] = []
        with trio.fail_after(10):
            await gate(5)  # no file: no limit
            path.write_text("2")
            await gate(0)
            await gate(1)
            async with trio.open_nursery() as nursery:

                async def iteration_two() -> None:
                    await gate(2)
                    started.append(2)

                nursery.start_soon(iteration_two)
                await trio.sleep(0.3)
                assert started == [], "held at 2 while the file says 2"
                path.write_text("")  # a torn read holds too
                await trio.sleep(0.3)
                assert started == []
                path.write_text("3")
            assert started == [2]

    trio.run(main)


def test_the_holds_allow_the_least_count_and_each_release_lifts_its_own(tmp_path: Path) -> None:
    pace = Pacing(tmp_path, iterations=48)
    file = pace.add("data")
    assert file.read_text() == "48"
    pace.hold("an epoch's end", 24)
    pace.hold("relay-1-1 entering", 7)
    later = pace.add("data-1")  # a data node started later reads the same count
    assert file.read_text() == later.read_text() == "7"
    pace.release("relay-1-1 entering")
    assert file.read_text() == "24"
    pace.release("an epoch's end")
    assert file.read_text() == "48"


def test_a_hold_lasts_until_its_condition_or_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pace = Pacing(tmp_path, iterations=10)
    file = pace.add("data")
    seen: list[str] = []

    def done() -> bool:
        seen.append(file.read_text())
        return len(seen) == 3

    assert pace.hold_until("joiner-1-0 entering", 3, done)
    assert seen == ["3", "3", "3"] and file.read_text() == "10"
    monkeypatch.setattr(pacing, "HOLD_TIMEOUT_S", 0.2)
    assert not pace.hold_until("joiner-1-0 entering", 3, lambda: False)
    assert file.read_text() == "10", "a hold that timed out is lifted"
