"""The reward arithmetic of ``WorkLedger.claimReward``, mirrored: what a claim of certified
units pays. Integer division rounds down, as the contract's does; the dust stays in the epoch's
budget and returns to the run's pool when the epoch closes."""

from __future__ import annotations


def reward_wei(budget_wei: int, units: int, total_units: int) -> int:
    """``budgetWei * units / totalUnits``: a range's share of its epoch's budget."""
    if total_units <= 0:
        return 0
    return budget_wei * units // total_units
