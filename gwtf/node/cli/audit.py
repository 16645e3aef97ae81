"""``gwtf-node audit`` and ``gwtf-node challenge``: check one epoch of a run against what its
nodes serve, and prove its fraud on chain.

``audit`` reads the epoch's certificates from the chain, fetches each data node's leaves with
their proofs and every given peer's receipts (``gwtf.node.audit.runner``), and reports per
certificate what it checked and found; each finding the chain convicts on alone is marked
provable. Exits 0 when nothing is found, ``EXIT_FINDINGS`` when something is found against a
node (fraud, withheld or unproven leaves, weights that differ), and ``EXIT_INCOMPLETE`` when
all it found accuses nobody: what it could not read or check (``unchecked``), leaves or
evidence a forwarder passed on that do not verify (``unverified``), hops it could not
re-execute (``unreplayed``). Nothing is proven then; the audit is to be run again, with other
peers or later.

With ``--sample K`` it also re-executes K hops of each certificate, drawn from the first block
after the epoch's submission deadline, from the evidence the relays keep, on CPU with the run's
model (``--model``, default ``training.model``); a wrong tensor is a finding for a jury.

``challenge`` runs the same audit, then sends each provable finding's fraud proof from the
given wallet (``gwtf.node.audit.challenge``: commit, reveal, judged), opens a tensor dispute (with
the contract's bond) for a wrong tensor, and withdraws the bounties. Exits 0 when every finding
is judged or disputed (now or before), ``EXIT_FINDINGS`` while any is left against a node that
the chain did not or cannot judge (withheld leaves, a refused or failed proof), and
``EXIT_INCOMPLETE`` when all that is left accuses nobody (an unchecked certificate, leaves a
forwarder passed on that do not verify, an unreplayed hop).

``jury join`` locks a juror deposit in the Court for one of the wallet's nodes; ``jury serve``
then takes every step the wallet's roles call for in each open case (``gwtf.node.audit.jury``): as
a drawn juror it re-executes the disputed hop (dialling with the key of the wallet's node
``--node-name``, so that the accused answers it outside the outsiders' shared rate) and votes by
commit-reveal, as the accused it
answers, as the challenger it reveals its draw salt, and for anyone it draws juries and
executes rulings that are due. It loops until stopped (``--once``: one pass).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import TYPE_CHECKING, Any

from gwtf.errors import ConfigError
from gwtf.node.audit.tolerance import TOLERANCES, Tolerance
from gwtf.node.cli.args import Command, add_wallet_flags, whole
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from gwtf.node.audit.challenge import Challenges
    from gwtf.node.audit.checks import Finding
    from gwtf.node.audit.reexecute import Replayer
    from gwtf.node.audit.replays import Replayed
    from gwtf.node.audit.runner import AuditReport
    from gwtf.node.chain.actions import Contracts


#: The exit code of an audit that found something against a node (fraud, withheld leaves).
EXIT_FINDINGS = 10
#: The exit code of an audit that found nothing against anyone but could not check everything
#: (its only findings accuse nobody): nothing proven.
EXIT_INCOMPLETE = 11


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    audit = sub.add_parser("audit", help="check an epoch's certificates and receipts for fraud")
    _audit_flags(audit)
    prove = sub.add_parser(
        "challenge", help="audit an epoch and prove each fraud found on chain, for the bounty"
    )
    _audit_flags(prove)
    prove.add_argument("--wallet", required=True, help="the challenger's wallet keystore")
    prove.add_argument("--password-file", help="file holding the keystore password")
    jury = sub.add_parser(
        "jury", help="sit on the court's juries: re-execute disputed hops and vote on them"
    )
    jury.add_argument("action", choices=("join", "serve"), help="join: lock a deposit; serve")
    add_wallet_flags(jury)  # serve: the juror node's key (--node-name) is what it dials with
    jury.add_argument("--node", help="join: the wallet's node that sits (one per wallet)")
    jury.add_argument("--deposit-eth", type=float, default=0.0, help="join: ETH to lock")
    _peer_flags(jury)
    jury.add_argument("--model", help="the runs' model, e.g. gpt-tiny (default training.model)")
    _tolerance_flag(jury)
    jury.add_argument("--once", action="store_true", help="serve: one pass, then exit")
    jury.add_argument("--poll-s", type=float, default=12.0, help="serve: seconds between passes")
    return {"audit": cmd_audit, "challenge": cmd_challenge, "jury": cmd_jury}


def _audit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=whole, required=True, help="run id")
    parser.add_argument("--epoch", type=whole, required=True, help="epoch of the run")
    parser.add_argument(
        "--sample", type=whole, default=0, metavar="K",
        help="re-execute K hops of each certificate, and one of each worker at least, from the "
        "relays' evidence (default 0: none)",
    )  # fmt: skip
    parser.add_argument("--model", help="the run's model, e.g. gpt-tiny (default training.model)")
    _tolerance_flag(parser)
    _peer_flags(parser)


def _tolerance_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tolerance", choices=sorted(TOLERANCES), default="bf16",
        help="how far a replay may differ: bf16 (default; covers relays on GPUs in bf16 "
        "autocast) or cpu (only when every relay computes on CPU in float32)",
    )  # fmt: skip


def _peer_flags(parser: argparse.ArgumentParser) -> None:
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
    from gwtf.node.chain.actions import open_contracts

    contracts, _ = open_contracts(settings)
    report = _audit(args, contracts, console, settings)
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        print_report(console, report)
    return exit_code_of(report.findings)


def exit_code_of(findings: Sequence[Finding]) -> int:
    """0 for no finding, ``EXIT_FINDINGS`` when one holds something against a node, else
    ``EXIT_INCOMPLETE`` (each accuses nobody)."""
    from gwtf.node.audit.runner import accusing

    if accusing(findings):
        return EXIT_FINDINGS
    return EXIT_INCOMPLETE if findings else 0


def cmd_challenge(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.audit.challenge import REFUSED, challenge
    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.chain.adapter import Sender
    from gwtf.node.chain.wallet import open_wallet, resolve_password

    contracts, _ = open_contracts(settings)
    challenger = Sender.from_account(open_wallet(args.wallet, resolve_password(args.password_file)))
    report = _audit(args, contracts, console, settings)
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
    return exit_code_of(left)


def cmd_jury(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    import trio
    from web3 import Web3

    from gwtf.node.audit.jury import serve_once
    from gwtf.node.chain.actions import deposit_juror, open_contracts
    from gwtf.node.chain.adapter import Sender
    from gwtf.node.chain.wallet import node_key_path, open_wallet, resolve_password

    contracts, _ = open_contracts(settings)
    password = resolve_password(args.password_file)
    wallet = Sender.from_account(open_wallet(args.wallet, password))
    if args.action == "join":
        if not args.node or args.deposit_eth <= 0:
            raise ConfigError("jury join needs --node ADDRESS and --deposit-eth above 0")
        node = Web3.to_checksum_address(args.node)
        amount = Web3.to_wei(args.deposit_eth, "ether")
        deposit_juror(contracts, wallet, node, amount)
        console.print(f"{node} sits on juries with {args.deposit_eth} ETH more locked")
        return 0
    # A juror dials with its node's key: an accused answers its seated jurors outside the
    # rate all outsiders share, which anyone can flood.
    key_file = node_key_path(args.wallet, args.node_name)
    node_key = bytes(open_wallet(key_file, password).key) if key_file.is_file() else None
    if node_key is None:
        print(
            f"gwtf-node: no node key {key_file}: a juror dials with a fresh identity, which an "
            "accused answers only within the rate all outsiders share (give the juror node's "
            "--node-name)",
            file=sys.stderr,
        )
    model = args.model or settings.training.model
    tolerance = TOLERANCES[args.tolerance]
    replayers: dict[int, Replayer] = {}

    def replayer_of(run_id: int) -> Replayer:
        if run_id not in replayers:
            replayers[run_id] = replayer_for(contracts, run_id, model, settings, tolerance)
        return replayers[run_id]

    while True:
        steps = trio.run(
            serve_once, contracts, wallet, args.peer, replayer_of, args.timeout_s, None, node_key
        )
        for step in steps:
            if args.json:
                print(json.dumps(step.as_json()))
            else:
                console.print(f"case {step.case_id}: {step.action} {step.detail}".rstrip())
        if args.once:
            return 0
        trio.run(trio.sleep, args.poll_s)


def replayer_for(
    contracts: Contracts, run_id: int, model: str, settings: Settings, tolerance: Tolerance
) -> Replayer:
    """A CPU replayer of ``model`` split into run ``run_id``'s stages."""
    from gwtf.node.audit.reexecute import Replayer
    from gwtf.node.training.partition import model_for_run, plan_partition
    from gwtf.node.training.shards import run_vocab

    run = contracts.port().run_info(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id} on this chain; check --run and the RPC URL")
    training = settings.training
    vocab = run_vocab(training.data, training.vocab_size)
    config = model_for_run(model, training.seq_len, run.stage_count, vocab)
    return Replayer(plan_partition(config, run.stage_count), settings.training, tolerance)


