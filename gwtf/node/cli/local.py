"""``gwtf-node devnet|fund|demo|swarm``: a network on this machine, for trying and testing."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gwtf.errors import GwtfError
from gwtf.node.cli.args import Command, address, eth_amount, port
from gwtf.node.cli.output import emit
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console

    from gwtf.node.swarm.chain import SwarmChain


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    from gwtf.node.devnet.anvil import BACKENDS, DEFAULT_ANVIL

    devnet = sub.add_parser(
        "devnet",
        help="start a dev chain with the contracts deployed",
        description="Start anvil (from the npm lock) on --host:--port, deploy the contracts, "
        "write the devnet file and serve until Ctrl-C; with --rpc-url, deploy on that chain "
        "and return. Where anvil is not installed, an embedded eth-tester chain stands in.",
    )
    devnet.add_argument("--host", default="127.0.0.1")
    devnet.add_argument("--port", type=port, default=8545, help="0 picks a free port")
    devnet.add_argument(
        "--backend", choices=BACKENDS, default="auto",
        help="auto: anvil where its binary is installed, else eth-tester (default: auto)",
    )  # fmt: skip
    devnet.add_argument(
        "--anvil", type=Path, default=None, help=f"the anvil binary (default: {DEFAULT_ANVIL})"
    )

    fund = sub.add_parser("fund", help="send devnet ETH from a dev account to an address")
    fund.add_argument("--to", type=address, required=True, help="recipient address")
    fund.add_argument("--eth", type=eth_amount, default=eth_amount("10"), help="amount (ETH)")

    demo = sub.add_parser(
        "demo",
        help="the whole system on this machine: a swarm trains through churn, is paid, audited",
        description="A dev chain, a funded run, staked volunteers' nodes as processes on "
        "loopback training a small model while relays are killed and others join; receipts, "
        "epochs certified, audited and claimed, a cheating relay slashed, the model exported; "
        "then a summary checked against the chain, and plots. About 2 minutes on 2 cores "
        "(--quick: about 1).",
    )
    demo.add_argument("--quick", action="store_true", help="the same story, smaller and faster")
    demo.add_argument("--model", choices=("gpt", "llama"), default="gpt", help="model family")
    demo.add_argument("--no-cheater", action="store_true", help="every node honest")
    demo.add_argument("--out", default=".gwtf/demo", help="folder for logs, plots, the model")
    demo.add_argument("--timeout-s", type=float, default=900.0, help="the swarm's time limit")

    swarm = sub.add_parser(
        "swarm",
        help="run a local training swarm on its own devnet, one process per node",
        description="Start a devnet (or use [chain] rpc_url), register every node on it, and run "
        "the nodes as processes on loopback with admission on; [chain] enabled = false runs "
        "without a chain. Examples: gwtf/node/swarm/examples/*.toml.",
    )
    swarm.add_argument(
        "--swarm-file", required=True, help="swarm file (TOML), see gwtf/node/swarm/"
    )
    swarm.add_argument("--out", default=".gwtf/swarm", help="folder for logs, states, summary")
    swarm.add_argument("--timeout-s", type=float, default=600.0)
    swarm.add_argument(
        "--keep-chain",
        action="store_true",
        help="leave the swarm's devnet serving after the run (until Ctrl-C), for other commands",
    )
    return {"devnet": cmd_devnet, "fund": cmd_fund, "demo": cmd_demo, "swarm": cmd_swarm}


def cmd_devnet(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.devnet.server import run_devnet

    run_devnet(
        args.host, args.port, settings.chain.rpc_url or None, settings.chain.devnet_file, console,
        backend=args.backend, anvil=args.anvil, as_json=args.json,
    )  # fmt: skip
    return 0


def cmd_fund(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.api.schemas import Amount
    from gwtf.node.chain.actions import open_contracts, transfer_eth
    from gwtf.node.chain.adapter import Sender, format_eth

    contracts, info = open_contracts(settings)
    faucet = Sender.unlocked(info.accounts[0].address)
    transfer_eth(contracts.w3, faucet, args.to, args.eth)
    balance = contracts.w3.eth.get_balance(args.to)
    data = {"to": args.to, "sent": Amount.of(args.eth),
            "balance": Amount.of(balance)}  # fmt: skip
    return emit(args, console, data, lambda c: c.print(
        f"sent {format_eth(args.eth)} ETH to {args.to}; it now holds {format_eth(balance)}"
    ))  # fmt: skip


def cmd_demo(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from rich.console import Console

    from gwtf.node.demo.run import DemoOptions, print_report, run_demo

    options = DemoOptions(
        Path(args.out), args.quick, args.model, not args.no_cheater, args.timeout_s
    )
    # With --json the progress and the story are for nobody: the report is the result.
    report = run_demo(options, Console(file=io.StringIO()) if args.json else console, not args.json)
    if args.json:
        emit(args, console, report.as_json(), lambda c: None)
    else:
        print_report(report, console)
    if not report.ok:
        failed = ", ".join(check.name for check in report.checks if not check.ok)
        raise GwtfError(f"the demo's checks failed: {failed}; see {options.out / 'report.json'}")
    return 0


def cmd_swarm(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from rich.console import Console

    from gwtf.node.swarm.plan import plan_from_file
    from gwtf.node.swarm.progress import LiveProgress
    from gwtf.node.swarm.run import run_swarm

    plan = plan_from_file(Path(args.swarm_file), Path(args.out))
    log = (plan.out_dir / "swarm.log").open("wb")
    with log:
        if args.json:
            summary = run_swarm(plan, log, args.timeout_s, keep_chain=args.keep_chain)
        else:
            console.print(f"swarm: the nodes' logs are in {plan.out_dir / 'swarm.log'}")
            with LiveProgress(plan, console, f"GWTF swarm: {Path(args.swarm_file).name}"):
                summary = run_swarm(plan, log, args.timeout_s, keep_chain=args.keep_chain)
    if args.json:
        emit(args, console, summary, lambda c: None)
    else:
        print_swarm(console, summary, plan.out_dir / "summary.json")
        if summary["chain"].get("earnings"):
            print_earnings(console, summary["chain"])
    if args.keep_chain and plan.chain is not None:
        # With --json, stdout holds the summary alone.
        serve_until_interrupted(plan.chain, Console(stderr=True) if args.json else console)
    return 0


def serve_until_interrupted(chain: SwarmChain, console: Console) -> None:
    """Keep the swarm's chain up for other commands until Ctrl-C (it dies with this process)."""
    console.print(
        f"the chain stays up at {chain.rpc_url} (run {chain.run_id}); try "
        f"`gwtf-node --devnet-file {chain.devnet_file} runs list`; Ctrl-C stops it",
        highlight=False,
    )
    try:
        if chain.devnet is not None:
            chain.devnet.wait()
    except KeyboardInterrupt:
        pass
    finally:
        chain.stop()


