"""A volunteer's whole story through the real ``gwtf-node`` processes on the devnet: a sponsor
opens a run and names its data node, two volunteers register and join, each node is started
with ``gwtf-node start``, the run trains, the epoch is certified and settles, one relay claims by
itself and the other when asked (``gwtf-node claim``), their APIs and ``gwtf-node earnings``
agree with the chain, Ctrl-C leaves cleanly, and the stake comes back. Each refusal of ``start``
is one line with its exit code."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from gwtf.contracts.encoding import CertifiedHop, signatures_hash
from gwtf.contracts.merkle import verify_proof
from gwtf.errors import ConfigError
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import advance_time, advance_time_to
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.cli.start import _DIR_IN_USE, exclusive_lock
from gwtf.node.local_api.client import call_api
from tests.node.conftest import FAST_SCRYPT_N
from tests.node.test_cli import assert_one_line_error, run_cli
from tests.node.test_cli_volunteer import PASSWORD, cli_json, new_wallet

ITERATIONS = 6
WEEK_S = 7 * 24 * 3600


@dataclass
class NodeProcess:
    name: str
    popen: subprocess.Popen[str]
    log: Any
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def wait_for(self, prefix: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.seen:
                if line.startswith(prefix):
                    return line
            try:
                self.seen.append(self.lines.get(timeout=0.2).strip())
            except queue.Empty:
                if self.popen.poll() is not None:
                    break
        raise AssertionError(f"{self.name} never printed {prefix!r}: {self.seen[-20:]}")


def start(
    tmp_path: Path,
    name: str,
    argv: list[str],
    command: Sequence[str] = (sys.executable, "-m", "gwtf.node.cli.main"),
    env: Mapping[str, str] | None = None,
) -> NodeProcess:
    """``command argv`` (``gwtf-node``'s) in ``tmp_path``, its output read line by line."""
    log = (tmp_path / f"{name}.log").open("w")
    popen = subprocess.Popen(
        [*command, *argv],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"} if env is None else dict(env),
        stdin=subprocess.DEVNULL,
    )
    proc = NodeProcess(name, popen, log)

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            proc.lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc


def settings_file(tmp_path: Path, name: str, **chain: Any) -> Path:
    path = tmp_path / f"{name}.toml"
    chain_lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in chain.items())
    path.write_text(
        f'[training]\nmodel = "gpt-tiny"\niterations = {ITERATIONS}\n'
        'microbatches_per_iteration = 2\ndevice = "cpu"\n'
        f"[chain]\nclock_period_s = 0.5\nreport_period_s = 1.0\n{chain_lines}"
        "[api]\nchain_period_s = 1.0\n[flow]\nsetup_timeout_s = 60.0\n"
    )
    return path


def stop_all(procs: list[NodeProcess]) -> None:
    """Kill what is still running of ``procs`` and close their pipes and logs."""
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait()
        proc.log.close()
        if proc.popen.stdout is not None:
            proc.popen.stdout.close()


