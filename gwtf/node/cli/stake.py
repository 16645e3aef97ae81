"""``gwtf-node stake add|unstake|withdraw``: a registered node's stake, from its wallet.

Unstaking takes the node out of the active set at once and starts the registry's unbonding
delay; ``withdraw`` pays the stake back to the wallet once that is over (the registry says when).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gwtf.node.cli.args import Command, add_wallet_flags, eth_amount, open_node
from gwtf.node.cli.output import emit
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    stake = sub.add_parser("stake", help="add stake to a registered node")
    actions = stake.add_subparsers(dest="stake_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add stake to the wallet's node")
    add_wallet_flags(add)
    add.add_argument("--eth", type=eth_amount, required=True, help="amount to add (ETH)")
    unstake = sub.add_parser("unstake", help="leave the active set and start unbonding")
    add_wallet_flags(unstake)
    withdraw = sub.add_parser("withdraw", help="withdraw the stake once unbonding is over")
    add_wallet_flags(withdraw)
    return {"stake": cmd_stake_add, "unstake": cmd_unstake, "withdraw": cmd_withdraw}


def cmd_stake_add(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from eth_account import Account

    from gwtf.api.schemas import Amount
    from gwtf.node.chain.actions import add_stake, open_contracts
    from gwtf.node.chain.adapter import format_eth

    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args)
    node = Account.from_key(node_key).address
    receipt = add_stake(contracts, wallet, node, args.eth)
    staked = int(contracts.registry.functions.getNode(node).call()[1])
    data = {"node": node, "added": Amount.of(args.eth), "stake": Amount.of(staked),
            "tx_hash": receipt["transactionHash"], "gas_used": receipt["gasUsed"]}  # fmt: skip
    return emit(args, console, data, lambda c: c.print(
        f"added {format_eth(args.eth)} ETH to node {node}: it stakes {format_eth(staked)} ETH"
    ))  # fmt: skip


def cmd_unstake(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from eth_account import Account

    from gwtf.node.chain.actions import open_contracts, request_unstake

    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args)
    node = Account.from_key(node_key).address
    receipt = request_unstake(contracts, wallet, node)
    unlock_at = int(contracts.registry.functions.unlockAt(node).call())
    data = {"node": node, "unlock_at": unlock_at, "tx_hash": receipt["transactionHash"]}
    return emit(args, console, data, lambda c: c.print(
        f"node {node} left the active set; its stake unlocks at unix time {unlock_at}: then "
        "`gwtf-node withdraw`"
    ))  # fmt: skip


def cmd_withdraw(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from eth_account import Account

    from gwtf.api.schemas import Amount
    from gwtf.node.chain.actions import open_contracts, withdraw_stake
    from gwtf.node.chain.adapter import format_eth
    from gwtf.node.chain.holds import thaw_before_withdrawal

    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args)
    node = Account.from_key(node_key).address
    # A dispute no jury sat on holds the stake until its grace ends, and then until someone
    # releases it: the node does so itself, and says what still holds it.
    thaw_before_withdrawal(contracts, wallet, node)
    receipt = withdraw_stake(contracts, wallet, node)
    (event,) = contracts.registry.events.StakeWithdrawn().process_receipt(receipt)
    amount = int(event["args"]["amountWei"])
    data = {"node": node, "withdrawn": Amount.of(amount), "to": wallet.address,
            "tx_hash": receipt["transactionHash"]}  # fmt: skip
    return emit(args, console, data, lambda c: c.print(
        f"withdrew {format_eth(amount)} ETH of node {node}'s stake to {wallet.address}"
    ))  # fmt: skip
