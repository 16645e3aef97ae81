"""Training through churn that loses nothing: a churned process swarm against the whole model.

One swarm file (3 stages x 3 relays, ``--iterations`` iterations of 4 microbatches, one data
node, no chain) is run twice on this machine: with churn (relays SIGKILLed mid-forward,
mid-backward holding the gradients of the microbatches before, and after acknowledging a
backward; a timed kill, that relay restarted, and a joiner taking the bottleneck stage) and
without. Each run's loss per iteration is compared with the whole model trained alone on the
same microbatch ids. Printed: the worst relative loss difference of each (goal < 1e-4), the
gradients that died with a replica and were redone, as a share of all the stages' microbatch
work, and the churned run's throughput against the calm one's.

Usage: python bench/churn_exactness.py [--iterations 16] [--model gpt-tiny] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from gwtf.node.swarm.exactness import against_whole_model
from gwtf.node.swarm.plan import plan_from_file
from gwtf.node.swarm.run import run_swarm

SWARM = """
[run]
model = "{model}"
stages = 3
iterations = {iterations}
microbatches_per_iteration = 4
seed = 7
[swarm]
relays_per_stage = 3
capacity = 2
hop_ms = {hop_ms}
[chain]
enabled = false
"""

CHURN = """
[churn]
crash_on = [
  {stage = 1, direction = "forward", iteration = 2},
  {stage = 2, direction = "backward", iteration = 3},
  {stage = 3, direction = "backward", iteration = 4, when = "after_ack"},
]
events = [
  {t = 3.0, kill = "relay-2-1"},
  {t = 5.0, join = "auto"},
  {t = 7.0, restart = "relay-2-1"},
]
"""


def run(out: Path, text: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "swarm.toml").write_text(text)
    plan = plan_from_file(out / "swarm.toml", out / "run")
    with (out / "swarm.log").open("wb") as log:
        summary = run_swarm(plan, log, timeout_s=900)
    return summary | against_whole_model(out / "run", summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--hop-ms", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="gwtf-churn-exactness-"))
    swarm = SWARM.format(model=args.model, iterations=args.iterations, hop_ms=args.hop_ms)
    calm = run(base / "calm", swarm)
    churned = run(base / "churn", swarm + CHURN)
    stages = 3
    print(f"\n{args.model}, 3 stages x 3 relays, {args.iterations} iterations x 4 microbatches")
    print(
        "| run | crashes | joins | microbatches | gradients redone | redone / all stage work "
        "| lost | worst relative loss difference vs whole model | throughput (mb/s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, summary in (("calm", calm), ("churn", churned)):
        work = summary["work"]
        share = work["gradients_redone"] / max(1, work["microbatches_completed"] * stages)
        print(
            f"| {name} | {len(summary['crashes'])} | {len(summary['joins'])} "
            f"| {work['microbatches_completed']} of {work['microbatches_asked']} "
            f"| {work['gradients_redone']} | {share:.2%} | {work['gradients_lost']} "
            f"| {summary['worst_relative_difference']:.2e} | {summary['throughput_mb_per_s']} |"
        )
    ratio = churned["throughput_mb_per_s"] / calm["throughput_mb_per_s"]
    print(
        f"\nthroughput, churn / calm: {ratio:.2f}; replicas out of step: "
        f"{churned['replicas_out_of_step'] or 'none'}; runs in {base}"
    )


if __name__ == "__main__":
    main()
