"""Who ends an iteration, and a relay left behind with nobody to load its stage from.

Both are small decisions inside the live roles, checked here on their own: the data node asks
every relay it may reach to end an iteration, including those its flow protocol does not know
(a middle stage's replicas, a relay not yet introduced) and one that failed a probe and showed
a sign of life since; a relay whose replicas all died while it was catching up goes on from its
own state instead of declining hops for ever.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

from gwtf.coordinator_free.protocol.state import Peer
from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import Decline
from gwtf.node.runtime.dataplane.hop import BACKWARD, FLAG_REDO, FLAG_REPAIR, FORWARD
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.runtime.roles.relay_roster import RelayRoster


def peer(peer_id: str, stage: int, alive: bool = True) -> Peer:
    found = Peer(peer_id, "relay" if stage else "data", stage, 2, 10.0, 0, 0.0)
    found.alive = alive
    return found


def test_the_data_node_ends_iterations_with_every_relay_it_may_reach() -> None:
    roster = RelayRoster(
        plane=SimpleNamespace(stages=3),  # type: ignore[arg-type]
        flow=SimpleNamespace(  # type: ignore[arg-type]
            node=SimpleNamespace(
                peers={
                    "a1": peer("a1", 1),
                    "a2": peer("a2", 1, alive=False),  # the flow protocol saw it die
                    "c1": peer("c1", 3),
                    "data2": peer("data2", 0),
                }
            )
        ),
        # Discovery knows the middle stage, a relay of stage 1 not yet introduced, the dead
        # one's stale card, one that failed a probe, and a data node.
        discovered=lambda: {"b1": 2, "a3": 1, "a2": 1, "b2": 2, "data2": 0, "x": 9},
        unreachable={"b2", "c1"},
    )
    believed = roster.believed()
    assert believed == {"a1": 1, "a3": 1, "b1": 2, "c1": 3}
    assert roster.unreachable == {"b2"}, "a relay the flow protocol hears again is reachable"


def test_a_relay_that_failed_a_probe_is_asked_again_once_it_shows_a_sign_of_life() -> None:
    """A middle stage's relay is never a flow neighbour of the data node: only a sign of life
    (a request it makes, discovery hearing from it) undoes its failed probe, and what was open
    to it is then redialled (``returned``) rather than trusted."""
    roster = RelayRoster(
        plane=SimpleNamespace(stages=3),  # type: ignore[arg-type]
        flow=SimpleNamespace(node=SimpleNamespace(peers={})),  # type: ignore[arg-type]
        discovered=lambda: {"b1": 2, "b2": 2},
        unreachable={"b2"},
    )
    assert roster.believed() == {"b1": 2}
    roster.heard("b1")  # never failed a probe: nothing to undo
    roster.heard("b2")
    assert roster.believed() == {"b1": 2, "b2": 2}
    assert roster.unreachable == set() and roster.returned == {"b2"}


def relay_behind(resync: object, step: int, target: int) -> SimpleNamespace:
    return SimpleNamespace(
        resync=resync,
        worker=SimpleNamespace(step_count=step),
        resync_target=target,
        stage=2,
        resyncing=True,
        resynced=trio.Event(),
    )


@pytest.mark.parametrize("failure", [trio.TooSlowError(), ProtocolError("no replica")])
def test_a_relay_whose_replicas_are_gone_goes_on_from_its_own_state(failure: Exception) -> None:
    asked: list[int] = []

    async def resync(step: int) -> None:
        asked.append(step)
        raise failure

    relay = relay_behind(resync, step=3, target=5)
    trio.run(RelayRole._resync, relay)  # type: ignore[arg-type]
    assert asked == [5]
    assert relay.worker.step_count == 5 and not relay.resyncing and relay.resynced.is_set()


def test_a_relay_that_loads_its_replicas_state_takes_their_step() -> None:
    relay = relay_behind(None, step=3, target=5)

    async def resync(step: int) -> None:
        relay.worker.step_count = step + 1  # the replica had stepped once more meanwhile

    relay.resync = resync
    trio.run(RelayRole._resync, relay)  # type: ignore[arg-type]
    assert relay.worker.step_count == 6 and relay.resynced.is_set()


def hop(iteration: int, flags: int = 0, direction: int = FORWARD) -> SimpleNamespace:
    return SimpleNamespace(iteration=iteration, flags=flags, direction=direction)


def test_a_hop_is_computed_only_while_its_iteration_is_neither_ending_nor_past() -> None:
    """Checked in the compute thread the step runs in: a hop that waited there behind the
    iteration's end (a straggler from a data node left out) is declined, not computed on a
    graph or weights the step changed. Between the attempts of an end whose round missed a
    holder, only the redo's hops are computed."""
    relay = SimpleNamespace(worker=SimpleNamespace(step_count=4), stage=1, _closing=3, _reopened=-1)
    computed: list[int] = []

    def compute(microbatch: int) -> int:
        computed.append(microbatch)
        return microbatch

    def in_step(header: SimpleNamespace, microbatch: int) -> int:
        return RelayRole._in_step(relay, header, compute, microbatch)  # type: ignore[arg-type]

    assert in_step(hop(4), 7) == 7
    relay._closing = 4  # the end of iteration 4 began
    with pytest.raises(Decline, match="ending or past it"):
        in_step(hop(4), 8)
    relay._reopened = 4  # its round missed a holder: the redo's hops, and only those
    assert in_step(hop(4, FLAG_REPAIR), 11) == 11
    assert in_step(hop(4, FLAG_REDO, BACKWARD), 12) == 12
    for straggler in (hop(4), hop(4, 0, BACKWARD), hop(4, FLAG_REPAIR, BACKWARD)):
        with pytest.raises(Decline):
            in_step(straggler, 13)
    relay.worker.step_count = 5  # stepped
    with pytest.raises(Decline):
        in_step(hop(4, FLAG_REPAIR), 9)
    assert in_step(hop(5), 10) == 10
    assert computed == [7, 11, 12, 10]
