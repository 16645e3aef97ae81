"""The one rule for a forward's next hop and a dead hop's stand-in (``decisions/hops.py``)."""

from __future__ import annotations

import math
import random
from collections import Counter

from gwtf.coordinator_free.decisions import (
    Detours,
    HopView,
    NextPeer,
    Onward,
    next_hop,
    stand_in,
)

INF = math.inf


def test_the_carried_flow_is_followed_unless_its_hop_is_ruled_out() -> None:
    view = HopView(("b", 3), (NextPeer("a", 1.0, 4),))
    assert next_hop(view) == Onward("b", 3)
    assert next_hop(view, exclude={"b"}) == Onward("a", None)


def test_off_a_flow_a_peer_that_knows_a_way_on_comes_first_then_room_then_cost() -> None:
    no_way = NextPeer("a", INF, 4)
    full = NextPeer("b", 1.0, 0)
    dear = NextPeer("c", 9.0, 1)
    cheap = NextPeer("d", 5.0, 2)
    cheaper = NextPeer("e", 4.0, 1)
    assert next_hop(HopView(None, (no_way, full))) == Onward("b", None)
    assert next_hop(HopView(None, (no_way, full, dear))) == Onward("c", None)
    assert next_hop(HopView(None, (no_way, full, dear, cheap, cheaper))) == Onward("e", None)
    assert next_hop(HopView(None, (no_way,))) == Onward("a", None)
    assert next_hop(HopView(None, (cheap,)), exclude={"d"}) is None
    assert next_hop(HopView(None, ())) is None


def test_detours_in_flight_use_up_room_and_then_the_least_outstanding_peer_goes_first() -> None:
    # Room left is the advertised room less this node's detours in flight there.
    roomy_but_busy = NextPeer("a", 1.0, 2, in_flight=2)
    full = NextPeer("b", 9.0, 0, in_flight=0)
    roomy = NextPeer("c", 9.0, 3, in_flight=2)
    assert next_hop(HopView(None, (roomy_but_busy, roomy))) == Onward("c", None)
    # With no room left anywhere, the fewest in flight wins over a cheaper peer.
    assert next_hop(HopView(None, (roomy_but_busy, full))) == Onward("b", None)
    # A peer that knows no way on stays last however idle.
    idle_dead_end = NextPeer("d", INF, 5, in_flight=0)
    assert next_hop(HopView(None, (idle_dead_end, roomy_but_busy))) == Onward("a", None)


def test_tied_peers_are_ordered_by_each_sender_its_own_way() -> None:
    peers = [NextPeer(f"r{i}", 5.0, 0) for i in range(6)]
    firsts = {next_hop(HopView(None, peers, f"up{n}")) for n in range(30)}
    assert len(firsts) > 2  # not the lowest id on every node
    again = {next_hop(HopView(None, list(reversed(peers)), f"up{n}")) for n in range(30)}
    assert again == firsts  # deterministic, whatever order the peers come in


def test_detours_count_per_peer_and_end_once() -> None:
    detours = Detours()
    detours.sent(1, "a")
    detours.sent(2, "a")
    detours.sent(3, "b")
    assert (detours.in_flight("a"), detours.in_flight("b"), detours.in_flight("c")) == (2, 1, 0)
    detours.ended(1)
    detours.ended(1)  # twice: no change
    detours.ended(99)  # never counted: no change
    assert detours.in_flight("a") == 1
    detours.ended(3, "a")  # a late ack from a peer it no longer went to: no change
    assert detours.in_flight("b") == 1
    detours.sent(3, "c")  # re-sent elsewhere: the first send ends
    assert (detours.in_flight("b"), detours.in_flight("c"), len(detours)) == (0, 1, 2)


def spread(relays: int, peers: int, each: int) -> Counter[str]:
    """Each of ``relays`` nodes sends ``each`` detours, none acknowledged yet, to ``peers``
    equal next-stage peers (no room, start-up costs): where they land."""
    landed: Counter[str] = Counter()
    for r in range(relays):
        detours = Detours()
        for mb in range(each):
            view = [NextPeer(f"s2-{p}", 5.0, 0, detours.in_flight(f"s2-{p}")) for p in range(peers)]
            onward = next_hop(HopView(None, view, f"s1-{r}"))
            assert onward is not None
            detours.sent(mb, onward.to)
            landed[onward.to] += 1
    return landed


def test_off_flow_forwards_of_several_relays_spread_over_equal_peers() -> None:
    landed = spread(relays=4, peers=3, each=8)
    assert sum(landed.values()) == 32 and len(landed) == 3
    assert max(landed.values()) <= math.ceil(32 / 3) + 1
    # Each relay alone spreads evenly: 8 over 3 peers is 3, 3, 2.
    assert sorted(spread(relays=1, peers=3, each=8).values()) == [2, 3, 3]


def test_re_sends_after_a_death_spread_over_the_replicas_left() -> None:
    # A relay re-sends 9 forwards the dead replica missed: they go round the 3 left.
    detours = Detours()
    left = ("b", "c", "d")
    for mb in range(9):
        view = [NextPeer(p, 5.0, 0, detours.in_flight(p)) for p in ("a", *left)]
        onward = next_hop(HopView(None, view, "up"), exclude={"a"})
        assert onward is not None
        detours.sent(mb, onward.to)
    assert [detours.in_flight(p) for p in left] == [3, 3, 3]


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
