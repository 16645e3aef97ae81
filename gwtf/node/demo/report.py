"""What the demo shows at its end: the swarm's summary put in a person's terms, and each of its
figures checked against the others and the chain's.

Pure: ``demo_report`` takes the swarm's summary (``gwtf.node.swarm.run.summarise``), the data node's
results per iteration, the run's pool as the chain has it at the end, and what was planned;
it returns the figures and the checks. Nothing here is computed from what the demo meant to
happen except the checks' expectations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gwtf.node.chain.adapter import format_eth


@dataclass(frozen=True)
class Check:
    """One claim the demo makes about its run, and whether the figures bear it out."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Planned:
    """What the demo set up: the checks' expectations."""

    iterations: int
    microbatches_per_iteration: int
    crashes: int  # SIGKILLs scheduled or injected mid-hop
    cheater: str | None
    reward_pool_wei: int


@dataclass
class DemoReport:
    figures: dict[str, Any]
    nodes: list[dict[str, Any]]
    slashes: list[dict[str, Any]]
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "figures": self.figures,
            "nodes": self.nodes,
            "slashes": self.slashes,
            "checks": [check.__dict__ for check in self.checks],
        }


def demo_report(
    summary: dict[str, Any],
    results: list[dict[str, Any]],
    pool_left_wei: int,
    planned: Planned,
    export: dict[str, Any] | None,
) -> DemoReport:
    chain = summary["chain"]
    audit = chain.get("audit") or {}
    recovered = summary["recovered_hops"]
    losses = summary["loss_per_iteration"]
    figures = {
        "iterations": summary["iterations"],
        "microbatches": summary["microbatches"],
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "loss_per_iteration": losses,
        "throughput_per_iteration": [
            round(r["microbatches"] / r["duration_s"], 3) if r["duration_s"] else 0.0
            for r in sorted(results, key=lambda r: r["iteration"])
        ],
        "throughput_mb_per_s": summary["throughput_mb_per_s"],
        "training_time_s": summary["training_time_s"],
        "wall_time_s": summary["wall_time_s"],
        "crashes": len(summary["crashes"]),
        "joins": len(summary["joins"]),
        "hops_resent": recovered["forward_resends"],
        "hops_repaired": recovered["forward_repairs"] + recovered["backward_repairs"],
        "gradients_resumed": recovered["gradient_resumes"],
        "microbatches_restarted": recovered["restarted_microbatches"],
        "epochs": len(chain.get("epochs", [])),
        "paid_wei": str(sum(int(e["claimed_wei"]) for e in chain.get("epochs", []))),
        "pool_left_wei": str(pool_left_wei),
        "export": export,
    }
    nodes = [
        {
            "node": name,
            "signed": (entry["receipts"] or {}).get("signed") or 0,
            "countersigned": (entry["receipts"] or {}).get("countersigned") or 0,
            "units": entry["units"],
            "reward_wei": entry["reward_wei"],
            "stake_wei": entry["stake_wei"],
            "api_claimed_wei": (entry.get("api") or {}).get("claimed_wei"),
        }
        for name, entry in sorted(chain.get("earnings", {}).items())
    ]
    slashes = [
        {
            "node": c["accused"],
            "kind": c["kind"],
            "slashed_wei": c["slashed_wei"],
            "bounty_wei": c["bounty_wei"],
        }
        for c in audit.get("challenges", [])
        if c["outcome"] == "slashed"
    ]
    report = DemoReport(figures, nodes, slashes)
    report.checks = _checks(summary, figures, nodes, slashes, planned)
    return report


def _checks(
    summary: dict[str, Any],
    figures: dict[str, Any],
    nodes: list[dict[str, Any]],
    slashes: list[dict[str, Any]],
    planned: Planned,
) -> list[Check]:
    epochs = summary["chain"].get("epochs", [])
    asked = planned.iterations * planned.microbatches_per_iteration
    budgets = sum(int(e["budget_wei"]) for e in epochs)
    # Reserved for certified work: paid, claimable or burned (voided certificates' included);
    # nothing reserved returns to the pool.
    spent = budgets + sum(int(e["voided_wei"]) for e in epochs)
    paid = int(figures["paid_wei"])
    rewards = sum(int(n["reward_wei"]) for n in nodes)
    # A node is slashed once; a proof of its fault in another epoch takes no second stake.
    slashed = sorted({s["node"] for s in slashes if int(s["slashed_wei"]) > 0})
    expected_slashed = [planned.cheater] if planned.cheater else []
    losses = summary["loss_per_iteration"]
    api_wrong = [
        n["node"] for n in nodes
        if n["api_claimed_wei"] is not None and n["api_claimed_wei"] != n["reward_wei"]
    ]  # fmt: skip
    return [
        Check(
            "no microbatch lost",
            summary["iterations"] == planned.iterations and summary["microbatches"] == asked,
            f"{summary['microbatches']} of {asked} microbatches trained in "
            f"{summary['iterations']} iterations",
        ),
        Check(
            "every crash survived",
            figures["crashes"] >= planned.crashes,
            f"relays killed: {figures['crashes']} ({planned.crashes} planned); "
            f"{figures['hops_resent']} hops re-sent, {figures['hops_repaired']} repaired, "
            f"{figures['microbatches_restarted']} microbatches restarted",
        ),
        Check(
            "replicas in step",
            not summary.get("replicas_out_of_step") and not summary["stages_not_stepped"],
            "every live replica ended at its stage's step and weights"
            if not summary.get("replicas_out_of_step")
            else f"out of step: {summary['replicas_out_of_step']}",
        ),
        Check(
            "the budget adds up to the wei",
            all(e["adds_up"] for e in epochs)
            and spent + pool_left(figures) == planned.reward_pool_wei,
            f"{format_eth(spent)} ETH of {len(epochs)} epochs' budgets (paid or still "
            f"claimable) + {format_eth(pool_left(figures))} ETH left in the pool = "
            f"{format_eth(planned.reward_pool_wei)} ETH funded",
        ),
        Check(
            "rewards are what the chain paid",
            rewards == paid and not api_wrong,
            f"{format_eth(rewards)} ETH to the nodes, {format_eth(paid)} ETH claimed on chain"
            + (f"; the API of {api_wrong} says otherwise" if api_wrong else "; each API agrees"),
        ),
        Check(
            "the cheater and nobody else slashed",
            slashed == expected_slashed,
            f"slashed: {', '.join(slashed) or 'nobody'}",
        ),
        Check(
            "loss fell",
            len(losses) > 1 and losses[-1] < losses[0],
            f"{losses[0]:.4f} at the first iteration, {losses[-1]:.4f} at the last"
            if losses
            else "no loss recorded",
        ),
        Check(
            "the model exported",
            bool(figures["export"]),
            f"{figures['export']['architecture']} at step {figures['export']['step']} in "
            f"{figures['export']['out']}"
            if figures["export"]
            else "not exported",
        ),
    ]


def pool_left(figures: dict[str, Any]) -> int:
    return int(figures["pool_left_wei"])
