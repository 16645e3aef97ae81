"""``gwtf-node register|join|info``: a wallet's nodes on chain, their stake and their runs.

A node is one key (``<wallet>.node-<name>.json``, the wallet's password): its address is the
node on chain and it is the node's libp2p identity, so registering binds both at once.
"""

from __future__ import annotations

import argparse

from eth_account import Account
from rich.console import Console

from gwtf.errors import ConfigError
from node.chain.actions import Capacity, join_run, register_node
from node.chain.adapter import format_eth
from node.cli.args import Command, add_wallet_flags, eth_amount, open_node
from node.composition import open_contracts
from node.p2p.identity import identity_from_key, peer_id_of
from node.settings import Settings


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    register = sub.add_parser("register", help="register a node with its capacity and a stake")
    add_wallet_flags(register)
    register.add_argument("--stake-eth", type=eth_amount, required=True)
    register.add_argument("--gpu-model", default="cpu")
    register.add_argument("--memory-mib", type=int, default=8192)
    register.add_argument("--throughput", type=int, default=60, help="microbatches per hour")
    register.add_argument("--max-in-flight", type=int, default=2)

    join = sub.add_parser("join", help="join a run with a registered node")
    add_wallet_flags(join)
    join.add_argument("--run", type=int, required=True, help="run id")

    info = sub.add_parser("info", help="show what the chain knows about a node or a run")
    info.add_argument("--node", help="node address")
    info.add_argument("--run", type=int, help="run id")
    return {"register": cmd_register, "join": cmd_join, "info": cmd_info}


def cmd_register(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args)
    node_address = Account.from_key(node_key).address
    peer_id = peer_id_of(identity_from_key(node_key)).to_base58()
    capacity = Capacity(args.gpu_model, args.memory_mib, args.throughput, args.max_in_flight)
    receipt = register_node(contracts, wallet, node_key, capacity, args.stake_eth)
    console.print(
        f"registered node {node_address} (peer id {peer_id}) for wallet {wallet.address} "
        f"with {format_eth(args.stake_eth)} ETH stake; gas used {receipt['gasUsed']:,}"
    )
    return 0


def cmd_join(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args)
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
