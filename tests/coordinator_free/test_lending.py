"""Data nodes lend idle flows to data peers whose microbatches wait (``protocol/lending.py``)."""

from __future__ import annotations

import random

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.sim.engine import Engine
from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy
from gwtf.coordinator_free.wire import (
    CostAdvert,
    FlowAccept,
    FlowLoan,
    FlowLoanReturn,
    FlowRequest,
    FlowWanted,
    Hello,
    TakeOverDeny,
    TakeOverRequest,
)
from tests.coordinator_free.sim_helpers import small_scenario

CONFIG = FlowConfig(stages=1, activation_bytes=1e6)


def data_node(node_id: str, capacity: int = 2) -> FlowNode:
    node = FlowNode(NodeSpec(node_id, "data", 0, capacity, 20.0), CONFIG, random.Random(1))
    for peer, role, stage in (("r1", "relay", 1), ("r2", "relay", 1), ("x", "relay", 1)):
        node.handle(peer, Hello(role, stage, CONFIG.stages, 4, 4, 0, 20.0, 0, True), 0.0)
    return node


def meet(a: FlowNode, b: FlowNode) -> None:
    a.handle(b.node_id, b.hello(wants_reply=True), 0.0)
    b.handle(a.node_id, a.hello(wants_reply=True), 0.0)


def route_all(node: FlowNode, first_hop: str) -> None:
    """Give every source slot of ``node`` a flow through ``first_hop``."""
    node.handle(first_hop, CostAdvert(10.0, 4), 0.0)  # the only relay with a way to a sink
    for out in node.route_unmatched(0.0):
        assert isinstance(out.message, FlowRequest)
        node.handle(out.to, FlowAccept(out.message.slot, 10.0), 0.1)
    assert len(node.source_routes()) == node.spec.capacity
    assert {hop for _, hop in node.source_routes().values()} == {first_hop}


def deliver(sends: list, to: FlowNode, sender: str) -> list:  # type: ignore[type-arg]
    replies = []
    for out in sends:
        if out.to == to.node_id:
            replies += to.handle(sender, out.message, 1.0)
    return replies


def test_an_idle_data_node_lends_its_flow_to_the_peer_that_waits_and_gets_it_back() -> None:
    lender, borrower = data_node("d0"), data_node("d1")
    meet(lender, borrower)
    route_all(lender, "r1")
    # The borrower has 3 microbatches waiting: every data peer hears it once.
    told = borrower.announce_waiting(3)
    assert [(o.to, o.message) for o in told] == [("d0", FlowWanted(3))]
    assert borrower.announce_waiting(2) == []  # a drop goes unsaid
    deliver(told, lender, "d1")
    assert lender.waiting_peers == {"d1": 2}  # bounded by what the lender could ever lend
    loans = lender.lend_idle(sorted(lender.source_routes()))
    assert [o.message for o in loans] == [FlowLoan(s, "r1") for s in sorted(lender.out_slots)]
    assert all(lender.is_lent(s) for s in lender.out_slots)
    assert deliver(loans, borrower, "d0") == []  # both taken: two still wait
    assert set(borrower.borrowed.values()) == {"r1"}
    # Nothing waits any more: the peers hear it and the loans go back.
    (done,) = borrower.announce_waiting(0)
    assert done.message == FlowWanted(0)
    back = [o for key in list(borrower.borrowed) for o in borrower.return_loan(*key)]
    assert {o.message.slot for o in back} == set(lender.out_slots)
    deliver([done, *back], lender, "d1")
    assert lender.waiting_peers == {} and lender.lent_slots == {}
    assert borrower.borrowed == {}


def test_the_neediest_peer_borrows_first_and_a_lent_slot_is_not_lent_twice() -> None:
    lender, one, three = data_node("d0", capacity=3), data_node("d1"), data_node("d2")
    meet(lender, one)
    meet(lender, three)
    route_all(lender, "r1")
    deliver(one.announce_waiting(1), lender, "d1")
    deliver(three.announce_waiting(3), lender, "d2")
    slots = sorted(lender.source_routes())
    first = lender.lend_idle(slots[:1])
    assert [o.to for o in first] == ["d2"]
    # Lending all three again skips the slot already out: d2 still waits for 2, d1 for 1.
    rest = lender.lend_idle(slots)
    assert sorted(o.to for o in rest) == ["d1", "d2"]
    assert len(lender.lent_slots) == 3
    assert lender.lend_idle(slots) == []


