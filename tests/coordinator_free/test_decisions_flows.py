"""Which free flow a data node's next microbatch takes (``decisions/flows.py``)."""

from __future__ import annotations

import math

from gwtf.coordinator_free.decisions import FreeFlow, choose_flow
from gwtf.coordinator_free.decisions.flows import (
    FLOWLESS_PATIENCE_PERIODS,
    RECALL_PERIODS,
    take_back_loans,
)


def test_own_flows_go_first_cheapest_reported_path_first_then_loans_nearest_first() -> None:
    unreported = FreeFlow(("d", 1), False, math.inf)
    dear = FreeFlow(("d", 2), False, 900.0)
    cheap = FreeFlow(("d", 3), False, 400.0)
    far_loan = FreeFlow(("e", 1), True, 80.0)
    near_loan = FreeFlow(("f", 7), True, 5.0)
    everything = [far_loan, unreported, near_loan, dear, cheap]
    assert choose_flow(everything) == ("d", 3)
    assert choose_flow([far_loan, unreported, near_loan, dear]) == ("d", 2)
    assert choose_flow([far_loan, unreported, near_loan]) == ("d", 1)
    assert choose_flow([far_loan, near_loan]) == ("f", 7)
    assert choose_flow([]) is None


def test_ties_go_by_owner_then_slot_whatever_the_order() -> None:
    flows = [FreeFlow(("d", 4), False, 10.0), FreeFlow(("d", 2), False, 10.0)]
    assert choose_flow(flows) == choose_flow(flows[::-1]) == ("d", 2)


def test_a_slot_not_carried_is_taken_only_by_a_node_carrying_no_flow_after_its_patience() -> None:
    carried = FreeFlow(("d", 2), False, math.inf)
    bare = FreeFlow(("d", 1), False, math.inf, carried=False)
    loan = FreeFlow(("e", 1), True, 80.0)
    patience = FLOWLESS_PATIENCE_PERIODS
    assert choose_flow([bare, carried]) == ("d", 2)  # a carried one, reported or not, first
    assert choose_flow([bare, loan]) == ("e", 1)
    assert choose_flow([bare]) is None  # the node carries a flow (busy): wait for it
    assert choose_flow([bare], carries_none=True, waited_periods=patience - 0.5) is None
    assert choose_flow([bare], carries_none=True, waited_periods=patience) == ("d", 1)


def test_a_lender_takes_its_loans_back_once_its_own_microbatch_waited_long_enough() -> None:
    assert not take_back_loans(RECALL_PERIODS - 0.5)
    assert take_back_loans(RECALL_PERIODS)
