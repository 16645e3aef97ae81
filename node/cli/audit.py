"""``gwtf-node audit`` and ``gwtf-node challenge``: check one epoch of a run against what its
nodes serve, and prove its fraud on chain.

``audit`` reads the epoch's certificates from the chain, fetches each data node's leaves with
their proofs and every given peer's receipts (``node.audit.runner``), and reports per
certificate what it checked and found; each finding the chain convicts on alone is marked
provable. Exits 0 when nothing is found and ``EXIT_FINDINGS`` otherwise.

``challenge`` runs the same audit, then sends each provable finding's fraud proof from the
given wallet (``node.audit.challenge``: commit, reveal, judged) and withdraws the bounties.
Exits 0 when every finding is judged (now or before) and ``EXIT_FINDINGS`` while any is left
that the chain did not or cannot judge (withheld leaves, an unchecked certificate, a refused or
failed proof).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import trio
from rich.console import Console
from rich.table import Table

from node.audit.challenge import REFUSED, Challenges, challenge
from node.audit.runner import AuditReport, audit_epoch
from node.chain.actions import Contracts
from node.chain.adapter import Sender, format_eth
from node.chain.wallet import open_wallet, resolve_password
from node.cli.args import Command
from node.composition import open_contracts
from node.settings import Settings

#: The exit code of an audit that found something (fraud or withheld leaves).
EXIT_FINDINGS = 10


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    audit = sub.add_parser("audit", help="check an epoch's certificates and receipts for fraud")
    _audit_flags(audit)
    prove = sub.add_parser(
        "challenge", help="audit an epoch and prove each fraud found on chain, for the bounty"
    )
    _audit_flags(prove)
    prove.add_argument("--wallet", required=True, help="the challenger's wallet keystore")
    prove.add_argument("--password-file", help="file holding the keystore password")
    return {"audit": cmd_audit, "challenge": cmd_challenge}


def _audit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=int, required=True, help="run id")
    parser.add_argument("--epoch", type=int, required=True, help="epoch of the run")
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="ADDR",
        help="a node to fetch receipts from, /ip4/HOST/tcp/PORT/p2p/PEER_ID (repeat it)",
    )
    parser.add_argument("--timeout-s", type=float, default=20.0, help="per request to a node")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_audit(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    report = _audit(args, contracts, console)
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        print_report(console, report)
    return EXIT_FINDINGS if report.findings else 0


def cmd_challenge(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    challenger = Sender.from_account(open_wallet(args.wallet, resolve_password(args.password_file)))
    report = _audit(args, contracts, console)
    if args.json:
        done = challenge(contracts, challenger, report.findings)
        print(json.dumps({**report_json(report), **challenges_json(done)}, indent=2))
    else:
        print_report(console, report)
        with console.status("proving on chain"):
            done = challenge(contracts, challenger, report.findings)
        print_challenges(console, done)
    judged = {id(j.finding) for j in done.judgements if j.outcome != REFUSED}
    left = [f for f in report.findings if not f.judged and id(f) not in judged]
    return EXIT_FINDINGS if left else 0


def _audit(args: argparse.Namespace, contracts: Contracts, console: Console) -> AuditReport:
    if args.json:
        return trio.run(audit_epoch, contracts, args.run, args.epoch, args.peer, args.timeout_s)
    with console.status("auditing") as status:

        def progress(step: str) -> None:
            status.update(f"auditing: {step}")

        return trio.run(
            audit_epoch, contracts, args.run, args.epoch, args.peer, args.timeout_s, progress
        )


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
                "findings": [f.as_json() for f in c.findings],
            }
            for c in report.certificates
        ],
        "equivocations": [f.as_json() for f in report.equivocations],
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
            convicts = f.proof.function if f.proof else ("judged" if f.judged else "no")
            found.add_row(f.kind, f.accused, f.detail, convicts)
        console.print(found)
    unreachable = {node: why for node, why in report.peers.items() if why != "ok"}
    for node, why in unreachable.items():
        console.print(f"peer {node}: {why}")
    console.print(
        f"{len(report.certificates)} certificates, {report.receipts_seen} receipts seen: "
        + (f"{len(report.findings)} findings, {len(report.fraud)} provable on chain"
           if report.findings else "no finding")
    )  # fmt: skip


def challenges_json(done: Challenges) -> dict[str, Any]:
    return {
        "challenges": [
            {
                **j.finding.as_json(),
                "outcome": j.outcome,
                "why": j.detail,
                "slashed_wei": str(j.slashed_wei),
                "bounty_wei": str(j.bounty_wei),
                "tx_hash": j.tx_hash,
            }
            for j in done.judgements
        ],
        "bounty_wei": str(done.bounty_wei),
        "withdrawn_wei": str(done.withdrawn_wei),
    }


def print_challenges(console: Console, done: Challenges) -> None:
    if not done.judgements:
        console.print("nothing to prove on chain")
        return
    table = Table(title="fraud proofs")
    for column in ("kind", "accused", "outcome", "slashed ETH", "bounty ETH"):
        table.add_column(column, justify="right" if "ETH" in column else "left")
    for j in done.judgements:
        outcome = j.outcome if not j.detail else f"{j.outcome}: {j.detail}"
        table.add_row(
            j.finding.kind, j.finding.accused, outcome[:80], format_eth(j.slashed_wei),
            format_eth(j.bounty_wei),
        )  # fmt: skip
    console.print(table)
    console.print(f"bounties withdrawn: {format_eth(done.withdrawn_wei)} ETH")