def wait_until(check: Any, what: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


#: A registration's capacity given by flags: nothing measured.
CAPACITY = ("--capacity", "flags", "--gpu-model", "cpu", "--memory-mib", "4096",
            "--throughput", "600")  # fmt: skip


def fast_node_key(wallet: Sequence[str], node_name: str) -> None:
    """Make the node key ``register`` would make for ``wallet``'s ``node_name``, at the tests'
    low scrypt cost: every command and node process opens it, ~1 s each at the default cost.
    (tests/node/test_cli_volunteer.py has ``register`` make one itself.)"""
    from gwtf.node.chain.wallet import load_or_create_node_key, node_key_path

    path = node_key_path(wallet[wallet.index("--wallet") + 1], node_name)
    load_or_create_node_key(path, PASSWORD, scrypt_n=FAST_SCRYPT_N)


def sponsored_run(
    capsys: pytest.CaptureFixture[str], chain: Sequence[str], tmp_path: Path, stages: int
) -> tuple[tuple[str, ...], str, dict[str, Any]]:
    """A sponsor's funded run of ``stages`` with its data node registered (node name "data")
    and named: the sponsor's wallet flags, the run id, what ``register`` said of the node."""
    sponsor, address = new_wallet(tmp_path, "sponsor")
    fast_node_key(sponsor, "data")
    run_cli(capsys, *chain, "fund", "--to", address, "--eth", "10")
    opened = cli_json(capsys, *chain, "runs", "open", *sponsor, "--stages", str(stages),
                      "--reward-per-epoch-eth", "1", "--hop-price-eth", "0.0001",
                      "--min-stake-eth", "1", "--fund-eth", "5",
                      "--epoch-length-s", "3600", "--challenge-window-s", "600")  # fmt: skip
    assert isinstance(opened, dict)
    run = str(opened["run_id"])
    data_node = cli_json(capsys, *chain, "register", *sponsor, "--node-name", "data",
                         "--stake-eth", "1", *CAPACITY)  # fmt: skip
    assert isinstance(data_node, dict)
    cli_json(capsys, *chain, "runs", "add-data-node", *sponsor, "--run", run,
             "--node", data_node["node"])  # fmt: skip
    return sponsor, run, data_node


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow  # ~35 s: a volunteer's whole life on a dev chain, node processes included
def test_register_start_earn_claim_leave_unstake_withdraw(
    capsys: pytest.CaptureFixture[str],
    devnet_file: Path,
    rpc_w3: Web3,
    rpc_contracts: Contracts,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The commands here run where the nodes run, as a volunteer's would: each node's home is
    # .gwtf/nodes/NAME below it.
    monkeypatch.chdir(tmp_path)
    chain = ("--devnet-file", str(devnet_file))
    sponsor, run, data_node = sponsored_run(capsys, chain, tmp_path, stages=2)
    volunteers = [new_wallet(tmp_path, f"volunteer-{i}") for i in range(2)]
    for _, address in volunteers:
        run_cli(capsys, *chain, "fund", "--to", address, "--eth", "10")
    # Two volunteers' nodes on this one machine: each its own name, so its own home.
    names = [f"relay-{i}" for i in range(2)]
    relay_nodes = []
    for (wallet, _), name in zip(volunteers, names, strict=True):
        fast_node_key(wallet, name)
        relay_nodes.append(cli_json(capsys, *chain, "register", *wallet, "--node-name", name,
                                    "--stake-eth", "2", *CAPACITY)["node"])  # type: ignore[index]  # fmt: skip
        code, _, err = run_cli(capsys, *chain, "start", *wallet, "--node-name", name, "--run",
                               run, "--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/x")  # fmt: skip
        assert code == 2
        assert_one_line_error(err, f"is not in run {run}; join it")
        cli_json(capsys, *chain, "join", *wallet, "--node-name", name, "--run", run)

    # The relays start first, together, and wait for the data node they bootstrap from.
    port = free_port()
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{data_node['peer_id']}"
    common = [*chain, "start", "--run", run, "--listen", "/ip4/127.0.0.1/tcp/0"]
    relays, procs = [], []
    try:
        for i, ((wallet, _), name) in enumerate(zip(volunteers, names, strict=True)):
            # The second relay claims only when asked.
            toml = settings_file(tmp_path, name, auto_claim=i == 0)
            argv = ["--config", str(toml), *common, *wallet, "--node-name", name,
                    "--bootstrap", address]  # fmt: skip
            relay = start(tmp_path, name, argv)
            relays.append(relay)
            procs.append(relay)
        for relay in relays:
            log = tmp_path / f"{relay.name}.log"
            wait_until(lambda log=log: "waiting for the data node at" in log.read_text(),
                       f"{relay.name} to wait")  # fmt: skip
        data_toml = settings_file(tmp_path, "data")
        data = start(tmp_path, "data", ["--config", str(data_toml), *chain, "start", "--run",
                                        run, *sponsor, "--node-name", "data", "--listen",
                                        f"/ip4/127.0.0.1/tcp/{port}"])  # fmt: skip
        procs.append(data)
        assert data.wait_for("serving on ").split()[-1] == address
        data_api = data.wait_for("dashboard and API: ").split()[3]
        urls = [relay.wait_for("dashboard and API: ").split()[3] for relay in relays]
        for relay in relays:
            relay.wait_for("serving on ", 120)
        # Only one node can have the default API port: the others took free ones, and each
        # home says where its node's API is.
        assert len({data_api, *urls}) == 3
        for name, url in zip(names, urls, strict=True):
            running = json.loads((tmp_path / ".gwtf" / "nodes" / name / "node.json").read_text())
            assert running["api_url"] == url and running["role"] == "relay"
        wait_until(lambda: all(call_api(url, "/v1/status")["health"]["status"] != "starting"
                               for url in urls), "the relays to serve", 120)  # fmt: skip
        # Started together, they spread over the stages.
        stages = sorted(call_api(url, "/v1/status")["stage"] for url in urls)
        assert stages == [1, 2], "the relays started together took one stage"
        # The same node started twice is refused in one line (it would sign two versions).
        code, _, err = run_cli(capsys, "--config", str(tmp_path / "relay-0.toml"), *common,
                               *volunteers[0][0], "--node-name", "relay-0", "--bootstrap",
                               address)  # fmt: skip
        assert code == 2
        assert_one_line_error(err, "another process is running node")

        wait_until(lambda: call_api(data_api, "/v1/status")["iteration"] >= ITERATIONS,
                   "the data node to train its iterations", 240)  # fmt: skip
        ledger = EpochLedger(rpc_contracts, int(run), None)
        times = ledger.epoch_times(0)
        advance_time_to(rpc_w3, times.ends_at + 1)
        wait_until(lambda: ledger.certificate(0, data_node["node"]), "the certificate", 60)
        # Claiming takes the node's name alone: its home says where its API and token are.
        code, _, err = run_cli(capsys, "claim", "--node-name", "relay-1", "--epoch", "0")
        assert code == 1, err
        assert_one_line_error(err, "epoch 0 settles at chain time")
        advance_time_to(rpc_w3, times.settles_at + 1)

        def claimed(url: str) -> int:
            return int(call_api(url, "/v1/earnings")["total_claimed"]["wei"])

        wait_until(lambda: claimed(urls[0]) > 0, "relay-0 to claim by itself", 60)
        assert claimed(urls[1]) == 0, "relay-1 claims only when asked"
        result = cli_json(capsys, "claim", "--node-name", "relay-1")
        assert isinstance(result, dict) and result["asked"] == [0]
        assert [c["status"] for c in result["claims"]] == ["confirmed"]
        # Each relay's API, `earnings` (which asks the running node) and the chain agree.
        paid = []
        for i, (wallet, _) in enumerate(volunteers):
            paid.append(sum(p.amount_wei for p in ledger.rewards_to(relay_nodes[i])))
            assert paid[i] > 0 and claimed(urls[i]) == paid[i]
            earned = cli_json(capsys, *chain, "earnings", "--wallet", wallet[1],
                              "--node-name", names[i])  # fmt: skip
            assert isinstance(earned, dict) and earned["total_claimed"]["wei"] == str(paid[i])
            (epoch,) = earned["epochs"]
            assert epoch["phase"] in ("settled", "closed") and epoch["units_certified"] > 0
            status = call_api(urls[i], "/v1/status")
            assert status["role"] == "relay" and status["stage"] in (1, 2)
            # Its proofs are kept once the claim is done with, outside the claims' lock.
            root = ledger.certificate(0, data_node["node"]).root
            wait_until(lambda i=i, root=root, epoch=epoch: proven_units(urls[i], root)
                       == epoch["units_certified"], f"relay-{i}'s proofs", 60)  # fmt: skip
        # Another node's name never reads this one's: the wallet's node is not the home's.
        code, _, err = run_cli(capsys, *chain, "earnings", "--wallet", volunteers[0][0][1],
                               "--node-name", "relay-0", "--home",
                               ".gwtf/nodes/relay-1")  # fmt: skip
        assert code == 2
        assert_one_line_error(err, "the node running in this home is")
        for proc in reversed(procs):
            proc.popen.send_signal(signal.SIGINT)
        for proc in procs:
            # Stopped by Ctrl-C: it leaves cleanly and says so with the shell's code for it.
            assert proc.popen.wait(timeout=30) == 130, proc.name
            assert "the node left its run" in " ".join(proc.seen + list(proc.lines.queue))
    finally:
        stop_all(procs)

    # Stopped, each node's earnings come from its database in its home, beside the chain.
    for i, (wallet, _) in enumerate(volunteers):
        stopped = json.loads((tmp_path / ".gwtf" / "nodes" / names[i] / "node.json").read_text())
        assert stopped["pid"] == 0 and stopped["run_id"] == int(run)
        earned = cli_json(capsys, *chain, "earnings", "--wallet", wallet[1],
                          "--node-name", names[i], "--run", run)  # fmt: skip
        assert isinstance(earned, dict) and earned["total_claimed"]["wei"] == str(paid[i])
        # Both relays claimed all the certified units: the epoch closed with the last claim.
        assert [e["phase"] for e in earned["epochs"]] == ["closed"]

    wallet = volunteers[0][0]
    cli_json(capsys, *chain, "unstake", *wallet, "--node-name", "relay-0")
    code, _, err = run_cli(capsys, *chain, "start", *wallet, "--node-name", "relay-0", "--run",
                           run, "--bootstrap", address)  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "is not active")
    advance_time(rpc_w3, WEEK_S + 1)
    withdrawn = cli_json(capsys, *chain, "withdraw", *wallet, "--node-name", "relay-0")
    assert isinstance(withdrawn, dict) and withdrawn["withdrawn"]["eth"] == "2"


def proven_units(url: str, root: bytes) -> int:
    """The units of the node's receipts that carry their leaf in the certificate of ``root``,
    each with a Merkle proof checked here against that root."""
    page = call_api(url, "/v1/receipts?limit=500")
    assert page["total"] <= 500
    units = 0
    for r in page["items"]:
        proof = r["proof"]
        if proof is None:
            continue
        assert r["as_worker"] and proof["root"] == "0x" + root.hex(), r
        leaf = CertifiedHop(
            proof["leaf_index"], proof["units_before"], r["worker"], r["units"],
            bytes.fromhex(r["hop_key"][2:]), bytes.fromhex(r["receipt_digest"][2:]),
            signatures_hash(bytes.fromhex(r["worker_signature"][2:]),
                            bytes.fromhex(r["counterparty_signature"][2:]),
                            [bytes.fromhex(h[2:]) for h in r["batch_proof"]]),
        )  # fmt: skip
        assert proof["signatures_hash"] == "0x" + leaf.signaturesHash.hex()
        assert verify_proof([bytes.fromhex(h[2:]) for h in proof["siblings"]], root, leaf.leaf())
        units += r["units"]
    return units


def test_a_lock_held_is_refused_with_what_to_do(tmp_path: Path) -> None:
    refused = pytest.raises(ConfigError, match="another node is using this home")
    with exclusive_lock(tmp_path / "node.lock", _DIR_IN_USE), refused:  # noqa: SIM117
        with exclusive_lock(tmp_path / "node.lock", _DIR_IN_USE):
            pass
    with exclusive_lock(tmp_path / "node.lock", _DIR_IN_USE):  # free again once released
        assert (tmp_path / "node.lock").read_text() == str(os.getpid())
