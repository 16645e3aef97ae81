"""The README's "Run a node" path, run as a stranger would: its commands exactly as written, in
the order written, as processes of the installed ``gwtf-node``, against a sponsor's run on the
devnet. Only what the guide leaves to its reader is filled in: the network's URL and file, the
run's id, the data node's address, the password (as ``GWTF_WALLET_PASSWORD``), test ETH for the
new wallet, and chain time moved on. The volunteer's node starts before the data node, is
stopped with work unclaimed, says so in ``status`` and again when restarted, and is paid. That
run is `slow`; the default run checks that the guide's commands are still the ones it runs, and
tests/node/test_start.py runs the same story through ``gwtf-node start`` processes."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from web3 import Web3

from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import advance_time_to
from gwtf.node.chain.epochs import EpochLedger
from tests.node.conftest import RunningDevnet
from tests.node.test_cli import run_cli
from tests.node.test_cli_volunteer import PASSWORD
from tests.node.test_start import (
    NodeProcess,
    free_port,
    settings_file,
    sponsored_run,
    start,
    stop_all,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
#: The installed command, as the README's reader runs it.
GWTF_NODE = str(Path(sys.executable).with_name("gwtf-node"))


def guide() -> list[str]:
    """The commands of the README's "Run a node" section, in order, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Run a node\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command:
                commands.append(command)
    return commands


def test_the_guide_is_what_this_test_runs() -> None:
    steps = [c.split()[1] for c in guide() if c.startswith("gwtf-node")]
    assert steps == ["wallet", "register", "runs", "join", "start", "status", "earnings", "claim"]


@pytest.mark.slow  # ~2 minutes on two cores: each step a process at the wallet's full scrypt cost
def test_a_stranger_follows_the_readme_registers_starts_is_paid(
    capsys: pytest.CaptureFixture[str],
    devnet: RunningDevnet,
    devnet_file: Path,
    rpc_w3: Web3,
    rpc_contracts: Contracts,
    tmp_path: Path,
) -> None:
    chain = ("--devnet-file", str(devnet_file))
    # The sponsor's side, which the guide takes as given: a funded run and its data node.
    sponsor, run, data_node = sponsored_run(capsys, chain, tmp_path, stages=1)
    port = free_port()
    bootstrap = f"/ip4/127.0.0.1/tcp/{port}/p2p/{data_node['peer_id']}"

    # What the reader fills in, and settings that make a run short (env vars: a settings layer).
    filled = {
        "https://rpc.example": devnet.info.rpc_url,
        "network.json": str(devnet_file),
        "/ip4/HOST/tcp/PORT/p2p/PEER_ID": bootstrap,
        "--run 1": f"--run {run}",
    }
    env = {
        **os.environ,
        "GWTF_WALLET_PASSWORD": PASSWORD,
        "COLUMNS": "200",
        "GWTF_TRAINING_DEVICE": "cpu",
        "GWTF_CHAIN_CLOCK_PERIOD_S": "0.5",
        "GWTF_CHAIN_REPORT_PERIOD_S": "1.0",
        "GWTF_API_CHAIN_PERIOD_S": "1.0",
    }
    steps = []
    for command in guide():
        for placeholder, value in filled.items():
            command = command.replace(placeholder, value)
        steps.append(shlex.split(command))
    export, *commands = steps
    assert export[0] == "export"
    env.update(dict(assignment.split("=", 1) for assignment in export[1:]))

    def run_step(argv: list[str]) -> str:
        assert argv[0] == "gwtf-node"
        done = subprocess.run(
            [GWTF_NODE, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    by_name = {argv[1]: argv for argv in commands}
    created = run_step(by_name["wallet"])
    wallet_address = re.search(r"created wallet (0x[0-9a-fA-F]{40})", created)
    assert wallet_address, created
    run_cli(capsys, *chain, "fund", "--to", wallet_address.group(1), "--eth", "10")
    assert "registered node" in run_step(by_name["register"])
    assert re.search(rf"\b{run}\b", run_step(by_name["runs"]))
    assert "joined run" in run_step(by_name["join"])

    # The volunteer's node starts first; it waits for the data node, which starts after it.
    procs: list[NodeProcess] = []

    def start_volunteer() -> NodeProcess:
        proc = start(tmp_path, "volunteer", by_name["start"][1:], command=[GWTF_NODE], env=env)
        procs.append(proc)
        return proc

    try:
        volunteer = start_volunteer()
        log = tmp_path / "volunteer.log"
        wait_until(lambda: "waiting for the data node at" in log.read_text(), "the wait", 60)
        data = start(tmp_path, "data", ["--config", str(settings_file(tmp_path, "data")),
                                        *chain, "start", *sponsor, "--node-name", "data",
                                        "--run", run,
                                        "--listen", f"/ip4/127.0.0.1/tcp/{port}"])  # fmt: skip
        procs.append(data)
        volunteer.wait_for("serving on ", 120)
        status = " ".join(run_step(by_name["status"]).split())
        assert "(home .gwtf/nodes/main, running, API http://127.0.0.1:" in status, status
        assert "health" in status
        data_api = data.wait_for("dashboard and API: ").split()[3]
        from gwtf.node.local_api.client import call_api

        wait_until(lambda: call_api(data_api, "/v1/status")["iteration"] >= 6,
                   "the data node to train", 240)  # fmt: skip
        assert "earnings of node" in run_step(by_name["earnings"])
        ledger = EpochLedger(rpc_contracts, int(run), None)
        times = ledger.epoch_times(0)
        advance_time_to(rpc_w3, times.ends_at + 1)
        wait_until(lambda: ledger.certificate(0, data_node["node"]), "the certificate", 60)

        # Stopped before the epoch settles: its work is unclaimed, and it says until when.
        volunteer.popen.send_signal(signal.SIGINT)
        assert volunteer.popen.wait(timeout=30) == 130
        status = " ".join(run_step(by_name["status"]).split())
        assert re.search(r"unclaimed: epoch 0: .* claimable from .* until ", status), status
        volunteer = start_volunteer()
        volunteer.wait_for("unclaimed work of node", 120)
        volunteer.wait_for("serving on ", 120)
        advance_time_to(rpc_w3, times.settles_at + 1)
        claimed = run_step(by_name["claim"])  # the node may have claimed by itself already
        assert re.search(r"confirmed|nothing to claim|tries again by itself", claimed), claimed
        node = node_of(tmp_path, by_name["register"])
        wait_until(lambda: sum(p.amount_wei for p in ledger.rewards_to(node)) > 0,
                   "the volunteer to be paid", 60)  # fmt: skip
        volunteer.popen.send_signal(signal.SIGINT)
        assert volunteer.popen.wait(timeout=30) == 130
    finally:
        stop_all(procs)


def node_of(tmp_path: Path, register: list[str]) -> str:
    """The address of the node the guide's ``register`` made (its key beside the wallet)."""
    from gwtf.node.chain.wallet import node_key_path, read_keystore_address

    wallet = tmp_path / register[register.index("--wallet") + 1]
    return read_keystore_address(node_key_path(wallet, "main"))
