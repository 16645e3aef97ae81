"""The demo's plots, as PNG files in its output folder: loss and throughput per iteration, and
what each node earned."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no screen needed

import matplotlib.pyplot as plt

from gwtf.node.demo.report import DemoReport

WEI_PER_ETH = 10**18


def write_plots(report: DemoReport, out: Path) -> list[Path]:
    figures = report.figures
    written = [
        _line(out / "loss.png", figures["loss_per_iteration"], "loss (cross-entropy)",
              "training loss per iteration"),
        _line(out / "throughput.png", figures["throughput_per_iteration"], "microbatches / s",
              "throughput per iteration"),
    ]  # fmt: skip
    paid = [n for n in report.nodes if int(n["reward_wei"]) or n["units"]]
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.bar([n["node"] for n in paid], [int(n["reward_wei"]) / WEI_PER_ETH for n in paid])
    axes.set_ylabel("ETH claimed")
    axes.set_title("earnings per node")
    axes.tick_params(axis="x", rotation=30)
    figure.tight_layout()
    figure.savefig(out / "earnings.png", dpi=110)
    plt.close(figure)
    return [*written, out / "earnings.png"]


def _line(path: Path, values: list[float], label: str, title: str) -> Path:
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.plot(range(1, len(values) + 1), values, marker="o", markersize=3)
    axes.set_xlabel("iteration")
    axes.set_ylabel(label)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
