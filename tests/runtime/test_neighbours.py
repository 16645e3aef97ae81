"""The peers a node keeps connected: those of the stages next to its own in the pipeline."""

from __future__ import annotations

from typing import Any, cast

from gwtf.node.runtime.discovery.address_book import AddressBook, PeerRecord
from gwtf.node.runtime.live_node import neighbours


class Book:
    def __init__(self, stages: dict[str, int | None]) -> None:
        self.peers = {
            p: PeerRecord(p, f"/ip4/1.2.3.4/tcp/1/p2p/{p}", "x", s) for p, s in stages.items()
        }


def test_neighbours_are_the_stages_before_and_after_with_data_nodes_at_both_ends() -> None:
    book = cast(Any, Book({"d": 0, "a": 1, "b": 2, "c": 3, "unknown": None}))
    assert sorted(neighbours(cast(AddressBook, book), 0, 3)) == ["a", "c"]
    assert sorted(neighbours(cast(AddressBook, book), 2, 3)) == ["a", "c"]
    assert sorted(neighbours(cast(AddressBook, book), 3, 3)) == ["b", "d"]
    assert sorted(neighbours(cast(AddressBook, book), 1, 1)) == ["d"]
