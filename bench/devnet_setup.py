"""The local swarm's chain set-up, on anvil against the eth-tester devnet, in one run.

What ``gwtf-node swarm`` does before any node trains, timed end to end: start its devnet and
deploy the contracts, open the run with its pool, then for every node create its key, and for a
relay create and fund its wallet, register it with its stake and join it to the run (a data
node is registered by the sponsor and named a data node of the run) — ``gwtf.node.swarm.chain``'s
own code on each chain:

* baseline, ``eth-tester process``: ``gwtf-node devnet --backend eth-tester`` started as its
  own process, waited for through its devnet file (how the swarm started its devnet before
  anvil);
* ``anvil``: ``start_swarm_chain`` as the swarm runs it now (anvil, a child process);
* ``eth-tester fallback``: the same with the embedded chain in this process, where anvil is
  not installed.

Each swarm size is run ``--repeats`` times per chain, alternating; medians are printed. The
last row of each size creates the same keystores with no chain at all (scrypt at the swarm's
``DEVNET_SCRYPT_N``): the part of the nodes' time no chain can save.

Usage: python bench/devnet_setup.py [--swarms 2x2,4x3] [--data-nodes 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gwtf.node.chain.actions import DATASET_HASH, Contracts, RunModel
from gwtf.node.chain.adapter import connect
from gwtf.node.chain.deployment import read_devnet_file
from gwtf.node.chain.wallet import create_wallet
from gwtf.node.devnet.anvil import DEFAULT_ANVIL, is_runnable
from gwtf.node.swarm.chain import (
    DEVNET_SCRYPT_N,
    SWARM_GAS_LIMIT,
    ChainPlan,
    SwarmChain,
    child_env,
    ensure_node_key,
    open_swarm_run,
    password_file,
    sponsor_of,
    start_swarm_chain,
)
from gwtf.node.training.settings import TrainingSettings

REPO = Path(__file__).resolve().parents[1]
MODEL = "gpt-tiny"
DEVNET_START_TIMEOUT_S = 60.0
CAPACITY = 2


def run_model(stages: int) -> RunModel:
    return RunModel.of(TrainingSettings(model=MODEL, stages=stages))


@dataclass(frozen=True)
class Timing:
    chain_s: float  # devnet up, contracts deployed, run opened
    nodes_s: float  # every node keyed, funded, registered, staked and in the run

    @property
    def total_s(self) -> float:
        return self.chain_s + self.nodes_s


def devnet_process_chain(out: Path, stages: int) -> tuple[SwarmChain, Callable[[], None]]:
    """The baseline: the devnet as its own process, found through the file it writes."""
    devnet_file = out / "devnet.json"
    command = [sys.executable, "-m", "gwtf.node.cli", "--devnet-file", str(devnet_file), "devnet",
               "--port", "0", "--backend", "eth-tester"]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(), cwd=REPO
    )
    deadline = time.monotonic() + DEVNET_START_TIMEOUT_S
    while not devnet_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the eth-tester devnet did not start (exit {process.poll()})")
        time.sleep(0.1)
    info = read_devnet_file(devnet_file)
    contracts = Contracts.at(connect(info.rpc_url), info.contracts, gas_limit=SWARM_GAS_LIMIT)
    chain = open_swarm_run(contracts, sponsor_of(info), ChainPlan(), out, run_model(stages))

    def stop() -> None:
        process.send_signal(2)  # as Ctrl-C: the devnet removes its file
        process.wait(timeout=30)

    return chain, stop


def in_process_chain(backend: str) -> Callable[[Path, int], tuple[SwarmChain, Callable[[], None]]]:
    def start(out: Path, stages: int) -> tuple[SwarmChain, Callable[[], None]]:
        chain = start_swarm_chain(
            ChainPlan(), out, run_model(stages), DATASET_HASH, None, backend=backend
        )
        return chain, chain.stop

    return start


def set_up(
    start: Callable[[Path, int], tuple[SwarmChain, Callable[[], None]]],
    stages: int,
    relays_per_stage: int,
    data_nodes: int,
) -> Timing:
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-devnet-") as tmp:
        out = Path(tmp)
        began = time.perf_counter()
        chain, stop = start(out, stages)
        try:
            opened = time.perf_counter()
            for shard in range(data_nodes):
                chain.register(f"data-{shard}", CAPACITY, data_node=True)
            for stage in range(1, stages + 1):
                for replica in range(relays_per_stage):
                    chain.register(f"relay-{stage}-{replica}", CAPACITY)
            done = time.perf_counter()
        finally:
            stop()
    return Timing(opened - began, done - opened)


def keystores_only(stages: int, relays_per_stage: int, data_nodes: int) -> float:
    """Seconds to create what ``SwarmChain.register`` creates on disk: each node's key, and
    each relay's wallet."""
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-keys-") as tmp:
        out = Path(tmp)
        password = password_file(out).read_text().strip()
        began = time.perf_counter()
        for shard in range(data_nodes):
            ensure_node_key(out, f"data-{shard}")
        for stage in range(1, stages + 1):
            for replica in range(relays_per_stage):
                name = f"relay-{stage}-{replica}"
                ensure_node_key(out, name)
                create_wallet(out / "wallets" / f"{name}.json", password, scrypt_n=DEVNET_SCRYPT_N)
        return time.perf_counter() - began


def parse_swarms(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        stages, _, per_stage = item.partition("x")
        sizes.append((int(stages), int(per_stage)))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swarms", default="2x2,4x3", help="stages x relays per stage, ...")
    parser.add_argument("--data-nodes", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not is_runnable(DEFAULT_ANVIL):
        raise SystemExit(f"no anvil at {DEFAULT_ANVIL}: run `make install`")
    chains = {
        "eth-tester process": devnet_process_chain,
        "anvil": in_process_chain("anvil"),
        "eth-tester fallback": in_process_chain("eth-tester"),
    }
    print(f"{'swarm':<22}{'chain':<21}{'devnet+run s':>13}{'nodes s':>9}{'total s':>9}"
          f"{'ms/node':>9}{'baseline/this':>15}")  # fmt: skip
    for stages, per_stage in parse_swarms(args.swarms):
        nodes = stages * per_stage + args.data_nodes
        runs: dict[str, list[Timing]] = {name: [] for name in chains}
        for _ in range(args.repeats):
            for name, start in chains.items():
                runs[name].append(set_up(start, stages, per_stage, args.data_nodes))
        baseline = statistics.median(t.total_s for t in runs["eth-tester process"])
        label = f"{stages}x{per_stage} + {args.data_nodes} data ({nodes})"
        for name, timings in runs.items():
            chain_s = statistics.median(t.chain_s for t in timings)
            nodes_s = statistics.median(t.nodes_s for t in timings)
            total_s = statistics.median(t.total_s for t in timings)
            print(f"{label:<22}{name:<21}{chain_s:>13.2f}{nodes_s:>9.2f}{total_s:>9.2f}"
                  f"{1000 * nodes_s / nodes:>9.0f}{baseline / total_s:>15.2f}")  # fmt: skip
        keys_s = statistics.median(
            keystores_only(stages, per_stage, args.data_nodes) for _ in range(args.repeats)
        )
        print(f"{label:<22}{'keystores alone':<21}{'-':>13}{keys_s:>9.2f}{'-':>9}"
              f"{1000 * keys_s / nodes:>9.0f}{'-':>15}")  # fmt: skip


if __name__ == "__main__":
    main()
