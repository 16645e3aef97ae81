"""`gwtf-node demo`: the whole system on this machine, end to end, then told.

A dev chain (anvil) with the contracts; a sponsor opens and funds a run; volunteers' nodes are
registered with a stake and join it; a data node and relays train a small model as separate
processes on loopback through the ten-region link emulation, while relays are killed in the
middle of hops and others join; every hop is receipted, each epoch certified, audited and
claimed, and a relay that signed two versions of a hop is proven and slashed (``gwtf.node.swarm``
does all of it, from ``gwtf.node.demo.plan``'s swarm file). Before the nodes stop, the sponsor's
export takes the trained model from them. At the end: a summary a person reads, each figure
checked against the others and the chain (``gwtf.node.demo.report``), and PNG plots.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from rich.console import Console
from rich.table import Table

from gwtf.node.chain.adapter import format_eth
from gwtf.node.demo.plan import CHEATER, demo_swarm
from gwtf.node.demo.plots import write_plots
from gwtf.node.demo.report import DemoReport, Planned, demo_report
from gwtf.node.export.run import export_run
from gwtf.node.export.writer import CONFIG_FILE, PROVENANCE_FILE, WEIGHTS_FILE
from gwtf.node.settings import load_settings
from gwtf.node.status_file import read_results
from gwtf.node.swarm.plan import SwarmPlan, plan_from_file
from gwtf.node.swarm.progress import LiveProgress
from gwtf.node.swarm.run import live_addresses, run_swarm

WEI_PER_ETH = 10**18
EXPORT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    quick: bool = False
    family: str = "gpt"
    cheater: bool = True
    timeout_s: float = 900.0


@dataclass
class _AtTheEnd:
    """What the demo reads while the nodes still serve."""

    results: list[dict[str, Any]]
    pool_left_wei: int = 0
    export: dict[str, Any] | None = None
    export_error: str = ""


def run_demo(options: DemoOptions, console: Console, live: bool = True) -> DemoReport:
    """Run the demo into ``options.out``; ``live``: draw its progress while it runs."""
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    swarm_file = out / "demo-swarm.toml"
    swarm = demo_swarm(options.quick, options.family, options.cheater)
    swarm_file.write_text(tomli_w.dumps(swarm))
    plan = plan_from_file(swarm_file, out / "swarm")
    model_dir = _fresh_model_dir(out / "model")
    end = _AtTheEnd(results=[])

    def before_stop(plan: SwarmPlan, summary: dict[str, Any]) -> None:
        end.results = read_results(plan.procs["data"].status_file)
        chain = plan.chain
        assert chain is not None, "the demo's swarm runs on a chain"
        run = chain.contracts.port().run_info(chain.run_id)
        end.pool_left_wei = run.balance_wei if run is not None else 0
        try:
            # What the swarm's first data node trained is the run's model and data set.
            training = load_settings(env={}, config_file=plan.out_dir / "data.toml").training
            end.export = export_run(
                chain.contracts, chain.run_id, training, live_addresses(plan), model_dir,
                EXPORT_TIMEOUT_S,
            )  # fmt: skip
        except Exception as exc:  # reported as a failed check, with its reason
            end.export_error = f"{type(exc).__name__}: {exc}"

    console.print(
        f"GWTF demo: {'a quick' if options.quick else 'a'} {swarm['run']['model']} run on a local "
        f"swarm; everything it writes goes to {out} (node logs in {out / 'swarm.log'})"
    )
    with (out / "swarm.log").open("wb") as log:
        if live:
            with LiveProgress(
                plan, console, "GWTF demo: a swarm on loopback", "exporting the model"
            ):
                summary = run_swarm(plan, log, options.timeout_s, before_stop)
        else:
            summary = run_swarm(plan, log, options.timeout_s, before_stop)
    planned = Planned(
        iterations=int(swarm["run"]["iterations"]),
        microbatches_per_iteration=int(swarm["run"]["microbatches_per_iteration"]),
        crashes=len(swarm["churn"]["crash_on"])
        + sum(1 for e in swarm["churn"]["events"] if "kill" in e),
        cheater=CHEATER if options.cheater else None,
        reward_pool_wei=int(swarm["chain"]["reward_pool_eth"] * WEI_PER_ETH),
    )
    report = demo_report(summary, end.results, end.pool_left_wei, planned, end.export)
    if end.export_error:
        report.figures["export_error"] = end.export_error
    (out / "report.json").write_text(json.dumps(report.as_json(), indent=2))
    report.figures["plots"] = [str(path) for path in write_plots(report, out)]
    return report


def _fresh_model_dir(path: Path) -> Path:
    """``path`` for the export, emptied if an earlier demo's export is there (and only then)."""
    ours = {CONFIG_FILE, WEIGHTS_FILE, PROVENANCE_FILE}
    if path.is_dir() and {p.name for p in path.iterdir()} <= ours:
        shutil.rmtree(path)
    return path


def print_report(report: DemoReport, console: Console) -> None:
    f = report.figures
    export = f.get("export")
    run = Table(title="the run", show_header=False)
    run.add_column(style="bold")
    run.add_column()
    for name, value in (
        ("trained", f"{f['iterations']} iterations, {f['microbatches']} microbatches"),
        ("loss", f"{f['loss_first']:.4f} → {f['loss_last']:.4f}"),
        ("throughput", f"{f['throughput_mb_per_s']} microbatches/s ({f['training_time_s']:.0f} s "
                       f"training, {f['wall_time_s']:.0f} s in all)"),
        ("churn", f"relays killed mid-run: {f['crashes']}, joined: {f['joins']}; "
                  f"{f['hops_resent']} hops re-sent, {f['hops_repaired']} repaired, "
                  f"{f['microbatches_restarted']} microbatches restarted"),
        ("chain", f"{f['epochs']} epochs certified, audited and claimed: "
                  f"{format_eth(int(f['paid_wei']))} ETH paid, "
                  f"{format_eth(int(f['pool_left_wei']))} ETH left in the pool"),
        ("model", f"{export['architecture']} at step {export['step']} in {export['out']}"
                  if export else f"not exported: {f.get('export_error', '')}"),
        ("plots", ", ".join(Path(p).name for p in f.get("plots", []))),
    ):  # fmt: skip
        run.add_row(name, value)
    console.print(run)
    nodes = Table(title="receipts and rewards per node")
    for column in ("node", "signed", "countersigned", "units", "reward ETH", "stake ETH"):
        nodes.add_column(column, justify="left" if column == "node" else "right")
    for n in report.nodes:
        reward, stake = format_eth(int(n["reward_wei"])), format_eth(int(n["stake_wei"]))
        nodes.add_row(
            n["node"], str(n["signed"]), str(n["countersigned"]), str(n["units"]), reward, stake
        )
    console.print(nodes)
    for s in report.slashes:
        console.print(
            f"slashed {s['node']} for {s['kind']}: {format_eth(int(s['slashed_wei']))} ETH "
            f"(the auditor's bounty {format_eth(int(s['bounty_wei']))} ETH, the rest burned)"
        )
    checks = Table(title="checked against each other and the chain")
    for column in ("", "check", "what the figures say"):
        checks.add_column(column)
    for check in report.checks:
        checks.add_row("ok" if check.ok else "FAILED", check.name, check.detail)
    console.print(checks)
