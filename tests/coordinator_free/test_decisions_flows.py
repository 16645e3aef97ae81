"""Which free flow a data node's next microbatch takes (``decisions/flows.py``)."""

from __future__ import annotations

import math

from gwtf.coordinator_free.decisions import FreeFlow, choose_flow


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
