"""The swarm across an emulated internet: relays at home behind NAT routers, against the same
swarm with every relay public, in one run.

Each row is ``gwtf-node swarm``'s runner (``gwtf.node.swarm.run``, no chain) on a fresh internet
test bed (``tests/internet/testbed.py``: network namespaces, iptables NAT routers, 198.18.0.0/15
addresses): 1 data node + 2 stages x 2 relays, gpt-tiny, each node in its own namespace,
listening on every interface with ``p2p.reachable = auto``, so a home relay finds out by itself
that nobody can dial it and runs outbound-only through the data node's relay. Rows: relays at
home 0/4, 1/4 behind a port-restricted cone NAT, 1/4 behind a symmetric NAT, 2/4 (one per
stage), 4/4 (both stages at home: cone and symmetric in each), 1/4 (cone) whose router
passes nothing for 3 s once the first iteration is done, and 4/4 behind cone NATs that drop
unsolicited dials twice: with ``p2p.hole_punch = false`` (every link between the stages a
circuit through the data node) and with hole punching (``gwtf/node/p2p/holepunch.py``).

Columns: training time (the sum of the data node's iterations; the first one also waits for the
relays to join and find routes) and throughput as a ratio to the all-public row, over all
iterations and over those after the first; the hops each home relay and each public relay
computed (acknowledged), on average; the largest |loss difference| of any iteration against
the all-public row; microbatches the data node restarted and gradients a stage counted twice
(either makes the losses drift from the all-public row's); the home pairs that ended on a
punched direct connection, and the punches that failed.

Delay: this machine's kernel has no ``sch_netem``, so the kernel adds none; the nodes emulate the
regions' latency and bandwidth themselves (``p2p.topology_file``,
``gwtf/node/p2p/link_emulation.py``, ``gwtf/coordinator_free/sim/data/regions-10.json``): the data
node in frankfurt, stage 1's relays in oregon, stage 2's in tokyo. ``--no-delay`` turns that off.

Needs root (namespaces, iptables), iproute2, iptables and conntrack.

A row that has not finished within ``--row-timeout`` is stopped and shown with the iterations it
finished (its ratios, over those only, are upper bounds).

Usage: python bench/internet.py [--iterations 12] [--quick] [--no-delay] [--json FILE]
       [--rows 0,4] [--row-timeout 600]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gwtf.errors import GwtfError
from gwtf.node.status_file import read_results
from gwtf.node.swarm.plan import NodeHost, SwarmPlan, plan_from_file
from gwtf.node.swarm.run import read_status, run_swarm
from tests.internet.testbed import Bed, HomeSpec, build_bed, missing_requirements

REGIONS_FILE = (
    Path(__file__).resolve().parents[1] / "gwtf/coordinator_free/sim/data/regions-10.json"
)
DATA_REGION = "frankfurt"
STAGE_REGIONS = {1: "oregon", 2: "tokyo"}
RELAYS = [f"relay-{stage}-{replica}" for stage in (1, 2) for replica in (0, 1)]
PORT = 4001
CUT_S = 3.0
OUT = Path(__file__).resolve().parent / "out" / "internet"


@dataclass(frozen=True)
class Scenario:
    label: str
    #: Relay name -> (NAT kind, what its router does with an unsolicited dial).
    homes: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: A home relay whose router passes nothing for CUT_S once the first iteration is done.
    cut: str | None = None
    #: Homes that meet through a relay punch a direct connection (``p2p.hole_punch``).
    punch: bool = True


SCENARIOS = [
    Scenario("0/4 at home (all public)"),
    Scenario("1/4 (cone)", {"relay-1-0": ("cone", "drop")}),
    Scenario("1/4 (symmetric)", {"relay-1-0": ("symmetric", "rst")}),
    Scenario(
        "2/4 (one per stage)",
        {"relay-1-0": ("cone", "drop"), "relay-2-0": ("symmetric", "drop")},
    ),
    Scenario(
        "4/4 (both stages at home)",
        {
            "relay-1-0": ("cone", "drop"),
            "relay-1-1": ("symmetric", "rst"),
            "relay-2-0": ("cone", "rst"),
            "relay-2-1": ("symmetric", "drop"),
        },
    ),
    Scenario("1/4 (cone), 3 s cut", {"relay-1-0": ("cone", "drop")}, cut="relay-1-0"),
    Scenario("4/4 (cone NATs), relay only", dict.fromkeys(RELAYS, ("cone", "drop")), punch=False),
    Scenario("4/4 (cone NATs), hole punching", dict.fromkeys(RELAYS, ("cone", "drop"))),
]


def region_of(name: str) -> str:
    return DATA_REGION if name == "data" else STAGE_REGIONS[int(name.split("-")[1])]


def swarm_file(iterations: int, delay: bool) -> str:
    topology = f'topology = "{REGIONS_FILE}"\nregions = ["{DATA_REGION}"]\n' if delay else ""
    return (
        f"[run]\niterations = {iterations}\nmicrobatches_per_iteration = 4\n"
        f"[swarm]\nrelays_per_stage = 2\ncapacity = 2\n{topology}"
        "[chain]\nenabled = false\n"
    )


def place(bed: Bed, plan: SwarmPlan, punch: bool) -> None:
    """Every node in its own namespace of the bed, listening on all its interfaces."""
    # The runner passes no GWTF_* variable of its own environment on: set it in the command.
    setting = () if punch else ("env", "GWTF_P2P_HOLE_PUNCH=false")
    for name, host in bed.hosts.items():
        prefix = ("ip", "netns", "exec", host.namespace, *setting)
        plan.hosts[name] = NodeHost(prefix, (f"/ip4/0.0.0.0/tcp/{PORT}",), region_of(name))


def cut_after_first_iteration(bed: Bed, plan: SwarmPlan, home: str, stop: threading.Event) -> None:
    while not stop.is_set():
        proc = plan.procs.get("data")
        status = read_status(proc) if proc is not None else None
        if status is not None and int(status.get("iterations_done", 0)) >= 1:
            bed.cut_link(home)
            time.sleep(CUT_S)
            bed.restore_link(home)
            return
        time.sleep(0.05)


def run_scenario(
    scenario: Scenario, iterations: int, delay: bool, out: Path, timeout_s: float
) -> dict[str, Any]:
    folder = out / f"row-{SCENARIOS.index(scenario)}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "swarm.toml").write_text(swarm_file(iterations, delay))
    public = {name: region_of(name) for name in ["data", *RELAYS] if name not in scenario.homes}
    homes = [
        HomeSpec(name, region_of(name), nat=nat, inbound=inbound)  # type: ignore[arg-type]
        for name, (nat, inbound) in scenario.homes.items()
    ]
    with build_bed(public, homes) as bed, open(folder / "swarm.log", "wb") as log:
        plan = plan_from_file(folder / "swarm.toml", folder)
        place(bed, plan, scenario.punch)
        stop = threading.Event()
        cutter = None
        if scenario.cut is not None:
            cutter = threading.Thread(
                target=cut_after_first_iteration, args=(bed, plan, scenario.cut, stop)
            )
            cutter.start()
        finished = True
        try:
            run_swarm(plan, log, timeout_s=timeout_s)
        except GwtfError as exc:  # a row that does not finish is a result too
            print(f"{scenario.label}: {exc}", flush=True)
            finished = False
        finally:
            stop.set()
            if cutter is not None:
                cutter.join()
    # From the nodes' own files, which a row that did not finish has too.
    results = read_results(plan.procs["data"].status_file)
    statuses = {name: read_status(proc) or {} for name, proc in plan.procs.items()}
    hops = {name: int(statuses[name].get("hops_recorded") or 0) for name in RELAYS}
    at_home = [hops[name] for name in hops if name in scenario.homes]
    public_hops = [hops[name] for name in hops if name not in scenario.homes]
    durations = [r["duration_s"] for r in results]
    return {
        "scenario": scenario.label,
        "finished": finished,
        "iterations_done": len(results),
        "training_time_s": round(sum(durations), 3),
        # The first iteration also waits for the relays to join and find their routes.
        "first_iteration_s": round(durations[0], 3) if durations else None,
        "later_iterations_s": round(sum(durations[1:]), 3),
        "losses": [r["loss"] for r in results],
        "hops": hops,
        "home_hops_per_relay": sum(at_home) / len(at_home) if at_home else None,
        "public_hops_per_relay": sum(public_hops) / len(public_hops) if public_hops else None,
        "restarted_microbatches": sum(r["restarts"] for r in results),
        # Home pairs a punch connected directly (each pair counted by both ends).
        "punched_pairs": sum(len(s.get("punched_peers") or []) for s in statuses.values()) // 2,
        "punch_failures": sum(int(s.get("punch_failures") or 0) for s in statuses.values()),
        "gradients_duplicated": sum(
            int((s.get("stats") or {}).get("gradients_duplicated", 0)) for s in statuses.values()
        ),
        "folder": str(folder),
    }


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput (iterations per second of training) against the all-public row's; a row that
    did not finish counts only the iterations it finished, so its ratio is an upper bound."""

    def ratio(base_s: float, base_n: int, row_s: float, row_n: int) -> float | None:
        return round((row_n / row_s) / (base_n / base_s), 3) if row_n and row_s else None

    base = rows[0]
    for row in rows:
        n, base_n = row["iterations_done"], base["iterations_done"]
        row["ratio"] = ratio(base["training_time_s"], base_n, row["training_time_s"], n)
        row["later_ratio"] = ratio(
            base["later_iterations_s"], base_n - 1, row["later_iterations_s"], n - 1
        )
        deltas = [abs(a - b) for a, b in zip(row["losses"], base["losses"], strict=False)]
        row["max_loss_delta"] = max(deltas, default=None)
    return rows


