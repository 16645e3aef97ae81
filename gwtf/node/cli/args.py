"""What several command families share: the command signature, typed flags (amounts, counts,
ports, addresses), a wallet's node.

The command modules import only the standard library and this project's light modules at the
top: web3, torch, libp2p and rich load inside the command that needs them, so that
``gwtf-node --help`` and the read-only commands answer at once (``bench/cli.py``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from gwtf.errors import ConfigError
from gwtf.node.home import DEFAULT_NODE_NAME, RunningNode, home_of, read_running

if TYPE_CHECKING:  # loaded by the commands that use them, so that --help stays fast
    from pathlib import Path

    from rich.console import Console

    from gwtf.node.chain.adapter import Sender
    from gwtf.node.settings import Settings

#: A command: parsed flags, the loaded settings and the console in; the exit code out.
Command = Callable[[argparse.Namespace, "Settings", "Console"], int]

WEI_PER_ETH = 10**18
#: The smallest of the contracts' amount fields (RunConfig.minStakeWei) holds less than this.
MAX_WEI = 2**96


def eth_amount(text: str) -> int:
    """An ETH amount flag ("2", "0.5") as wei."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount of ETH") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative amount of ETH")
    wei = int(value * WEI_PER_ETH)
    if wei >= MAX_WEI:
        raise argparse.ArgumentTypeError(f"{text} ETH is more than the contracts hold; give less")
    return wei


#: Numbers the chain and the node database both hold (64-bit columns are signed).
MAX_WHOLE = 2**63 - 1


def up_to(high: int, what: str) -> Callable[[str], int]:
    """A flag of a contract field that holds 1 .. ``high`` (a uint16 of stages, say): a value
    the field cannot hold is a usage error, not a failed transaction."""

    def parse(text: str) -> int:
        return _bounded(text, 1, high, what)

    parse.__name__ = what.split()[0]  # argparse names the type in its error
    return parse


#: Fields of RunBook.RunConfig and NodeRegistry.Capacity.
stage_count = up_to(2**16 - 1, "stages 1..65535")
seconds = up_to(2**32 - 1, "seconds 1..4294967295")
per_hour = up_to(2**32 - 1, "a count 1..4294967295")
in_flight = up_to(2**16 - 1, "microbatches 1..65535")


def whole(text: str) -> int:
    """A count, id or epoch flag: a whole number 0 .. 2**63 - 1."""
    return _bounded(text, 0, MAX_WHOLE, "a whole number (0 or more)")


def positive(text: str) -> int:
    """A size flag (stages, seconds, microbatches): 1 .. 2**63 - 1."""
    return _bounded(text, 1, MAX_WHOLE, "a whole number of 1 or more")


def port(text: str) -> int:
    """A TCP port flag; 0 lets the system pick one."""
    return _bounded(text, 0, 65535, "a port number 0..65535 (0: any free port)")


def address(text: str) -> str:
    """An Ethereum address flag, checksummed."""
    from eth_utils.address import is_address, to_checksum_address

    if not is_address(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an address (0x and 40 hex digits)")
    return to_checksum_address(text)


def _bounded(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text} is out of range: give {what}")
    return value


def add_wallet_flags(parser: argparse.ArgumentParser) -> None:
    """``--wallet``, ``--password-file``, ``--node-name``: which wallet, and which of its nodes."""
    parser.add_argument("--wallet", required=True, help="wallet keystore path")
    parser.add_argument("--password-file", help="file holding the keystore password")
    _node_name_flag(parser)


def add_home_flags(parser: argparse.ArgumentParser) -> None:
    """``--node-name`` and ``--home``: which node on this machine a command speaks for."""
    _node_name_flag(parser)
    parser.add_argument("--home", help="the node's home (default .gwtf/nodes/NODE_NAME)")


def _node_name_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name", default=DEFAULT_NODE_NAME,
        help="which of the wallet's nodes; its home is .gwtf/nodes/NAME "
        f"(default {DEFAULT_NODE_NAME})",
    )  # fmt: skip


def node_home(args: argparse.Namespace, settings: Settings) -> tuple[Path, RunningNode | None]:
    """The home of the node a command speaks for, and the node running there (None if none)."""
    home = home_of(settings, getattr(args, "home", None), args.node_name)
    return home, read_running(home)


def open_node(args: argparse.Namespace, *, create: bool = False) -> tuple[Sender, bytes]:
    """The wallet as a sender, and its node's signing key (made when ``create``: registering).
    A node that was never made is a ``ConfigError``, so a mistyped --node-name makes nothing."""
    from gwtf.node.chain.adapter import Sender
    from gwtf.node.chain.wallet import (
        load_or_create_node_key,
        node_key_path,
        open_wallet,
        resolve_password,
    )

    password = resolve_password(args.password_file)
    wallet = open_wallet(args.wallet, password)
    path = node_key_path(args.wallet, args.node_name)
    if not create and not path.is_file():
        raise ConfigError(
            f"wallet {args.wallet} has no node {args.node_name!r} (no {path}); register it first "
            "with `gwtf-node register`, or check --node-name"
        )
    node_key = load_or_create_node_key(path, password)
    return Sender.from_account(wallet), bytes(node_key.key)