def test_idle_slots_are_lent_in_slot_order_whatever_order_the_caller_keeps() -> None:
    """The live pool keeps its free slots in the order they freed, the simulator in slot order:
    the core lends in slot order for both."""
    lender, borrower = data_node("d0", capacity=3), data_node("d1")
    meet(lender, borrower)
    route_all(lender, "r1")
    deliver(borrower.announce_waiting(1), lender, "d1")
    slots = sorted(lender.source_routes())
    (loan,) = lender.lend_idle(slots[::-1])
    assert loan.message.slot == slots[0]


def test_a_loan_that_cannot_be_used_goes_back_at_once() -> None:
    borrower = data_node("d1")
    lender = data_node("d0")
    meet(lender, borrower)
    # Nothing waits: returned.
    (back,) = borrower.handle("d0", FlowLoan(0, "r1"), 1.0)
    assert (back.to, back.message) == ("d0", FlowLoanReturn(0))
    borrower.announce_waiting(5)
    # A first hop it does not know, or a lender that is not a data peer: returned.
    assert borrower.handle("d0", FlowLoan(1, "nobody"), 1.0)[0].message == FlowLoanReturn(1)
    assert borrower.handle("r1", FlowLoan(2, "r2"), 1.0)[0].message == FlowLoanReturn(2)
    # At most its capacity in loans.
    assert borrower.handle("d0", FlowLoan(3, "r1"), 1.0) == []
    assert borrower.handle("d0", FlowLoan(4, "r2"), 1.0) == []
    assert borrower.handle("d0", FlowLoan(5, "r1"), 1.0)[0].message == FlowLoanReturn(5)
    assert set(borrower.borrowed) == {("d0", 3), ("d0", 4)}
    # A relay cannot announce waiting microbatches to a data node.
    borrower.handle("r1", FlowWanted(4), 1.0)
    assert borrower.waiting_peers == {}


def test_loans_end_with_a_dead_peer_and_a_lent_flow_is_not_handed_over() -> None:
    lender, borrower = data_node("d0"), data_node("d1")
    meet(lender, borrower)
    route_all(lender, "r1")
    deliver(borrower.announce_waiting(1), lender, "d1")
    (loan,) = lender.lend_idle(sorted(lender.source_routes()))
    deliver([loan], borrower, "d0")
    slot = loan.message.slot
    # A data peer asking to take the lent flow over is denied: a microbatch may be on it.
    denied = lender.handle("d1", TakeOverRequest(slot, 99), 2.0)
    assert [type(o.message) for o in denied] == [TakeOverDeny]
    lender.peer_dead("d1", 3.0)
    assert lender.lent_slots == {} and lender.waiting_peers == {}
    borrower.peer_dead("d0", 3.0)
    assert borrower.borrowed == {}


def test_in_the_simulator_data_nodes_borrow_idle_flows_and_every_microbatch_completes() -> None:
    # Batches larger than the relays' capacity: each data node's last microbatches wait, and
    # a data node that finished its batch lends its idle flows.
    scenario = small_scenario(
        relays_per_stage=2, stages=2, data_nodes=3, iterations=12, preset_stages=True
    )
    policy = GwtfPolicy()
    engine = Engine(scenario, policy)
    metrics = engine.run()
    assert metrics.stopped_reason == "finished"
    assert metrics.microbatches_completed == metrics.microbatches_injected == 12 * 3 * 4
    assert metrics.capacity_exceeded == 0
    assert policy.borrowed_flow_injections > 0, "some microbatches went on a data peer's flow"
    for node in policy.flow_nodes.values():
        if node.is_data:  # every loan went back by the end
            assert node.lent_slots == {} and node.borrowed == {}
