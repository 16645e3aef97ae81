"""What the swarm's supervisor reads of its processes: who died how, and a data node's results
file, whatever a kill left of it."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from gwtf.node.logs import LibraryDigest
from gwtf.node.status_file import ResultsLog, read_results
from gwtf.node.swarm.plan import Proc, plan_from_file
from gwtf.node.swarm.run import _record_injected_crashes


def sleeper(tmp_path: Path, name: str) -> Proc:
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return Proc(name, popen, tmp_path / f"{name}.status.json")


def test_a_kill_by_hand_is_told_from_fault_injection_and_from_the_schedule(
    tmp_path: Path,
) -> None:
    (tmp_path / "swarm.toml").write_text("[chain]\nenabled = false\n")
    plan = plan_from_file(tmp_path / "swarm.toml", tmp_path / "out")
    procs = {name: sleeper(tmp_path, name) for name in ("relay-1-0", "relay-1-1", "relay-2-0")}
    plan.procs.update(procs)
    try:
        # Fault injection's victim names itself in the lock it took; nobody names the other.
        (plan.out_dir / "crash-0.lock").write_text("relay-1-0")
        for name in ("relay-1-0", "relay-1-1"):
            os.kill(procs[name].popen.pid, signal.SIGKILL)
            procs[name].popen.wait()
        _record_injected_crashes(plan)
        _record_injected_crashes(plan)  # each death recorded once
        assert plan.crashes == [
            {"t": None, "node": "relay-1-0", "injected": True},
            {"t": None, "node": "relay-1-1", "by_hand": True},
        ]
    finally:
        for proc in procs.values():
            proc.popen.kill()
            proc.popen.wait()


class Role:
    def __init__(self) -> None:
        self.results: list[object] = []


def test_results_survive_a_line_torn_by_a_kill_and_a_restart_appends(tmp_path: Path) -> None:
    from gwtf.node.runtime.roles.data import IterationResult

    status_file = tmp_path / "data.status.json"
    role = Role()
    log = ResultsLog(tmp_path / "data.results.jsonl")
    role.results.append(IterationResult(0, 5.5, 4, 0, 0.1, 2, 0.01, (), 0, 0, 0, 0))
    log.append(role.results)
    log.append(role.results)  # nothing new: nothing written
    with log.path.open("a") as out:
        out.write('{"iteration": 1, "lo')  # the process was killed mid-line
    restarted, again = Role(), ResultsLog(log.path)
    restarted.results.append(IterationResult(2, 5.4, 4, 0, 0.1, 2, 0.01, (), 0, 0, 0, 0))
    again.append(restarted.results)
    assert [(r["iteration"], r["loss"]) for r in read_results(status_file)] == [(0, 5.5), (2, 5.4)]
    assert json.loads(log.path.read_text().splitlines()[0])["microbatches"] == 4
    assert read_results(tmp_path / "gone.status.json") == []


def record(name: str, message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, (), None)


def test_the_networking_library_s_noise_is_one_line_per_period() -> None:
    now = [0.0]
    digest = LibraryDigest(period_s=30.0, clock=lambda: now[0])
    assert digest.filter(record("gwtf.node.runtime.relay", "a node's own warning"))
    peer = "16Uiu2HAmLrQ9X7xyth2fMVcV7tFRcty24Mz5WtLvysQ8gVpszbp3"
    for port in range(5):
        block = f"Failed to open stream to {peer} on 127.0.0.1:{4000 + port}\n  Protocols: [...]"
        assert not digest.filter(record("libp2p.kad_dht.peer_routing", block))
    assert not digest.filter(record("libp2p.transport.tcp", "Failed to open TCP stream", 40))
    now[0] = 31.0
    summary = record("libp2p.kad_dht.kad_dht", "Failed to read DHT message from stream: ")
    assert digest.filter(summary)
    assert summary.levelno == logging.WARNING and "\n" not in summary.getMessage()
    assert summary.getMessage() == (
        "7 warnings from the networking library in 31 s, most often (5x): "
        "Failed to open stream to # on #.#.#.#:#"
    )
    assert not digest.filter(record("libp2p.host", "again"))  # a new period begins
    assert digest.filter(record("libp2p.host", "the end of everything", logging.CRITICAL))
