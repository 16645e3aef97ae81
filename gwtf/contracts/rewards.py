"""The pay arithmetic of ``WorkLedger``, mirrored. A run declares a price per certified hop:
a hop of ``unitsPerHop`` units (a forward) earns ``hopPriceWei``, a backward (twice the units)
twice that. A certificate reserves its units at that price when it is accepted, and a claim of
certified units is paid exactly that, whatever else the epoch certified. Integer division
rounds down, as the contract's does (exact for whole hops)."""

from __future__ import annotations


def pay_wei(units: int, hop_price_wei: int, units_per_hop: int) -> int:
    """``units * hopPriceWei / unitsPerHop`` (``WorkLedger.payOf``): what certified units earn,
    and what a certificate of ``units`` reserves."""
    if units_per_hop <= 0:
        return 0
    return units * hop_price_wei // units_per_hop


def reward_wei(budget_wei: int, units: int, total_units: int) -> int:
    """A claim's pay from its epoch's book: ``budgetWei`` is what the certificates of
    ``totalUnits`` reserved at the run's price, so ``budget × units // total`` is
    ``pay_wei(units, ...)`` to the wei (every certificate's units are whole hops)."""
    if total_units <= 0:
        return 0
    return budget_wei * units // total_units
