"""`gwtf-node swarm` through the real entry point: it says how the run went in a few lines (the
whole summary goes to its file), and with ``--keep-chain`` its devnet serves the other commands
after the run until Ctrl-C, which leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.node.test_demo import interrupt

SWARM_FILE = """
[run]
iterations = 3
microbatches_per_iteration = 2
[swarm]
relays_per_stage = 1
capacity = 1
[chain]
receipts = false
"""


def chain_id(rpc_url: str) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})
    request = urllib.request.Request(rpc_url, body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return int(json.loads(answer.read())["result"], 16)


@pytest.mark.slow  # ~25 s: a swarm of OS processes and its chain
def test_the_swarm_command_reports_in_a_few_lines_and_keeps_its_chain_until_ctrl_c(
    tmp_path: Path,
) -> None:
    swarm_file, out = tmp_path / "swarm.toml", tmp_path / "out"
    swarm_file.write_text(SWARM_FILE)
    command = [sys.executable, "-m", "gwtf.node.cli", "swarm", "--swarm-file", str(swarm_file)]
    swarm = subprocess.Popen(
        [*command, "--out", str(out), "--keep-chain"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert swarm.stdout is not None
        printed = ""
        deadline = time.monotonic() + 240
        while "Ctrl-C stops it" not in printed:
            line = swarm.stdout.readline()
            assert line or swarm.poll() is None, swarm.stderr.read() if swarm.stderr else ""
            assert time.monotonic() < deadline, printed
            printed += line
        assert "the swarm's run" in printed and "3 of 6 asked" not in printed
        assert "6 of 6 asked completed" in printed, printed
        assert f"summary: {out / 'summary.json'}" in printed.replace("\n", "")
        assert printed.count("\n") < 40, "a few lines, not the summary's JSON"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["iterations"] == 3 and summary["work"]["gradients_lost"] == 0
        # The run is over, the nodes are gone; the chain serves on.
        match = re.search(r"the chain stays up at (http://127\.0\.0\.1:\d+) \(run (\d+)\)", printed)
        assert match is not None, printed
        rpc_url, run_id = match.group(1), int(match.group(2))
        assert chain_id(rpc_url) == 31337
        listed = subprocess.run(
            [sys.executable, "-m", "gwtf.node.cli", "--devnet-file", str(out / "devnet.json"),
             "runs", "list", "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert run_id in [run["run_id"] for run in json.loads(listed.stdout)]
        assert interrupt(swarm, timeout_s=30) == 0
        assert not (out / "devnet.json").exists(), "the file of a chain that is gone"
    finally:
        if swarm.poll() is None:
            os.killpg(swarm.pid, signal.SIGKILL)
        swarm.wait()
