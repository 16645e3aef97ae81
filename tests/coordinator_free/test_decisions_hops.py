"""The one rule for a forward's next hop and a dead hop's stand-in (``decisions/hops.py``)."""

from __future__ import annotations

import math
import random

from gwtf.coordinator_free.decisions import HopView, NextPeer, Onward, next_hop, stand_in

INF = math.inf


def test_the_carried_flow_is_followed_unless_its_hop_is_ruled_out() -> None:
    view = HopView(("b", 3), (NextPeer("a", 1.0, 4),))
    assert next_hop(view) == Onward("b", 3)
    assert next_hop(view, exclude={"b"}) == Onward("a", None)


def test_off_a_flow_a_peer_that_knows_a_way_on_comes_first_then_room_then_cost_then_id() -> None:
    no_way = NextPeer("a", INF, 4)
    full = NextPeer("b", 1.0, 0)
    dear = NextPeer("c", 9.0, 1)
    cheap = NextPeer("d", 5.0, 2)
    cheap_too = NextPeer("e", 5.0, 1)
    assert next_hop(HopView(None, (no_way, full))) == Onward("b", None)
    assert next_hop(HopView(None, (no_way, full, dear))) == Onward("c", None)
    assert next_hop(HopView(None, (no_way, full, dear, cheap_too, cheap))) == Onward("d", None)
    assert next_hop(HopView(None, (no_way,))) == Onward("a", None)
    assert next_hop(HopView(None, (cheap,)), exclude={"d"}) is None
    assert next_hop(HopView(None, ())) is None


def test_the_peers_are_read_only_when_the_route_cannot_be_taken() -> None:
    def peers():  # type: ignore[no-untyped-def]
        raise AssertionError("read although the flow's route was free")
        yield  # pragma: no cover

    assert next_hop(HopView(("b", 1), peers())) == Onward("b", 1)


def test_a_stand_in_is_drawn_from_the_callers_generator_among_those_not_excluded() -> None:
    candidates = ["a", "b", "c", "d"]
    drawn = {stand_in(candidates, {"b"}, random.Random(seed)) for seed in range(50)}
    assert drawn == {"a", "c", "d"}
    rng, again = random.Random(7), random.Random(7)
    assert [stand_in(candidates, (), rng) for _ in range(10)] == [
        again.choice(candidates) for _ in range(10)
    ]
    assert stand_in(candidates, set(candidates), random.Random(0)) is None
