"""``gwtf-node start``: this machine's node in a real network, until Ctrl-C.

Before anything starts, the chain is asked everything that would make the node useless or
unpaid, and each is one line saying what to do: the chain unreachable or not the devnet file's,
the run missing, closed or of another model, the node not registered, not active, under the
run's minimum stake or not in the run, the data directory in use by another node, the p2p or
API port taken. The node is a relay, or a data node when the run's sponsor named it one. Then
its libp2p host, its role, its database, the epoch cycle and the local API run; the dashboard's
address is printed, and once peers have dialled it back, whether they can reach it ("reachable at
…" or "behind NAT: running outbound-only"; a router's UPnP port mapping is checked the same way,
`--no-upnp` skips it). Ctrl-C (or SIGTERM) leaves gracefully: the node hands its flows back up-
and downstream (their microbatches are re-routed by the peers), stops, and closes its database.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gwtf.errors import ChainError, ConfigError, GwtfError
from gwtf.node.cli.args import Command, add_wallet_flags, port, whole
from gwtf.node.home import LOCK_FILE, home_of, home_settings
from gwtf.node.settings import Settings, load_settings

if TYPE_CHECKING:
    from rich.console import Console

    from gwtf.node.chain.actions import Contracts
    from gwtf.node.chain.adapter import RunInfo
    from gwtf.node.local_api.service import LocalApi
    from gwtf.node.p2p.reachability import Reachability
    from gwtf.node.runtime.live_node import LiveNode, LiveNodeConfig


log = logging.getLogger(__name__)
#: The exit code of a node stopped by Ctrl-C (128 + SIGINT), as a shell reports it.
EXIT_STOPPED = 130
#: How long a leaving node lets its goodbyes and hand-backs reach its peers.
LEAVE_GRACE_S = 2.0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    start = sub.add_parser("start", help="run this machine's node in a run, until Ctrl-C")
    add_wallet_flags(start)
    start.add_argument("--run", type=whole, required=True, help="run id")
    start.add_argument(
        "--bootstrap", action="append", default=[], help="a peer's multiaddr (repeatable)"
    )
    start.add_argument(
        "--listen", action="append", default=[],
        help="a TCP multiaddr to listen on (repeatable; p2p.listen, default /ip4/0.0.0.0/tcp/0: "
        "every interface, any port)",
    )  # fmt: skip
    start.add_argument(
        "--announce", action="append", default=[],
        help="a public address peers reach this node at, e.g. /ip4/IP/tcp/PORT (repeatable; "
        "p2p.announce)",
    )  # fmt: skip
    start.add_argument(
        "--no-upnp", action="store_true",
        help="do not ask the home router to forward a port (p2p.upnp = false)",
    )  # fmt: skip
    start.add_argument("--api-port", type=port, help="local API port (api.port; 0: any)")
    start.add_argument(
        "--home", "--data-dir", dest="home",
        help="the node's home: its database, token, evidence (default .gwtf/nodes/NODE_NAME)",
    )  # fmt: skip
    return {"start": cmd_start}


def cmd_start(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    import trio
    from eth_account import Account

    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.chain.wallet import node_key_path, open_wallet, resolve_password
    from gwtf.node.composition import live_config_from_settings
    from gwtf.node.home import RunningNode, clear_running, write_running
    from gwtf.node.logs import configure_logging
    from gwtf.node.p2p.identity import identity_from_key, peer_id_of

    password = resolve_password(args.password_file)
    # A wrong password stops here, before anything starts.
    wallet = open_wallet(args.wallet, password).address
    key_file = node_key_path(args.wallet, args.node_name)
    if not key_file.is_file():
        raise ConfigError(
            f"wallet {args.wallet} has no node {args.node_name!r}: register it first with "
            "`gwtf-node register`"
        )
    node_key = bytes(open_wallet(key_file, password).key)
    node = Account.from_key(node_key).address
    contracts, info = open_contracts(settings)
    role, run = check_the_chain(contracts, info.chain_id, args.run, node, wallet, settings)
    settings = start_settings(args, settings, role, key_file, run)
    home = Path(settings.node.data_dir)
    warn_of_files_outside_homes(home, console)
    # One process per node key: two would sign two versions of a hop, and be slashed for it.
    with (
        exclusive_lock(key_file.with_name(key_file.name + ".lock"), _KEY_IN_USE.format(node)),
        exclusive_lock(home / LOCK_FILE, _DIR_IN_USE),
    ):
        check_listen_ports(settings.p2p.listen)
        api = local_api(settings, default_port=args.api_port is None)
        config = live_config_from_settings(settings, password)
        peer_id = peer_id_of(identity_from_key(node_key)).to_base58()
        console.print(f"node {node} (peer id {peer_id}) starts in run {args.run} as a {role} node")
        console.print(f"home: {home}", highlight=False)
        if role == "data":
            iterations = settings.training.iterations
            console.print(
                f"trains {iterations} iterations" if iterations else "trains until Ctrl-C"
            )
        if api is not None:
            console.print(f"dashboard and API: {api.url}  (OpenAPI docs at {api.url}/docs)")
        if role == "relay":
            report_unclaimed(settings, contracts, args.run, node, console, args.node_name)
        configure_logging(node, settings.log.level, json=settings.log.json)

        starting = RunningNode(node, peer_id, args.run, role, "", "", os.getpid(), "starting")
        write_running(home, starting)

        def announce(address: str) -> None:
            url = api.url if api is not None else ""
            write_running(
                home, replace(starting, api_url=url, p2p_address=address, state="running")
            )

        try:
            stopped_by = trio.run(run_until_stopped, config, api, console, announce)
        finally:
            clear_running(home, os.getpid())
    console.print("the node left its run; its database is closed")
    # Ctrl-C: the shell's code for it. SIGTERM (a service manager stopping the node) is a
    # clean stop asked for, not a failure.
    return EXIT_STOPPED if stopped_by == signal.SIGINT else 0


#: Where a node kept its files before each node had a home of its own.
OLD_DATA_DIR = Path(".gwtf")


def warn_of_files_outside_homes(home: Path, console: Console) -> None:
    """A node's database left in ``.gwtf`` by a version without homes holds receipts that may
    still be paid: say how to go on with it rather than start afresh beside it."""
    old = OLD_DATA_DIR / "node.sqlite"
    if old.is_file() and not (home / "node.sqlite").exists() and home != OLD_DATA_DIR:
        console.print(
            f"note: {old} holds a node's receipts from before homes; if they are this node's, "
            f"stop and start it with --home {OLD_DATA_DIR} to go on with them",
            highlight=False,
        )


def report_unclaimed(
    settings: Settings,
    contracts: Contracts,
    run_id: int,
    node: str,
    console: Console,
    node_name: str,
) -> None:
    """What this node worked for in earlier runs of it and was not paid yet, with until when it
    can be claimed: a node stopped mid-epoch keeps its receipts, and only a running node claims.
    Best effort: what cannot be read now is said, and the node starts all the same."""
    from gwtf.node.cli.earnings import unclaimed_report

    try:
        lines = unclaimed_report(settings, contracts, run_id, node, settings.db.url)
    except GwtfError as exc:
        log.warning("could not check for unclaimed work: %s", exc)
        return
    if not lines:
        return
    console.print(f"unclaimed work of node {node} in run {run_id}:", highlight=False)
    for line in lines:
        console.print(f"  {line}", highlight=False)
    console.print(
        "  the node claims each epoch by itself once it settles, while it runs"
        if settings.chain.auto_claim
        else f"  claim it while the node runs: gwtf-node claim --node-name {node_name}",
        highlight=False,
    )


def check_the_chain(
    contracts: Contracts, chain_id: int, run_id: int, node: str, wallet: str, settings: Settings
) -> tuple[str, RunInfo]:
    """The node's role in ``run_id`` ("data" or "relay") and the run, or a ``ConfigError``
    saying why the node cannot take part."""
    from gwtf.node.chain.actions import RunModel, check_run_dataset

    if contracts.w3.eth.chain_id != chain_id:
        raise ChainError(
            f"the chain at the RPC URL has chain id {contracts.w3.eth.chain_id}, the devnet "
            f"file's contracts are on {chain_id}: point --rpc-url and --devnet-file at one chain"
        )
    port = contracts.port()
    run = port.run_info(run_id)
    if run is None:
        raise ConfigError(f"there is no run {run_id} on this chain; see `gwtf-node runs list`")
    if run.closed:
        raise ConfigError(f"run {run_id} is closed; choose an open one from `gwtf-node runs list`")
    ours = RunModel.of(settings.training, run.stage_count)
    if ours.config_hash != run.model_config_hash:
        raise ConfigError(
            f"run {run_id} trains another model than this node's ({ours.describe()}); set "
            "training.model, vocab_size (or data), seq_len, batch_size, seed and wire_dtype to the "
            "run's"
        )
    registered = port.node_info(node)
    if registered is None:
        raise ConfigError(f"node {node} is not registered; run `gwtf-node register` first")
    if registered.operator.lower() != wallet.lower():
        raise ConfigError(
            f"node {node} is registered to wallet {registered.operator}, not to {wallet}: start "
            "it with the wallet that registered it"
        )
    if not registered.active:
        raise ConfigError(
            f"node {node} is not active (unbonding or slashed); see `gwtf-node status`"
        )
    if registered.stake_wei < run.min_stake_wei:
        raise ConfigError(
            f"node {node} stakes {registered.stake_wei} wei, under run {run_id}'s minimum of "
            f"{run.min_stake_wei}; add stake with `gwtf-node stake add`"
        )
    now = int(contracts.w3.eth.get_block("latest")["timestamp"])
    if contracts.ledger.functions.wasDataNodeBefore(run_id, node, now + 1).call():
        check_run_dataset(run_id, run.dataset_hash, settings.training.data)
        return "data", run
    if not contracts.ledger.functions.isAdmitted(run_id, node).call():
        raise ConfigError(
            f"node {node} is not in run {run_id}; join it with `gwtf-node join --run {run_id}`"
        )
    return "relay", run


def start_settings(
    args: argparse.Namespace,
    settings: Settings,
    role: str,
    key_file: Path,
    run: RunInfo,
) -> Settings:
    """The node's settings for this run: the run's facts over the user's file and flags."""
    if role == "relay" and not (args.bootstrap or settings.p2p.bootstrap_peers):
        raise ConfigError(
            "a relay needs a peer to find the run through: pass --bootstrap "
            "/ip4/HOST/tcp/PORT/p2p/PEER_ID (a data node's address, printed when it starts)"
        )
    home = home_of(settings, args.home, args.node_name)
    overrides: dict[str, Any] = {
        "node.role": role,
        "node.stage": 0 if role == "data" else settings.node.stage,
        "node.key_file": str(key_file),
        "node.data_dir": str(home),
        "chain.run_id": args.run,
        "chain.admission": True,
        "chain.receipts": True,
        "chain.wallet_file": str(args.wallet),
        "training.stages": run.stage_count,
        "api.port": args.api_port,
        # What the node keeps goes in its home, unless a setting puts it elsewhere.
        **home_settings(settings, home),
    }
    if args.bootstrap:
        overrides["p2p.bootstrap_peers"] = ",".join(args.bootstrap)
    if args.listen:
        overrides["p2p.listen"] = ",".join(args.listen)
    if args.announce:
        overrides["p2p.announce"] = ",".join(args.announce)
    if args.no_upnp:
        overrides["p2p.upnp"] = "false"
    # The same layers as every command (flags > env > file > defaults), the run's facts on top.
    flags = {"chain.rpc_url": args.rpc_url, "chain.devnet_file": args.devnet_file}
    return load_settings({**flags, **overrides}, config_file=args.config)


