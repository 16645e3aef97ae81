"""`gwtf-node demo --quick` through the real entry point: a swarm on anvil trains through a
crash and a join, is paid, audited, its cheater slashed, its model exported; every figure of
its report agrees with the others and with what the nodes and the chain left behind. Ctrl-C
leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from gwtf.node.demo.plan import CHEATER
from tests.node.test_cli import run_cli


@pytest.mark.slow  # ~80 s of OS processes, a chain and an audit: the whole story end to end
def test_the_quick_demo_trains_pays_audits_and_exports_and_its_figures_agree(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(capsys, "demo", "--quick", "--out", str(tmp_path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert len(report["checks"]) == 8
    # The report's figures, against what the swarm's processes wrote themselves.
    summary = json.loads((tmp_path / "swarm" / "summary.json").read_text())
    figures = report["figures"]
    assert figures["microbatches"] == summary["microbatches"] == 16 * 4
    assert figures["crashes"] >= 1 and figures["joins"] >= 1
    chain = summary["chain"]
    paid = sum(int(e["claimed_wei"]) for e in chain["epochs"])
    assert paid > 0 and sum(int(n["reward_wei"]) for n in report["nodes"]) == paid
    assert chain["earnings"][CHEATER]["stake_wei"] == "0"
    # The cheater's stake is taken once; a proof of its fault in another epoch takes nothing more.
    assert {s["node"] for s in report["slashes"] if int(s["slashed_wei"]) > 0} == {CHEATER}
    assert {s["node"] for s in report["slashes"]} == {CHEATER}
    losses = figures["loss_per_iteration"]
    assert len(losses) == 16 and losses[-1] < losses[0]
    for plot in ("loss.png", "throughput.png", "earnings.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The sponsor's model: transformers loads it, at the run's last step, and it predicts.
    provenance = json.loads((tmp_path / "model" / "gwtf-export.json").read_text())
    assert provenance["step"] == 16 and all(p["node"] != CHEATER for p in provenance["parts"])
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokens = torch.tensor([list(b"To be, or not to be, that is the")])
    with torch.no_grad():
        loss = model(tokens, labels=tokens).loss.item()
    assert loss < losses[0], "the exported model is the trained one, not its initial weights"


@pytest.mark.slow  # ~1 min
def test_ctrl_c_stops_the_demo_and_every_process_it_started(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "gwtf.node.cli", "demo", "--quick", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "swarm" / "relay-1-0.status.json").exists():
            assert demo.poll() is None, demo.stderr.read() if demo.stderr else ""
            assert time.monotonic() < deadline, "the demo's relays never came up"
            time.sleep(0.5)
        started = session_processes(demo.pid)
        assert len(started) > 5, "the chain and the nodes run in the demo's session"
        assert interrupt(demo, timeout_s=60) == 130
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()


def interrupt(command: subprocess.Popen[Any], timeout_s: float) -> int:
    """Ctrl-C to ``command``'s session, as a terminal sends it; its exit code, once no process
    of its session is left."""
    os.killpg(command.pid, signal.SIGINT)
    code = command.wait(timeout=timeout_s)
    deadline = time.monotonic() + 15
    while session_processes(command.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(command.pid) == [], "a process outlived the command"
    return code


def session_processes(session: int) -> list[int]:
    """The live processes of session ``session`` (zombies aside)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, sid = fields[0], int(fields[3])
        if sid == session and state != "Z":
            found.append(int(entry.name))
    return found