def _audit(
    args: argparse.Namespace, contracts: Contracts, console: Console, settings: Settings
) -> AuditReport:
    import trio

    from gwtf.node.audit.runner import Sampling, audit_epoch

    sampling = None
    if args.sample < 0:
        raise ConfigError(f"--sample {args.sample}: give a number of hops, 0 or more")
    if args.sample > 0:
        model = args.model or settings.training.model
        tolerance = TOLERANCES[args.tolerance]
        replayer = replayer_for(contracts, args.run, model, settings, tolerance)
        sampling = Sampling(args.sample, replayer)
    call = functools.partial(
        audit_epoch, contracts, args.run, args.epoch, args.peer, args.timeout_s,
        sampling=sampling,
    )  # fmt: skip
    if args.json:
        return trio.run(call)
    with console.status("auditing") as status:

        def progress(step: str) -> None:
            status.update(f"auditing: {step}")

        return trio.run(functools.partial(call, progress=progress))


def report_json(report: AuditReport) -> dict[str, Any]:
    return {
        "run": report.run_id,
        "epoch": report.epoch,
        "peers": report.peers,
        "forwarded": report.forwarded,
        "receipts_seen": report.receipts_seen,
        "certificates": [
            {
                "data_node": c.cert.dataNode,
                "root": "0x" + c.cert.root.hex(),
                "count": c.cert.count,
                "units": c.cert.units,
                "leaves_served": c.leaves_served,
                "read_through": c.read_through,
                "replayed": [_replayed_json(done) for done in c.replayed],
                "findings": [f.as_json() for f in c.findings],
            }
            for c in report.certificates
        ],
        "sample_note": report.sample_note,
        "equivocations": [f.as_json() for f in report.equivocations],
        "findings": len(report.findings),
        "provable": len(report.fraud),
    }