_KEY_IN_USE = (
    "another process is running node {}; a node runs once (two would sign two versions of a "
    "hop): stop the other one"
)
_DIR_IN_USE = (
    "another node is using this home; stop it, or give this one its own with --node-name or --home"
)


@contextmanager
def exclusive_lock(path: Path, in_use: str) -> Iterator[None]:
    """Hold the lock file ``path`` for as long as the node runs; another process holding it is
    a ``ConfigError`` saying ``in_use``. The OS drops the lock when the process dies, however
    it dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{in_use} ({path})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)


def local_api(settings: Settings, default_port: bool) -> LocalApi | None:
    """The node's API socket, bound now. The default port is one node's: where another node
    on this machine holds it, this one takes any free port (its home's node.json says which,
    for the commands that talk to it)."""
    from gwtf.node.composition import local_api_from_settings

    try:
        return local_api_from_settings(settings)
    except ConfigError:
        if not (default_port and settings.api.port == Settings().api.port):
            raise
    return local_api_from_settings(replace(settings, api=replace(settings.api, port=0)))


def check_listen_ports(listen: tuple[str, ...]) -> None:
    """Each fixed port of ``listen`` can be bound now (port 0 takes any free one)."""
    from gwtf.node.p2p.addresses import parse_listen

    for text in listen:
        addr = parse_listen(text)
        family = addr.protocols()[0].name
        host, port = addr.value_for_protocol(family), int(addr.value_for_protocol("tcp"))
        ip6 = family == "ip6"
        if port == 0:
            continue
        with socket.socket(socket.AF_INET6 if ip6 else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise ConfigError(
                    f"p2p port {port} on {host} cannot be used ({exc.strerror}); stop what holds "
                    "it or pass --listen with a free port"
                ) from exc


async def run_until_stopped(
    config: LiveNodeConfig,
    api: LocalApi | None,
    console: Console,
    announce: Callable[[str], None] = lambda address: None,
) -> int | None:
    """Run the node and its API until SIGINT or SIGTERM, then leave gracefully; the signal that
    stopped it, if one did. ``announce`` is told the node's p2p address once it serves."""
    import trio

    from gwtf.node.local_api.service import run_local_api
    from gwtf.node.local_api.snapshot import SnapshotBox
    from gwtf.node.runtime.live_node import run_live_node

    box = SnapshotBox()
    started: list[LiveNode] = []
    signalled: int | None = None
    async with trio.open_nursery() as nursery:

        def on_started(node: LiveNode) -> None:
            started.append(node)
            announce(node.address)  # before the line: who reads it finds the home's file
            # One line whatever its length: addresses are copied from it (and read by scripts).
            addresses = " ".join(node.book.own.addresses)
            console.print(f"serving on {addresses}", highlight=False, soft_wrap=True)
            if api is not None:
                nursery.start_soon(run_local_api, node, api, box)

        async def stop_on_signal() -> None:
            nonlocal signalled
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for number in signals:
                    signalled = number
                    console.print("leaving: handing flows back to the peers")
                    box.stopping = True
                    if started:
                        flow = started[0].flow
                        flow.dispatch(flow.node.leave(trio.current_time()))
                        await trio.sleep(LEAVE_GRACE_S)
                    nursery.cancel_scope.cancel()
                    return

        said: list[bool | None] = []

        def on_reachability(result: Reachability, line: str) -> None:
            # The first verdict, then each change: "reachable at …" or "behind NAT: running
            # outbound-only through relay …".
            if not said or said[-1] != result.reachable:
                said.append(result.reachable)
                console.print(line, highlight=False, soft_wrap=True)

        nursery.start_soon(stop_on_signal)
        await run_live_node(replace(config, on_reachability=on_reachability), on_started)
        nursery.cancel_scope.cancel()
    if started and started[0].receipts is not None:
        started[0].receipts.cycle.records.db.close()
    return signalled
