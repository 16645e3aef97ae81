"""The demo's summary: numbers read back from the chain, and the tables a person reads."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from node.chain.adapter import format_eth


@dataclass(frozen=True)
class NodeRow:
    name: str
    stage: int
    node_address: str
    wallet: str
    stake_wei: int
    units: int  # certified
    claimed_units: int
    reward_wei: int
    slashed_wei: int
    gas_used: int
    balance_wei: int


@dataclass(frozen=True)
class DemoReport:
    run_id: int
    registry: str
    ledger: str
    disputes: str
    certified_hops: int
    certified_units: int
    rows: tuple[NodeRow, ...]
    epoch_budget_wei: int
    run_available_wei: int
    auditor: str
    bounty_wei: int
    burned_wei: int
    returned_wei: int  # what nobody claimed, back in the pool when the claim period ended
    gas_by_operation: dict[str, tuple[int, ...]]

    @property
    def rewards_paid_wei(self) -> int:
        return sum(row.reward_wei for row in self.rows)


def nodes_table(report: DemoReport) -> Table:
    table = Table(title=f"Run {report.run_id}, epoch 0: what the chain says about each relay")
    for heading in (
        "node",
        "stage",
        "certified units",
        "claimed units",
        "stake ETH",
        "reward ETH",
        "slashed ETH",
        "gas used",
        "wallet ETH",
    ):
        table.add_column(heading, justify="left" if heading == "node" else "right")
    for row in report.rows:
        table.add_row(
            f"{row.name} {row.node_address[:10]}",
            str(row.stage),
            str(row.units),
            str(row.claimed_units),
            format_eth(row.stake_wei),
            format_eth(row.reward_wei),
            format_eth(row.slashed_wei),
            f"{row.gas_used:,}",
            format_eth(row.balance_wei),
        )
    return table  # fmt: skip


def gas_table(report: DemoReport) -> Table:
    table = Table(title="Gas per operation (from transaction receipts)")
    for heading in ("operation", "transactions", "mean gas", "max gas"):
        table.add_column(heading, justify="left" if heading == "operation" else "right")
    for operation, used in sorted(report.gas_by_operation.items()):
        if operation.startswith("refused: "):
            table.add_row(operation, str(len(used)), "-", "-")
            continue
        table.add_row(operation, str(len(used)), f"{sum(used) // len(used):,}", f"{max(used):,}")
    return table


def print_report(report: DemoReport, console: Console) -> None:
    console.print(
        f"NodeRegistry {report.registry}   WorkLedger {report.ledger}   Disputes {report.disputes}"
    )
    console.print(nodes_table(report))
    console.print(
        f"certified {report.certified_hops} hops, {report.certified_units} units; epoch budget "
        f"{format_eth(report.epoch_budget_wei)} ETH; rewards paid "
        f"{format_eth(report.rewards_paid_wei)} ETH, unclaimed and back in the pool "
        f"{format_eth(report.returned_wei)} ETH; auditor {report.auditor[:10]} bounty "
        f"{format_eth(report.bounty_wei)} ETH; burned {format_eth(report.burned_wei)} ETH; "
        f"run pool now {format_eth(report.run_available_wei)} ETH"
    )
    console.print(gas_table(report))
