"""`gwtf-node`: the volunteer's, sponsor's and auditor's command line.

Every failure a person can cause (bad flag, wrong password, unfunded wallet, unreachable RPC,
missing artifacts, a reverted transaction) is a ``GwtfError``; ``main`` prints it as one line
``gwtf-node: error: <what failed and what to do>`` and exits with its code:

  0 success · 1 other GWTF error · 2 bad setting or usage · 3 chain (unreachable RPC, revert,
  missing/stale artifacts) · 4 wallet (wrong password, missing keystore, unfunded) ·
  5 protocol · 6 training · 7 not built yet · 130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from eth_account import Account
from rich.console import Console
from web3 import Web3

from gwtf.errors import ConfigError, GwtfError
from node.chain import Sender, connect, format_eth
from node.chain_actions import Capacity, Contracts, join_run, register_node, transfer_eth
from node.devnet_file import DevnetInfo, read_devnet_file
from node.settings import Settings, load_settings
from node.wallet import (
    create_wallet,
    load_or_create_node_key,
    node_key_path,
    open_wallet,
    read_keystore_address,
    resolve_password,
)

EXIT_INTERRUPTED = 130
WEI_PER_ETH = 10**18


def eth_amount(text: str) -> int:
    """An ETH amount flag ("2", "0.5") as wei."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount of ETH") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative amount of ETH")
    return int(value * WEI_PER_ETH)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gwtf-node",
        description="Run and manage a GWTF node: devnet, wallets, registration, the demo.",
        epilog=__doc__.split("exits with its code:")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="settings file (default ./gwtf.toml when present)")
    parser.add_argument("--rpc-url", help="chain JSON-RPC URL (default: the devnet file's)")
    parser.add_argument("--devnet-file", help="devnet file to read (default .gwtf/devnet.json)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    devnet = sub.add_parser("devnet", help="start a dev chain with the contracts deployed")
    devnet.add_argument("--host", default="127.0.0.1")
    devnet.add_argument("--port", type=int, default=8545)

    demo = sub.add_parser("demo", help="run the contract lifecycle of one epoch and summarise it")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--on-devnet", action="store_true", help="use the devnet's chain")

    wallet = sub.add_parser("wallet", help="create or inspect an encrypted wallet keystore")
    wallet_sub = wallet.add_subparsers(dest="wallet_command", required=True, metavar="ACTION")
    for name, text in (("new", "create a wallet"), ("address", "print a wallet's address")):
        action = wallet_sub.add_parser(name, help=text)
        action.add_argument("--wallet", required=True, help="keystore path")
        action.add_argument("--password-file", help="file holding the keystore password")

    fund = sub.add_parser("fund", help="send devnet ETH from a dev account to an address")
    fund.add_argument("--to", required=True, help="recipient address")
    fund.add_argument("--eth", type=eth_amount, default=eth_amount("10"), help="amount (ETH)")

    register = sub.add_parser("register", help="register a node with its capacity and a stake")
    _wallet_flags(register)
    register.add_argument("--stake-eth", type=eth_amount, required=True)
    register.add_argument("--gpu-model", default="cpu")
    register.add_argument("--memory-mib", type=int, default=8192)
    register.add_argument("--throughput", type=int, default=60, help="microbatches per hour")
    register.add_argument("--max-in-flight", type=int, default=2)
    register.add_argument("--peer-id", help="libp2p peer id as hex (default: the node's own)")

    join = sub.add_parser("join", help="join a run with a registered node")
    _wallet_flags(join)
    join.add_argument("--run", type=int, required=True, help="run id")

    swarm = sub.add_parser(
        "swarm",
        help="run a local training swarm on its own devnet, one process per node",
        description="Start a devnet (or use [chain] rpc_url), register every node on it, and run "
        "the nodes as processes on loopback with admission on; [chain] enabled = false runs "
        "without a chain. Examples: node/swarm-examples/*.toml.",
    )
    swarm.add_argument("--swarm-file", required=True, help="swarm file (TOML), see node/swarm.py")
    swarm.add_argument("--out", default=".gwtf/swarm", help="folder for logs, states, summary")
    swarm.add_argument("--timeout-s", type=float, default=600.0)

    info = sub.add_parser("info", help="show what the chain knows about a node or a run")
    info.add_argument("--node", help="node address")
    info.add_argument("--run", type=int, help="run id")
    return parser


def _wallet_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wallet", required=True, help="wallet keystore path")
    parser.add_argument("--password-file", help="file holding the keystore password")
    parser.add_argument("--node-name", default="main", help="which of the wallet's nodes")


def load_cli_settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        {"chain.rpc_url": args.rpc_url, "chain.devnet_file": args.devnet_file},
        config_file=args.config,
    )


def open_contracts(settings: Settings) -> tuple[Contracts, DevnetInfo]:
    """Connect to the configured chain and the contracts named in the devnet file."""
    info = read_devnet_file(settings.chain.devnet_file)
    w3 = connect(
        settings.chain.rpc_url or info.rpc_url,
        timeout_s=settings.chain.rpc_timeout_s,
        rpc_token=settings.chain.rpc_token,
    )
    return Contracts.from_devnet(w3, info), info


