"""Cost adverts at start-up: each upstream peer gets a node's advert once, and only with a cost."""

from __future__ import annotations

import random

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.wire import CostAdvert, Hello

CONFIG = FlowConfig(stages=2, activation_bytes=1e6)


def relay(node_id: str, stage: int) -> FlowNode:
    return FlowNode(NodeSpec(node_id, "relay", stage, 2, 20.0), CONFIG, random.Random(1))


def hello(role: str, stage: int) -> Hello:
    return Hello(role, stage, CONFIG.stages, 2, 2, 0, 20.0, 0, True)


def adverts(sends: list) -> list[tuple[str, CostAdvert]]:
    return [(s.to, s.message) for s in sends if isinstance(s.message, CostAdvert)]


def test_a_node_with_no_way_to_a_sink_advertises_nothing_until_it_has_one() -> None:
    node = relay("a", 2)
    node.handle("u", hello("relay", 1), 0.0)
    assert adverts(node.tick(0.0)) == []  # no sink known: upstream already assumes infinity
    assert node.next_tick_s(0.0) == CONFIG.decision_period_s  # the advert is still due
    node.handle("d0", hello("data", 0), 1.0)
    node.handle("d0", CostAdvert(0.0, 2), 1.0)
    sent = adverts(node.tick(2.0))
    assert [to for to, _ in sent] == ["u"]
    assert 0.0 < sent[0][1].cost_to_sink_ms < float("inf")


def test_a_new_upstream_peer_gets_the_advert_once_before_and_at_once_after_the_first_round() -> (
    None
):
    node = relay("a", 2)
    node.handle("d0", hello("data", 0), 0.0)
    node.handle("d0", CostAdvert(0.0, 2), 0.0)
    # Before this node's first round its Hello answer carries no advert: the round sends it.
    assert adverts(node.handle("u1", hello("relay", 1), 0.0)) == []
    first_round = adverts(node.tick(0.0))
    assert [to for to, _ in first_round] == ["u1"]
    # After it, a peer that arrives gets the current advert with the answer.
    late = adverts(node.handle("u2", hello("relay", 1), 1.0))
    assert late == [("u2", first_round[0][1])]
