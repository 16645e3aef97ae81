"""The demo runs the whole epoch story on a real chain and prints only what the chain says."""

from __future__ import annotations

import io

from rich.console import Console

from contracts.bindings import attach
from node.chain.adapter import connect, format_eth
from node.demo.run import CHEATER, DemoConfig, run_demo

ETH = 10**18


def test_demo_end_to_end_matches_chain_state() -> None:
    w3 = connect(None)
    printed = io.StringIO()
    config = DemoConfig()
    report = run_demo(w3, config, Console(file=printed, width=200))
    text = printed.getvalue()
    registry = attach(w3, "NodeRegistry", report.registry)
    disputes = attach(w3, "Disputes", report.disputes)
    rows = {row.name: row for row in report.rows}
    honest = [row for row in report.rows if row.name != CHEATER]
    cheater = rows[CHEATER]

    # The data node certified every hop of the schedule once: per microbatch each of the two
    # stages does one forward (1x units) and one backward (2x).
    microbatches = config.iterations * config.microbatches_per_iteration
    assert report.certified_hops == 4 * microbatches
    assert report.certified_units == 2 * microbatches * 3 * config.units_per_hop
    assert sum(row.units for row in report.rows) == report.certified_units

    # The equivocating relay was caught: whole stake slashed, a 5 % bounty, the rest burned;
    # its claim was refused and its share went back to the pool when the claim period ended.
    # No honest relay lost anything.
    assert cheater.slashed_wei == config.stake_wei and cheater.stake_wei == 0
    assert cheater.units > 0 and cheater.claimed_units == 0 and cheater.reward_wei == 0
    assert report.gas_by_operation["refused: ClaimantSlashed"]
    bounty_bps = disputes.functions.bountyBps().call()
    assert report.bounty_wei == config.stake_wei * bounty_bps // 10_000 > 0
    assert report.burned_wei == config.stake_wei - report.bounty_wei
    assert disputes.functions.creditWei(report.auditor).call() == 0  # withdrawn
    (fraud,) = disputes.events.FraudProven.get_logs(from_block=0)
    assert fraud["args"]["node"] == cheater.node_address

    # Every certified unit is paid the same: the budget to the wei, whoever claimed first.
    assert report.epoch_budget_wei == config.reward_per_epoch_wei
    assert report.rewards_paid_wei + report.returned_wei == report.epoch_budget_wei
    for row in honest:
        assert row.claimed_units == row.units
        assert row.reward_wei == report.epoch_budget_wei * row.units // report.certified_units
    for row in honest:
        assert row.stake_wei == config.stake_wei and row.slashed_wei == 0
        # Balance = funding + reward - gas actually paid (read from the chain, not assumed).
        assert row.balance_wei < config.volunteer_funding_wei - config.stake_wei + row.reward_wei
    # Funded 0.5 + 2 budgets, one budget fixed for epoch 0, what nobody claimed back.
    funded = config.reward_per_epoch_wei // 2 + 2 * config.reward_per_epoch_wei
    assert report.run_available_wei == funded - report.epoch_budget_wei + report.returned_wei
    assert registry.functions.totalStakedWei().call() == 4 * config.stake_wei  # 3 relays + data

    # What is printed is what the chain holds.
    for row in report.rows:
        assert f"{row.name} {row.node_address[:10]}" in text
        assert format_eth(row.reward_wei) in text
    assert f"bounty {format_eth(report.bounty_wei)} ETH" in text
    assert report.gas_by_operation["submitCertificates"] and all(
        0 < gas < 200_000 for gas in report.gas_by_operation["submitCertificates"]
    )
