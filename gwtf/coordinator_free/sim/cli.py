"""``gwtf-sim``: run a scenario under one algorithm, or write the paper-like grid of scenarios.

    gwtf-sim SCENARIO.json --algorithm gwtf|gwtf-oracles|swarm|dtfm|central|round_robin
        [--json] [--max-sim-time-s S]
    gwtf-sim generate OUTDIR [--seeds N] [--iterations N]

Exit codes: 0 success; a ``GwtfError``'s ``exit_code`` (2 for a bad scenario or flag, 7 for an
algorithm not built yet) with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from gwtf.coordinator_free.sim.algorithms import ALGORITHMS, make_policy
from gwtf.coordinator_free.sim.engine import EngineConfig, run_scenario
from gwtf.coordinator_free.sim.generator import GridSize, write_grid
from gwtf.coordinator_free.sim.scenario import load_scenario
from gwtf.errors import ConfigError, GwtfError


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so errors share one format."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message}; see gwtf-sim --help")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "generate":
            return _generate(args[1:])
        return _run(args)
    except GwtfError as err:
        print(f"gwtf-sim: {err}", file=sys.stderr)
        return err.exit_code


def _run(argv: list[str]) -> int:
    parser = _Parser(prog="gwtf-sim", description="Simulate a scenario under one algorithm.")
    parser.add_argument("scenario", help="scenario JSON file (see gwtf/coordinator_free/README.md)")
    parser.add_argument("--algorithm", required=True, choices=ALGORITHMS)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--max-sim-time-s", type=float, default=EngineConfig.max_sim_time_s)
    args = parser.parse_args(argv)
    if not args.max_sim_time_s > 0:
        raise ConfigError("--max-sim-time-s must be > 0")
    scenario = load_scenario(args.scenario)
    policy = make_policy(args.algorithm)
    started = time.perf_counter()
    metrics = run_scenario(scenario, policy, EngineConfig(max_sim_time_s=args.max_sim_time_s))
    summary = metrics.to_json()
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(summary))
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
    return 0


def _generate(argv: list[str]) -> int:
    parser = _Parser(prog="gwtf-sim generate", description="Write the paper-like scenario grid.")
    parser.add_argument("outdir")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=GridSize.iterations)
    args = parser.parse_args(argv)
    if not 1 <= args.seeds <= 1000 or not 1 <= args.iterations <= 1_000_000:
        raise ConfigError("--seeds must be in [1, 1000] and --iterations in [1, 1000000]")
    try:
        paths = write_grid(args.outdir, args.seeds, GridSize(iterations=args.iterations))
    except OSError as exc:
        raise ConfigError(f"cannot write to {args.outdir}: {exc.strerror}; pick another") from exc
    print(f"wrote {len(paths)} scenarios to {args.outdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
