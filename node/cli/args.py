"""What several command families share: the command signature, amount flags, a wallet's node."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from rich.console import Console

from node.chain.adapter import Sender
from node.chain.wallet import load_or_create_node_key, node_key_path, open_wallet, resolve_password
from node.settings import Settings

#: A command: parsed flags, the loaded settings and the console in; the exit code out.
Command = Callable[[argparse.Namespace, Settings, Console], int]

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


def add_wallet_flags(parser: argparse.ArgumentParser) -> None:
    """``--wallet``, ``--password-file``, ``--node-name``: which wallet, and which of its nodes."""
    parser.add_argument("--wallet", required=True, help="wallet keystore path")
    parser.add_argument("--password-file", help="file holding the keystore password")
    parser.add_argument("--node-name", default="main", help="which of the wallet's nodes")


def open_node(args: argparse.Namespace) -> tuple[Sender, bytes]:
    """The wallet as a sender, and its node's signing key (created on first use)."""
    password = resolve_password(args.password_file)
    wallet = open_wallet(args.wallet, password)
    node_key = load_or_create_node_key(node_key_path(args.wallet, args.node_name), password)
    return Sender.from_account(wallet), bytes(node_key.key)