def _replayed_json(done: Replayed) -> dict[str, Any]:
    r, replay = done.entry.receipt, done.replay
    return {
        "worker": r.worker,
        "iteration": r.iteration,
        "microbatch": r.microbatchId,
        "stage": r.stage,
        "direction": "forward" if r.direction == 0 else "backward",
        "exact": replay.exact if replay else None,
        "relative_error": replay.relative_error if replay else None,
        "cosine": replay.cosine if replay else None,
        "wrong": replay.wrong if replay else None,
        "compute_s": replay.compute_s if replay else None,
        "weights_from": done.weights_from,
        "not_replayed_because": done.why_not,
    }


def print_report(console: Console, report: AuditReport) -> None:
    from rich.table import Table

    table = Table(title=f"run {report.run_id}, epoch {report.epoch}: certificates")
    table.add_column("data node")
    for column in ("hops", "units", "leaves checked", "re-executed", "exact", "findings"):
        table.add_column(column, justify="right")
    for c in report.certificates:
        replayed = [d.replay for d in c.replayed if d.replay is not None]
        table.add_row(
            c.cert.dataNode, str(c.cert.count), str(c.cert.units), str(c.leaves_served),
            f"{len(replayed)} of {len(c.replayed)}", str(sum(r.exact for r in replayed)),
            str(len(c.findings)),
        )  # fmt: skip
    console.print(table)
    _print_workers(console, report)
    if report.sample_note:
        console.print(report.sample_note)
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
    for node, via in report.forwarded.items():
        console.print(f"peer {node}: not dialable, read through {via}")
    for c in report.certificates:
        if c.read_through:
            console.print(f"certificate of {c.cert.dataNode}: read through {c.read_through}")
    console.print(
        f"{len(report.certificates)} certificates, {report.receipts_seen} receipts seen: "
        + (f"{len(report.findings)} findings, {len(report.fraud)} provable on chain"
           if report.findings else "no finding")
    )  # fmt: skip


def _print_workers(console: Console, report: AuditReport) -> None:
    """Per node: hops in the certificates, re-executed, wrong, findings against it."""
    from rich.table import Table

    hops: dict[str, list[int]] = {}
    for c in report.certificates:
        for done in c.replayed:
            row = hops.setdefault(done.entry.receipt.worker, [0, 0, 0])
            row[0] += 1
            if done.replay is not None:
                row[1] += 1
                row[2] += done.replay.wrong
    if not hops:
        return
    accused: dict[str, int] = {}
    for f in report.findings:
        accused[f.accused.lower()] = accused.get(f.accused.lower(), 0) + 1
    table = Table(title="re-executed hops by worker")
    table.add_column("worker")
    for column in ("sampled", "re-executed", "wrong", "findings"):
        table.add_column(column, justify="right")
    for worker, (sampled, replayed, wrong) in sorted(hops.items()):
        found = str(accused.get(worker.lower(), 0))
        table.add_row(worker, str(sampled), str(replayed), str(wrong), found)
    console.print(table)


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
        "released_disputes": done.released,
    }


def print_challenges(console: Console, done: Challenges) -> None:
    from rich.table import Table

    from gwtf.node.chain.adapter import format_eth

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
    if done.released:
        ids = ", ".join(map(str, done.released))
        console.print(f"stakes thawed: the grace of disputes {ids} was over")
