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
    ledger = attach(w3, "WorkLedger", report.ledger)
    rows = {row.name: row for row in report.rows}
    honest = [row for row in report.rows if row.name != CHEATER]
    cheater = rows[CHEATER]

    # Every hop of the schedule is claimed exactly once by the honest side, once more by the cheat.
    hops = config.iterations * config.microbatches_per_iteration * 4
    assert sum(row.receipts for row in report.rows) == hops + 1
    # Per microbatch a stage does one forward (1x) and one backward (2x units).
    per_microbatch_units = 3 * config.units_per_hop
    microbatches = config.iterations * config.microbatches_per_iteration
    assert sum(row.units for row in report.rows) == 2 * microbatches * per_microbatch_units + (
        config.units_per_hop
    )

    # The cheater was caught: claim voided, whole stake slashed, bounty to the auditor.
    assert cheater.reward_wei == 0
    assert cheater.slashed_wei == config.stake_wei
    assert registry.functions.getNode(cheater.node_address).call()[1] == 0
    bounty_bps = ledger.functions.bountyBps().call()
    assert report.bounty_wei == config.stake_wei * bounty_bps // 10_000 > 0
    assert ledger.functions.creditWei(report.auditor).call() == 0  # withdrawn
    (fraud,) = ledger.events.FraudProven.get_logs(from_block=0)
    assert fraud["args"]["node"] == cheater.node_address

    # Honest nodes split the epoch budget pro rata, exactly, in the order they claimed.
    assert report.epoch_budget_wei == config.reward_per_epoch_wei
    assert report.rewards_paid_wei == report.epoch_budget_wei
    unpaid, open_units = report.epoch_budget_wei, sum(row.units for row in honest)
    for row in honest:
        expected = unpaid * row.units // open_units
        assert row.reward_wei == expected
        unpaid, open_units = unpaid - expected, open_units - row.units
        assert row.stake_wei == config.stake_wei
        # Balance = funding + reward - gas actually paid (read from the chain, not assumed).
        assert row.balance_wei < config.volunteer_funding_wei - config.stake_wei + row.reward_wei
    # Funded 0.5 + 2 budgets, one budget fixed for epoch 0, the slash minus bounty back to pool.
    funded = config.reward_per_epoch_wei // 2 + 2 * config.reward_per_epoch_wei
    assert report.run_available_wei == (
        funded - report.epoch_budget_wei + config.stake_wei - report.bounty_wei
    )
    assert registry.functions.totalStakedWei().call() == 4 * config.stake_wei  # 3 relays + data

    # What is printed is what the chain holds.
    for row in report.rows:
        assert f"{row.name} {row.node_address[:10]}" in text
        assert format_eth(row.reward_wei) in text
    assert f"bounty {format_eth(report.bounty_wei)} ETH" in text
    assert "refused: ClaimNotOpen" in text
    assert report.gas_by_operation["submitEpochRoot"] and all(
        0 < gas < 200_000 for gas in report.gas_by_operation["submitEpochRoot"]
    )