def print_swarm(console: Console, summary: dict[str, Any], summary_file: Path) -> None:
    """The swarm's run in a few lines; the whole summary is in ``summary_file``."""
    from rich.table import Table

    from gwtf.node.swarm.labels import crash_label, join_label

    work, recovered = summary["work"], summary["recovered_hops"]
    losses = summary["loss_per_iteration"]
    table = Table(title="the swarm's run", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("iterations", str(summary["iterations"]))
    if losses:
        table.add_row("loss", f"{losses[0]:.4f} -> {losses[-1]:.4f}")
    validation = summary.get("validation_loss") or []
    if validation:
        first, last = validation[0], validation[-1]
        unverified = summary.get("validation_unverified") or []
        table.add_row(
            "validation loss",
            f"{first[1]:.4f} (iteration {first[0]}) -> {last[1]:.4f} (iteration {last[0]})"
            + (
                f"; unverified at {len(unverified)} of {len(validation)} (a stage's weights "
                "from one relay)"
                if unverified
                else ""
            ),
        )
    table.add_row(
        "microbatches",
        f"{work['microbatches_completed']} of {work['microbatches_asked']} asked completed, "
        f"{work['microbatches_lost']} lost, {recovered['restarted_microbatches']} restarted",
    )
    table.add_row(
        "gradients",
        f"{work['gradients_redone']} redone after a crash ({work['microbatches_redone']} "
        f"microbatches), {work['gradients_lost']} lost, {work['gradients_duplicated']} "
        "counted twice",
    )
    table.add_row("throughput", f"{summary['throughput_mb_per_s']} microbatches/s")
    table.add_row("crashes", ", ".join(map(crash_label, summary["crashes"])) or "none")
    table.add_row("joins", ", ".join(map(join_label, summary["joins"])) or "none")
    out_of_step = summary["replicas_out_of_step"]
    flagged = [
        f"{r['node']} (step {r['step']}, expected {r['expected_step']})" for r in out_of_step
    ]
    table.add_row("replicas out of step", ", ".join(flagged) or "none")
    console.print(table)
    console.print(f"summary: {summary_file}", highlight=False)


def print_earnings(console: Console, chain: dict[str, Any]) -> None:
    """The swarm's epochs and each node's receipts and rewards, as tables."""
    from rich.table import Table

    from gwtf.node.chain.adapter import format_eth

    epochs = Table(title="epochs on chain")
    for column in ("epoch", "hops certified", "units", "units claimed", "budget ETH", "paid ETH"):
        epochs.add_column(column, justify="right")
    epochs.add_column("adds up to the wei")
    for epoch in chain["epochs"]:
        count = sum(c["count"] for c in epoch["certificates"].values())
        epochs.add_row(
            str(epoch["epoch"]), str(count), str(epoch["certified_units"]),
            str(epoch["claimed_units"]), format_eth(int(epoch["budget_wei"])),
            format_eth(int(epoch["claimed_wei"])), "yes" if epoch["adds_up"] else "NO",
        )  # fmt: skip
    console.print(epochs)
    nodes = Table(title="receipts and rewards per node")
    nodes.add_column("node")
    for column in ("signed", "countersigned", "units claimed", "reward ETH", "stake ETH"):
        nodes.add_column(column, justify="right")
    for name, entry in sorted(chain["earnings"].items()):
        receipts = entry["receipts"]
        nodes.add_row(
            name, str(receipts.get("signed") or 0), str(receipts.get("countersigned") or 0),
            str(entry["units"]), entry["reward_eth"], format_eth(int(entry["stake_wei"])),
        )  # fmt: skip
    console.print(nodes)
    audit = chain.get("audit")
    if audit is not None:
        found = audit["findings"]
        console.print(
            f"audit: {audit['certificates']} certificates, {audit['leaves_checked']} leaves and "
            f"{audit['receipts_seen']} receipts checked: "
            + (", ".join(f"{f['kind']} by {f['accused']}" for f in found) or "no finding")
        )
        for proof in audit.get("challenges", []):
            if proof["outcome"] == "slashed":
                console.print(
                    f"slashed {proof['accused']} for {proof['kind']}: "
                    f"{format_eth(int(proof['slashed_wei']))} ETH, bounty "
                    f"{format_eth(int(proof['bounty_wei']))} ETH"
                )
