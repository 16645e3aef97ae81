"""A data node's pool of flows (``gwtf/node/runtime/roles/flow_pool.py``): idle flows lent to a data
peer whose microbatches wait, used there, and given back. Two real flow cores, whose messages go
straight to each other (the live swarm test runs the same over libp2p)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import trio
import trio.testing

from gwtf.coordinator_free.decisions.flows import FLOWLESS_PATIENCE_PERIODS, RECALL_PERIODS
from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.wire import CostAdvert, FlowAccept, FlowRequest, Hello, PathReport
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.runtime.roles.flow_pool import Flow, FlowPool
from tests.coordinator_free.test_lending import meet, route_all

CONFIG = FlowConfig(stages=1, activation_bytes=1e6)


class Wire(FlowService):
    """A flow service whose messages reach the other data node's at once."""

    services: dict[str, Wire]

    def dispatch(self, outbounds: Iterable[Outbound]) -> None:
        for outbound in outbounds:
            peer = self.services[outbound.to]
            peer.dispatch(peer.node.handle(self.node.node_id, outbound.message, 0.0))
            if peer.observer is not None:
                peer.observer(self.node.node_id, outbound.message)


def two_pools() -> tuple[FlowPool, FlowPool]:
    """Data node "a" with 1 flow and "b" with 2, both through relay r1."""
    unused: Any = None
    services: dict[str, Wire] = {}
    pools = []
    for name, capacity in (("a", 1), ("b", 2)):
        node = FlowNode(NodeSpec(name, "data", 0, capacity, 20.0), CONFIG, random.Random(1))
        service = services[name] = Wire(unused, node, tick_s=1.0)
        service.services = services
        pool = FlowPool(service)
        service.observer = pool.heard
        pools.append(pool)
    a, b = pools
    meet(a.node, b.node)
    for pool in pools:
        pool.node.handle("r1", Hello("relay", 1, CONFIG.stages, 4, 4, 0, 20.0, 0, True), 0.0)
        route_all(pool.node, "r1")
    return a, b


async def lend_b_flow_to_a(a: FlowPool, b: FlowPool) -> Flow:
    """Both start an iteration; a starts its own flow, b starts nothing and lends an idle flow
    to a, whose second microbatch takes it: the loan."""
    a.open()
    b.open()
    await a.take(waiting=2)
    b.all_started()
    loan = await a.take(waiting=1)
    assert b.node.lent_slots == {loan.slot: "a"}
    return loan


def test_an_idle_flow_is_lent_to_the_waiting_peer_used_there_and_given_back() -> None:
    a, b = two_pools()
    taken: list[Flow] = []

    async def main() -> None:
        a.open()
        b.open()
        taken.append(await a.take(waiting=3))  # a's own flow
        own_b = [await b.take(waiting=2), await b.take(waiting=1)]
        b.all_started()  # b has nothing waiting: its flows are lent as they free
        async with trio.open_nursery() as nursery:

            async def take_loan() -> None:
                taken.append(await a.take(waiting=2))  # waits: tells b two wait

            nursery.start_soon(take_loan)
            await trio.sleep(0.1)
            assert len(taken) == 1
            b.release(own_b[0], still_to_start=0)  # freed: lent to a at once
        loan = taken[1]
        assert loan.lender == "b" and a.first_hop(loan) == "r1"
        assert b.node.lent_slots == {loan.slot: "a"}
        b.open()  # b's next iteration: the lent slot stays a's
        assert own_b[0] not in b._free
        a.all_started()  # a's last microbatch runs on the loan: a tells b none wait
        assert not b.node.waiting_peers
        a.release(loan, still_to_start=0)  # done: the loan goes back
        assert not b.node.lent_slots and own_b[0] in b._free

    trio.run(main)


def test_a_loan_whose_lender_died_is_not_started_on() -> None:
    a, b = two_pools()
    taken: list[Flow] = []

    async def main() -> None:
        a.open()
        b.open()
        own_a = await a.take(waiting=3)
        b.all_started()  # b starts nothing: both its flows are idle, lent as a asks
        loan = await a.take(waiting=2)
        assert loan.lender == "b"
        a.release(loan, still_to_start=1)  # kept while a's microbatches wait
        a.node.peer_dead("b", 1.0)  # its loans end with it
        with trio.move_on_after(5.0):
            taken.append(await a.take(waiting=1))
        assert not taken, "a dead lender's loan was taken"
        a.release(own_a, still_to_start=1)
        taken.append(await a.take(waiting=1))
        assert taken == [own_a]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_slot_lent_to_a_data_node_that_is_gone_is_taken_back_next_iteration() -> None:
    a, b = two_pools()

    async def main() -> None:
        loan = await lend_b_flow_to_a(a, b)  # and a dies holding it
        b.open(data_peers=["a"])  # a still counted: the loan stands
        assert Flow(loan.slot) not in b._free
        b.open(data_peers=[])  # a gone (its probes failed): the slot is b's again
        assert not b.node.lent_slots and Flow(loan.slot) in b._free

    trio.run(main)