def cmd_devnet(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from node.devnet import run_devnet

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} is not a TCP port; use 0-65535 (0 = any free)")
    run_devnet(
        args.host, args.port, settings.chain.rpc_url or None, settings.chain.devnet_file, console
    )
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from node.demo import DemoConfig, run_demo

    w3 = None
    if args.on_devnet:
        w3 = connect(settings.chain.rpc_url or read_devnet_file(settings.chain.devnet_file).rpc_url)
    run_demo(w3, DemoConfig(seed=args.seed), console)
    return 0


def cmd_wallet(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    if args.wallet_command == "new":
        password = resolve_password(args.password_file, confirm=True)
        account = create_wallet(args.wallet, password)
        console.print(f"created wallet {account.address} at {args.wallet}")
    else:
        console.print(read_keystore_address(args.wallet))
    return 0


def cmd_fund(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, info = open_contracts(settings)
    if not Web3.is_address(args.to):
        raise ConfigError(f"--to {args.to!r} is not an Ethereum address; pass 0x + 40 hex digits")
    faucet = Sender.unlocked(info.accounts[0].address)
    transfer_eth(contracts.w3, faucet, args.to, args.eth)
    balance = contracts.w3.eth.get_balance(Web3.to_checksum_address(args.to))
    console.print(
        f"sent {format_eth(args.eth)} ETH to {args.to}; it now holds {format_eth(balance)}"
    )
    return 0


def _open_node(args: argparse.Namespace) -> tuple[Sender, bytes]:
    password = resolve_password(args.password_file)
    wallet = open_wallet(args.wallet, password)
    node_key = load_or_create_node_key(node_key_path(args.wallet, args.node_name), password)
    return Sender.from_account(wallet), bytes(node_key.key)


def node_peer_id(wallet_path: str, node_name: str) -> bytes:
    """The node's libp2p peer id, from its persisted Ed25519 identity next to the wallet."""
    from node.p2p.identity import load_or_create_identity, peer_id_of

    key_path = node_key_path(wallet_path, node_name)
    identity = load_or_create_identity(key_path.with_name(key_path.stem + ".p2p.key"))
    return bytes(peer_id_of(identity).to_bytes())


def cmd_register(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    wallet, node_key = _open_node(args)
    node_address = Account.from_key(node_key).address
    if args.peer_id:
        try:
            peer_id = bytes.fromhex(args.peer_id.removeprefix("0x"))
        except ValueError:
            raise ConfigError(
                f"--peer-id {args.peer_id!r} is not hex; pass the id's bytes"
            ) from None
    else:
        peer_id = node_peer_id(args.wallet, args.node_name)
    capacity = Capacity(args.gpu_model, args.memory_mib, args.throughput, args.max_in_flight)
    receipt = register_node(contracts, wallet, node_key, peer_id, capacity, args.stake_eth)
    console.print(
        f"registered node {node_address} (peer id {peer_id.hex()}) for wallet {wallet.address} "
        f"with {format_eth(args.stake_eth)} ETH stake; gas used {receipt['gasUsed']:,}"
    )
    return 0


def cmd_join(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    wallet, node_key = _open_node(args)
    node_address = Account.from_key(node_key).address
    receipt = join_run(contracts, wallet, args.run, node_address)
    console.print(f"node {node_address} joined run {args.run}; gas used {receipt['gasUsed']:,}")
    return 0


def cmd_info(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    if args.node is None and args.run is None:
        raise ConfigError("say what to show: --node ADDRESS and/or --run ID")
    contracts, _ = open_contracts(settings)
    port = contracts.port()
    if args.node is not None:
        node = port.node_info(args.node)
        console.print(node if node else f"no node {args.node} is registered")
    if args.run is not None:
        run = port.run_info(args.run)
        console.print(run if run else f"there is no run {args.run}")
    return 0


def cmd_swarm(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from pathlib import Path

    from node.swarm import run_swarm
    from node.swarm_plan import plan_from_file

    plan = plan_from_file(Path(args.swarm_file), Path(args.out))
    log = (plan.out_dir / "swarm.log").open("wb")
    console.print(f"swarm: logs in {plan.out_dir / 'swarm.log'}")
    with log:
        summary = run_swarm(plan, log, args.timeout_s)
    console.print_json(data=summary)
    return 0


COMMANDS = {
    "swarm": cmd_swarm,
    "devnet": cmd_devnet,
    "demo": cmd_demo,
    "wallet": cmd_wallet,
    "fund": cmd_fund,
    "register": cmd_register,
    "join": cmd_join,
    "info": cmd_info,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gwtf-node` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    # Wide enough for the tables when piped (rich assumes 80 columns without a terminal).
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        settings = load_cli_settings(args)
        return COMMANDS[args.command](args, settings, console)
    except GwtfError as err:
        message = " ".join(str(err).split())  # one line, always
        print(f"gwtf-node: error: {message}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("gwtf-node: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
