"""How long a volunteer waits on ``gwtf-node``, and how far the capacity it registers moves.

* Wall time of ``gwtf-node --help``, ``gwtf-node status`` and ``gwtf-node earnings``, each a
  fresh process as a person types it, against ``python -c pass`` in the same interpreter
  measured in the same run (the baseline: what starting Python costs). Goal: at most 5x the
  baseline. Median of ``--repeats`` runs each, the commands interleaved so a change in the
  machine's load falls on all of them alike.
* The capacity ``gwtf-node register`` measures (``gwtf.node.training.capacity``), each in a fresh
  process as ``register`` runs it, ``--capacity-runs`` times: its spread, (max - min) / median
  of the seconds per microbatch. Goal: at most 20 %.

What ``status`` and ``earnings`` read is set up first, as a volunteer would have it: a devnet
(``gwtf-node devnet``'s chain and contracts, anvil or the embedded chain; or ``--devnet-file``
of a running one), a wallet funded and its node registered and staked through ``gwtf-node``
(capacity given by flags, so the set-up does not measure it). Both ways a volunteer meets them
are timed:
* stopped: no node runs in the home, so ``status`` and ``earnings`` read the chain (and an
  empty migrated node database), as before ``start`` or after it;
* running: a sponsor's one-stage run with its data node, and the volunteer's node started with
  ``gwtf-node start`` (the data node trains one iteration, then both idle), so ``status`` and
  ``earnings`` ask the running node's API.

Usage: python bench/cli.py [--repeats 7] [--capacity-runs 5] [--model gpt-tiny]
                           [--devnet-file PATH] [--skip-capacity]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PASSWORD = "bench-password"
#: The capacity measurement as ``gwtf-node register`` runs it, in a process of its own.
CAPACITY = (
    "import json, sys\n"
    "from gwtf.node.training.capacity import measure_capacity\n"
    "from gwtf.node.training.settings import TrainingSettings\n"
    "c = measure_capacity(sys.argv[1], 2, TrainingSettings(device='auto'), quiet=True)\n"
    "print(json.dumps({'s': c.seconds_per_microbatch, 'device': c.gpu_model}))\n"
)


def gwtf_node() -> str:
    """The console script beside this interpreter (the project's virtual environment)."""
    script = Path(sys.executable).parent / "gwtf-node"
    found = str(script) if script.exists() else shutil.which("gwtf-node")
    if found is None:
        sys.exit("bench/cli.py: no gwtf-node beside this python; run it with .venv/bin/python")
    return found


def run(argv: list[str], check: bool = True, cwd: Path | None = None) -> tuple[float, str]:
    """Runs ``argv`` to the end (in ``cwd``); its wall time (s) and stdout."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    elapsed = time.perf_counter() - started
    if check and done.returncode != 0:
        sys.exit(f"bench/cli.py: {' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
    return elapsed, done.stdout


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_up(tmp: Path, devnet_file: Path, cli: str) -> dict[str, list[str]]:
    """A funded wallet with a registered node on the devnet and an empty node database; the
    commands to time while no node runs."""
    from gwtf.node.store.database import open_database

    chain = ["--devnet-file", str(devnet_file)]
    keys, node = registered(tmp, "volunteer", chain, cli)
    url = f"sqlite:///{tmp / 'node.sqlite'}"
    open_database(url).engine.dispose()
    return {
        "--help": [cli, "--help"],
        "status (stopped)": [cli, *chain, "status", "--wallet", keys[1], "--home",
                             str(tmp / "no-node"), "--json"],
        "earnings (stopped)": [cli, *chain, "earnings", "--node", node["node"], "--run", "1",
                               "--db-url", url, "--json"],
    }  # fmt: skip


def registered(
    tmp: Path, name: str, chain: list[str], cli: str
) -> tuple[list[str], dict[str, str]]:
    """A new wallet, funded, with its node ``main`` registered and staked: its flags, and what
    ``register`` said (the node's address and peer id)."""
    from gwtf.node.chain.wallet import create_wallet

    wallet = tmp / f"{name}.json"
    address = create_wallet(wallet, PASSWORD).address
    (tmp / "password").write_text(PASSWORD)
    keys = ["--wallet", str(wallet), "--password-file", str(tmp / "password")]
    run([cli, *chain, "fund", "--to", address, "--eth", "5"])
    _, out = run([cli, *chain, "register", *keys, "--stake-eth", "2", "--capacity", "flags",
                  "--gpu-model", "bench", "--memory-mib", "1024", "--throughput", "1000",
                  "--json"])  # fmt: skip
    return keys, json.loads(out)


@contextlib.contextmanager
def running_node(tmp: Path, devnet_file: Path, cli: str) -> Iterator[dict[str, list[str]]]:
    """A sponsor's one-stage run, its data node and a volunteer's node, each started with
    ``gwtf-node start`` in ``tmp`` (their homes below it); the commands to time against the
    volunteer's running node."""
    chain = ["--devnet-file", str(devnet_file)]
    sponsor, data_node = registered(tmp, "sponsor", chain, cli)
    _, out = run([cli, *chain, "runs", "open", *sponsor, "--stages", "1",
                  "--reward-per-epoch-eth", "1", "--hop-price-eth", "0.0001",
                  "--min-stake-eth", "1", "--fund-eth", "1",
                  "--json"])  # fmt: skip
    run_id = str(json.loads(out)["run_id"])
    run([cli, *chain, "runs", "add-data-node", *sponsor, "--run", run_id,
         "--node", data_node["node"]])  # fmt: skip
    volunteer, _ = registered(tmp, "volunteer-running", chain, cli)
    run([cli, *chain, "join", *volunteer, "--run", run_id])
    port = closed_port()
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{data_node['peer_id']}"
    env = {**os.environ, "GWTF_TRAINING_ITERATIONS": "1", "GWTF_TRAINING_DEVICE": "cpu"}
    start = [cli, *chain, "start", "--run", run_id]
    data_argv = [*start, *sponsor, "--home", str(tmp / "data-home"),
                 "--listen", f"/ip4/127.0.0.1/tcp/{port}"]  # fmt: skip
    volunteer_argv = [*start, *volunteer, "--bootstrap", address,
                      "--listen", "/ip4/127.0.0.1/tcp/0"]  # fmt: skip
    procs = [
        subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for argv in (data_argv, volunteer_argv)
    ]
    try:
        home = tmp / ".gwtf" / "nodes" / "main"
        deadline = time.monotonic() + 300
        while (
            not (home / "node.json").is_file()
            or '"running"' not in (home / "node.json").read_text()
        ):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                sys.exit("bench/cli.py: the volunteer's node did not start serving")
            time.sleep(0.5)
        time.sleep(10)  # the node reads the chain, and the data node trains its iteration
        yield {
            "status (running)": [cli, *chain, "status", "--wallet", volunteer[1], "--json"],
            "earnings (running)": [cli, *chain, "earnings", "--wallet", volunteer[1], "--json"],
        }
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def time_commands(commands: dict[str, list[str]], repeats: int, cwd: Path) -> None:
    baseline = "python -c pass"
    argvs = {baseline: [sys.executable, "-c", "pass"], **commands}
    for argv in argvs.values():  # once each first: the disk cache warm for all alike
        run(argv, cwd=cwd)
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(repeats):
        for name, argv in argvs.items():
            times[name].append(run(argv, cwd=cwd)[0])
    base = statistics.median(times[baseline])
    print(f"\n{'gwtf-node':<22}{'median s':>10}{'min s':>9}{'max s':>9}{'vs python -c pass':>19}"
          f"{'goal':>8}")  # fmt: skip
    for name, samples in times.items():
        ratio = statistics.median(samples) / base
        goal = "" if name == baseline else ("met" if ratio <= 5 else "missed")
        print(f"{name:<22}{statistics.median(samples):>10.3f}{min(samples):>9.3f}"
              f"{max(samples):>9.3f}{ratio:>18.1f}x{goal:>8}")  # fmt: skip


def capacity_spread(model: str, runs: int) -> None:
    seconds, walls, device = [], [], ""
    for _ in range(runs):
        wall, out = run([sys.executable, "-c", CAPACITY, model])
        measured = json.loads(out.strip().splitlines()[-1])
        seconds.append(measured["s"])
        walls.append(wall)
        device = measured["device"]
    middle = statistics.median(seconds)
    spread = (max(seconds) - min(seconds)) / middle
    print(f"\ncapacity of a stage of {model} on {device}, {runs} fresh processes:")
    print("  ms per microbatch: " + ", ".join(f"{1e3 * s:.3f}" for s in seconds))
    print(f"  median {1e3 * middle:.3f} ms; spread (max - min) / median {100 * spread:.1f} %"
          f" (goal <= 20 %: {'met' if spread <= 0.2 else 'missed'}); each run"
          f" {statistics.median(walls):.1f} s wall, imports included")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each command")
    parser.add_argument("--capacity-runs", type=int, default=5)
    parser.add_argument("--model", default="gpt-tiny", help="the model whose stage is measured")
    parser.add_argument(
        "--devnet-file", type=Path, help="a running devnet's file (else one starts)"
    )
    parser.add_argument("--skip-capacity", action="store_true")
    args = parser.parse_args()
    cli = gwtf_node()
    with tempfile.TemporaryDirectory() as tmp:
        devnet = None
        devnet_file = args.devnet_file
        if devnet_file is None:
            from gwtf.node.devnet.server import start_devnet

            devnet_file = Path(tmp) / "devnet.json"
            devnet = start_devnet("127.0.0.1", 0, None, devnet_file)
        try:
            stopped = set_up(Path(tmp), devnet_file, cli)
            with running_node(Path(tmp), devnet_file, cli) as running:
                time_commands({**stopped, **running}, args.repeats, cwd=Path(tmp))
        finally:
            if devnet is not None:
                devnet.stop()
    if not args.skip_capacity:
        capacity_spread(args.model, args.capacity_runs)


if __name__ == "__main__":
    main()