def test_a_data_node_still_starting_its_microbatches_lends_nothing() -> None:
    a, b = two_pools()

    async def main() -> None:
        a.open()  # a's iteration begins: its one flow is free, and a has microbatches to start
        b.open()
        await b.take(waiting=3)
        await b.take(waiting=2)
        with trio.move_on_after(1.0):
            await b.take(waiting=1)  # b waits, and says so to a
        assert a.node.waiting_peers == {"b": 1}
        assert not a.node.lent_slots  # a keeps its flow for its own microbatches
        assert (await a.take(waiting=1)).lender == ""

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_slot_lent_to_a_data_node_that_died_mid_iteration_is_started_on_at_once() -> None:
    a, b = two_pools()
    taken: list[Flow] = []

    async def main() -> None:
        await lend_b_flow_to_a(a, b)
        b.open()  # b's next iteration: its other flow free, the lent one a's
        taken.append(await b.take(waiting=2))
        async with trio.open_nursery() as nursery:

            async def take_second() -> None:
                taken.append(await b.take(waiting=1))

            nursery.start_soon(take_second)
            await trio.sleep(3.0)
            assert len(taken) == 1  # the lent slot is a's while a lives
            b.node.peer_dead("a", 3.0)  # a dies holding it: no loan return will come
        assert [flow.lender for flow in taken] == ["", ""] and len(set(taken)) == 2

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_waiting_data_node_tells_a_peer_that_restarted_since() -> None:
    a, b = two_pools()

    async def main() -> None:
        a.open()
        b.open()
        await a.take(waiting=3)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.take, 2)
            await trio.sleep(0.5)
            assert b.node.waiting_peers == {"a": 2}
            # b restarts: the new b knows nothing of a's wait; a's core forgets what it told b.
            b.node.waiting_peers.clear()
            a.node.forget_loans("b")
            await trio.sleep(a.flow.tick_s)
            assert b.node.waiting_peers == {"a": 2}  # a said it again
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_lender_whose_microbatches_wait_too_long_takes_its_lent_slots_back() -> None:
    a, b = two_pools()

    async def main() -> None:
        loan = await lend_b_flow_to_a(a, b)
        a.node.borrowed.clear()  # a lost track of the loan: no return will ever come
        b.open()
        await b.take(waiting=2)  # b's other flow
        with trio.move_on_after(b.node.period_s * RECALL_PERIODS - 2 * b.flow.tick_s):
            await b.take(waiting=1)
            raise AssertionError("the lent slot came back before the recall")
        taken = await b.take(waiting=1)
        assert taken == Flow(loan.slot) and not b.node.lent_slots

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_microbatch_takes_the_own_flow_whose_reported_path_is_cheapest() -> None:
    """``decisions.choose_flow``, as in the simulator: not the first free slot but the flow its
    sink last reported cheapest (one not reported yet after those that are)."""
    _, b = two_pools()
    routes = b.node.source_routes()
    (low, high) = sorted(routes)
    for slot, cost in ((low, 900.0), (high, 400.0)):
        flow_id = routes[slot][0]
        b.node.handle("d9", PathReport(flow_id, ("b", "r1", "d9"), cost), 0.0)
    taken: list[Flow] = []

    async def main() -> None:
        b.open()
        taken.append(await b.take(waiting=2))
        taken.append(await b.take(waiting=1))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert taken == [Flow(high), Flow(low)]


def flowless_pool(routed: int) -> FlowPool:
    """Data node "c" with 2 source slots, ``routed`` of them carried through relay r1."""
    unused: Any = None
    node = FlowNode(NodeSpec("c", "data", 0, 2, 20.0), CONFIG, random.Random(1))
    node.handle("r1", Hello("relay", 1, CONFIG.stages, 4, 4, 0, 20.0, 0, True), 0.0)
    node.handle("r1", CostAdvert(10.0, 4), 0.0)
    for out in node.route_unmatched(0.0)[:routed]:
        assert isinstance(out.message, FlowRequest)
        node.handle(out.to, FlowAccept(out.message.slot, 10.0), 0.1)
    assert len(node.source_routes()) == routed
    return FlowPool(Wire(unused, node, tick_s=1.0))


def test_a_data_node_carrying_no_flow_starts_off_flow_only_after_its_patience() -> None:
    """``decisions.choose_flow``, as in the simulator: a slot not carried is no flow; a node
    that carries none takes one (its microbatch goes off any flow) once the microbatch waited
    ``FLOWLESS_PATIENCE_PERIODS`` decision periods for a flow to be built."""
    pool = flowless_pool(routed=0)
    patience_s = FLOWLESS_PATIENCE_PERIODS * pool.node.period_s
    taken: list[tuple[Flow, float]] = []

    async def main() -> None:
        pool.open()
        flow = await pool.take(waiting=1)
        taken.append((flow, trio.current_time()))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    ((flow, at),) = taken
    assert flow.lender == "" and flow.slot in pool.node.out_slots
    assert patience_s <= at <= patience_s + pool.flow.tick_s


def test_a_data_node_carrying_a_busy_flow_waits_for_it_rather_than_go_off_flow() -> None:
    pool = flowless_pool(routed=1)
    (carried,) = pool.node.source_routes()

    async def main() -> None:
        pool.open()
        assert await pool.take(waiting=2) == Flow(carried)
        with trio.move_on_after(10 * FLOWLESS_PATIENCE_PERIODS * pool.node.period_s):
            await pool.take(waiting=1)
            raise AssertionError("a slot not carried was taken while a flow was busy")
        pool.release(Flow(carried), still_to_start=1)
        assert await pool.take(waiting=1) == Flow(carried)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
