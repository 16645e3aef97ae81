"""``gwtf-node wallet new|address``: encrypted wallet keystores."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gwtf.node.cli.args import Command
from gwtf.node.cli.output import emit
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    wallet = sub.add_parser("wallet", help="create or inspect an encrypted wallet keystore")
    actions = wallet.add_subparsers(dest="wallet_command", required=True, metavar="ACTION")
    for name, text in (("new", "create a wallet"), ("address", "print a wallet's address")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--wallet", required=True, help="keystore path")
        action.add_argument("--password-file", help="file holding the keystore password")
    return {"wallet": cmd_wallet}


def cmd_wallet(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.chain.wallet import create_wallet, read_keystore_address, resolve_password

    if args.wallet_command == "new":
        password = resolve_password(args.password_file, confirm=True)
        address = str(create_wallet(args.wallet, password).address)
        done = f"created wallet {address} at {args.wallet}"
    else:
        address = read_keystore_address(args.wallet)
        done = address
    data = {"address": address, "path": str(args.wallet)}
    return emit(args, console, data, lambda c: c.print(done))
