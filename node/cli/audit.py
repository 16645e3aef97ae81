"""``gwtf-node audit``: check one epoch of a run against what its nodes serve.

Reads the epoch's certificates from the chain, fetches each data node's leaves with their proofs
and every given peer's receipts (``node.audit.runner``), and reports per certificate what it
checked and found; each finding the chain convicts on alone is marked provable. Exits 0 when
nothing is found and ``EXIT_FINDINGS`` otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import trio
from rich.console import Console
from rich.table import Table

from node.audit.checks import Finding
from node.audit.runner import AuditReport, audit_epoch
from node.cli.args import Command
from node.composition import open_contracts
from node.settings import Settings

#: The exit code of an audit that found something (fraud or withheld leaves).
EXIT_FINDINGS = 10


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    audit = sub.add_parser("audit", help="check an epoch's certificates and receipts for fraud")
    audit.add_argument("--run", type=int, required=True, help="run id")
    audit.add_argument("--epoch", type=int, required=True, help="epoch of the run")
    audit.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="ADDR",
        help="a node to fetch receipts from, /ip4/HOST/tcp/PORT/p2p/PEER_ID (repeat it)",
    )
    audit.add_argument("--timeout-s", type=float, default=20.0, help="per request to a node")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    return {"audit": cmd_audit}


def cmd_audit(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    if args.json:
        report = trio.run(audit_epoch, contracts, args.run, args.epoch, args.peer, args.timeout_s)
        print(json.dumps(report_json(report), indent=2))
    else:
        with console.status("auditing") as status:

            def progress(step: str) -> None:
                status.update(f"auditing: {step}")

            report = trio.run(
                audit_epoch, contracts, args.run, args.epoch, args.peer, args.timeout_s, progress
            )
        print_report(console, report)
    return EXIT_FINDINGS if report.findings else 0


def finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "kind": finding.kind,
        "accused": finding.accused,
        "detail": finding.detail,
        "provable_on_chain": finding.proof is not None,
        "fraud_proof": finding.proof.function if finding.proof is not None else None,
    }


def report_json(report: AuditReport) -> dict[str, Any]:
    return {
        "run": report.run_id,
        "epoch": report.epoch,
        "peers": report.peers,
        "receipts_seen": report.receipts_seen,
        "certificates": [
            {
                "data_node": c.cert.dataNode,
                "root": "0x" + c.cert.root.hex(),
                "count": c.cert.count,
                "units": c.cert.units,
                "leaves_served": c.leaves_served,
                "findings": [finding_json(f) for f in c.findings],
            }
            for c in report.certificates
        ],
        "equivocations": [finding_json(f) for f in report.equivocations],
        "findings": len(report.findings),
        "provable": len(report.fraud),
    }


def print_report(console: Console, report: AuditReport) -> None:
    table = Table(title=f"run {report.run_id}, epoch {report.epoch}: certificates")
    table.add_column("data node")
    for column in ("hops", "units", "leaves checked", "findings"):
        table.add_column(column, justify="right")
    for c in report.certificates:
        table.add_row(
            c.cert.dataNode, str(c.cert.count), str(c.cert.units), str(c.leaves_served),
            str(len(c.findings)),
        )  # fmt: skip
    console.print(table)
    if report.findings:
        found = Table(title="findings")
        for column in ("kind", "accused", "what", "the chain convicts on"):
            found.add_column(column)
        for f in report.findings:
            found.add_row(f.kind, f.accused, f.detail, f.proof.function if f.proof else "no")
        console.print(found)
    unreachable = {node: why for node, why in report.peers.items() if why != "ok"}
    for node, why in unreachable.items():
        console.print(f"peer {node}: {why}")
    console.print(
        f"{len(report.certificates)} certificates, {report.receipts_seen} receipts seen: "
        + (f"{len(report.findings)} findings, {len(report.fraud)} provable on chain"
           if report.findings else "no finding")
    )  # fmt: skip
