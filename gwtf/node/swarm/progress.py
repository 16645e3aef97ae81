"""A local swarm's live display (``gwtf-node swarm``, the demo): what it is doing, read from its
nodes' status and results files twice a second in a thread of its own (the swarm's loop is not
held up by drawing)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from gwtf.node.status_file import read_results
from gwtf.node.swarm.labels import crash_label, join_label
from gwtf.node.swarm.plan import SwarmPlan
from gwtf.node.swarm.run import read_status

REFRESH_S = 0.5
#: Dashboard URLs shown (each node serves one).
SHOWN_DASHBOARDS = 4


class LiveProgress:
    """``with LiveProgress(plan, console, title):`` draws the swarm's progress until the block
    ends."""

    def __init__(
        self, plan: SwarmPlan, console: Console, title: str, last_phase: str = "stopping the nodes"
    ) -> None:
        self.plan, self.console, self.title, self.last_phase = plan, console, title, last_phase
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._draw, name="swarm-progress", daemon=True)

    def __enter__(self) -> LiveProgress:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _draw(self) -> None:
        with Live(self.view(), console=self.console, refresh_per_second=4, transient=True) as live:
            while not self._stop.wait(REFRESH_S):
                live.update(self.view())

    def view(self) -> Table:
        plan = self.plan
        procs = list(plan.procs.items())
        statuses = {name: read_status(proc) for name, proc in procs}
        data = statuses.get("data") or {}
        results = read_results(plan.procs["data"].status_file) if "data" in plan.procs else []
        trained = sum(r["microbatches"] for r in results)
        seconds = sum(r["duration_s"] for r in results)
        table = Table(title=self.title, show_header=False, min_width=60)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("phase", _phase(plan, data, self.last_phase))
        table.add_row("iteration", f"{len(results)} of {plan.run['iterations']}")
        if results:
            table.add_row("loss", f"{results[-1]['loss']:.4f} (first {results[0]['loss']:.4f})")
            table.add_row(
                "throughput", f"{trained / seconds:.2f} microbatches/s" if seconds else ""
            )
        alive = sum(1 for _, proc in procs if proc.popen.poll() is None)
        table.add_row("nodes", f"{alive} running of {len(procs)} started")
        table.add_row("crashes", ", ".join(map(crash_label, plan.crashes)) or "none yet")
        table.add_row("recoveries", _recoveries([s for s in statuses.values() if s], results))
        table.add_row("joins", ", ".join(map(join_label, plan.joins)) or "none yet")
        urls = [(n, s["api_url"]) for n, s in statuses.items() if s and s.get("api_url")]
        for name, url in urls[:SHOWN_DASHBOARDS]:
            table.add_row(f"dashboard {name}", url)
        return table


def _recoveries(statuses: list[dict[str, Any]], results: list[dict[str, Any]]) -> str:
    """Hops re-sent or repaired, microbatches restarted, gradients redone, in the live nodes."""
    stats = [status["stats"] for status in statuses if "stats" in status]
    hops = sum(
        s.get(key, 0)
        for s in stats
        for key in ("forward_resends", "backward_repairs", "forward_repairs", "gradient_resumes")
    )
    restarted = sum(r.get("restarts", 0) for r in results)
    redone = sum(s.get("gradients_redone", 0) for s in stats)
    lost = sum(s.get("gradients_lost", 0) for s in stats)
    return (
        f"{hops} hops recovered, {restarted} microbatches restarted, {redone} gradients redone"
        + (f", {lost} lost" if lost else "")
    )


def _phase(plan: SwarmPlan, data: dict[str, Any], last: str) -> str:
    if not data:
        return "starting the chain and the nodes"
    if not data.get("finished"):
        return "training"
    if plan.chain is not None and plan.chain.plan.receipts and plan.last_epoch < 0:
        return "certifying, auditing and claiming the epochs on chain"
    return last
