"""The demo's live display: what the swarm is doing, read from its nodes' status files twice a
second in a thread of its own (the swarm's loop is not held up by drawing)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from node.swarm.plan import SwarmPlan
from node.swarm.run import read_status

REFRESH_S = 0.5
#: Dashboard URLs shown (each node serves one).
SHOWN_DASHBOARDS = 4


class LiveProgress:
    """``with LiveProgress(plan, console):`` draws the swarm's progress until the block ends."""

    def __init__(self, plan: SwarmPlan, console: Console) -> None:
        self.plan, self.console = plan, console
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._draw, name="demo-progress", daemon=True)

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
        results: list[dict[str, Any]] = data.get("results", [])
        trained = sum(r["microbatches"] for r in results)
        seconds = sum(r["duration_s"] for r in results)
        table = Table(title="GWTF demo: a swarm on loopback", show_header=False, min_width=60)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("phase", _phase(plan, data))
        table.add_row("iteration", f"{len(results)} of {plan.run['iterations']}")
        if results:
            table.add_row("loss", f"{results[-1]['loss']:.4f} (first {results[0]['loss']:.4f})")
            table.add_row(
                "throughput", f"{trained / seconds:.2f} microbatches/s" if seconds else ""
            )
        alive = sum(1 for _, proc in procs if proc.popen.poll() is None)
        table.add_row("nodes", f"{alive} running of {len(procs)} started")
        table.add_row("crashes", ", ".join(c["node"] for c in plan.crashes) or "none yet")
        table.add_row("joins", ", ".join(j["node"] for j in plan.joins) or "none yet")
        urls = [(n, s["api_url"]) for n, s in statuses.items() if s and s.get("api_url")]
        for name, url in urls[:SHOWN_DASHBOARDS]:
            table.add_row(f"dashboard {name}", url)
        return table


def _phase(plan: SwarmPlan, data: dict[str, Any]) -> str:
    if not data:
        return "starting the chain and the nodes"
    if not data.get("finished"):
        return "training"
    if plan.last_epoch < 0:
        return "certifying, auditing and claiming the epochs on chain"
    return "exporting the model"