def print_table(rows: list[dict[str, Any]], machine: str, delay: bool, iterations: int) -> None:
    def number(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    delays = "emulated in the nodes (regions-10)" if delay else "none"
    print(f"\n{machine}; region delays: {delays}")
    print("| relays at home | training s (1st iteration) | vs all public | after the 1st: "
          "vs all public | hops per home / public relay | max abs Δ loss vs all public | "
          "restarted microbatches, duplicated gradients | "
          "punched pairs (failed punches) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        time_s = f"{row['training_time_s']:.1f} ({number(row['first_iteration_s'], '.1f')})"
        if not row["finished"]:  # its ratios count only the iterations it finished
            time_s += f", {row['iterations_done']} of {iterations} iterations, then stopped"
        bound = "" if row["finished"] else "≤ "
        print(
            f"| {row['scenario']} | {time_s} | {bound}{number(row['ratio'], '.2f')} | "
            f"{bound}{number(row['later_ratio'], '.2f')} | "
            f"{number(row['home_hops_per_relay'], '.0f')} / "
            f"{number(row['public_hops_per_relay'], '.0f')} | "
            f"{number(row['max_loss_delta'], '.1e')} | {row['restarted_microbatches']}, "
            f"{row['gradients_duplicated']} | {row['punched_pairs']} ({row['punch_failures']}) |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="4 iterations per row")
    parser.add_argument("--no-delay", action="store_true", help="no emulated region latency")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument(
        "--rows", default="", help="only these rows, by number (0 first, always run): e.g. 0,4"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="each row's swarm files and log")
    parser.add_argument(
        "--row-timeout", type=float, default=0.0, help="seconds a row may run (600, --quick 300)"
    )
    args = parser.parse_args()
    problem = missing_requirements()
    if problem is not None:
        print(f"bench/internet.py: {problem}; run it as root", file=sys.stderr)
        return 2
    iterations = 4 if args.quick else args.iterations
    delay = not args.no_delay
    timeout_s = args.row_timeout or (300.0 if args.quick else 600.0)
    picked = [int(n) for n in args.rows.split(",") if n] or range(len(SCENARIOS))
    chosen = sorted({0, *picked})
    rows = []
    for scenario in [SCENARIOS[n] for n in chosen]:
        started = time.monotonic()
        row = run_scenario(scenario, iterations, delay, args.out, timeout_s)
        print(f"{scenario.label}: {row['training_time_s']:.1f} s training, "
              f"{time.monotonic() - started:.0f} s in all", flush=True)  # fmt: skip
        rows.append(row)
    rows = with_ratios(rows)
    machine = f"gpt-tiny, 1 data node + 2 stages x 2 relays, {iterations} iterations x 4 " \
        "microbatches; a shared 2-core CPU machine"  # fmt: skip
    print_table(rows, machine, delay, iterations)
    if args.json:
        facts = {"machine": machine, "delay": delay, "rows": rows}
        args.json.write_text(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
