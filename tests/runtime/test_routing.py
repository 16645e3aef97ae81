"""SWARM's wiring draws peers in proportion to their measured throughput."""

from __future__ import annotations

import random
from collections import Counter

from gwtf.node.runtime.flow.routing import SwarmWiring


def test_faster_peers_get_proportionally_more_hops() -> None:
    wiring = SwarmWiring(random.Random(1))
    for _ in range(50):
        wiring.observe("fast", 0.1)  # 10 hops/s
        wiring.observe("slow", 0.4)  # 2.5 hops/s
    picks = Counter(wiring.choose(["fast", "slow"]) for _ in range(5000))
    assert 3.4 < picks["fast"] / picks["slow"] < 4.6


def test_moving_average_follows_a_slowdown_with_alpha_one_tenth() -> None:
    wiring = SwarmWiring(random.Random(0))
    wiring.observe("p", 0.1)
    wiring.observe("p", 1.0)
    assert wiring.throughput["p"] == 0.1 * 1.0 + 0.9 * 10.0


def test_unmeasured_peers_are_tried_and_nothing_is_chosen_from_nothing() -> None:
    wiring = SwarmWiring(random.Random(2))
    wiring.observe("known", 0.5)
    assert {wiring.choose(["known", "new"]) for _ in range(200)} == {"known", "new"}
    assert wiring.choose([]) is None
