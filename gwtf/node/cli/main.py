"""`gwtf-node`: the volunteer's, sponsor's and auditor's command line.

Every failure a person can cause (bad flag, wrong password, unfunded wallet, unreachable RPC,
missing artifacts, a reverted transaction) is a ``GwtfError``; ``main`` prints it as one line
``gwtf-node: error: <what failed and what to do>`` and exits with its code:

  0 success · 1 other GWTF error · 2 bad setting or usage · 3 chain (unreachable RPC, revert,
  missing/stale artifacts) · 4 wallet (wrong password, missing keystore, unfunded) ·
  5 protocol · 6 training · 7 not built yet · 8 no node running here (the local API does
  not answer) · 10 the audit found something against a node · 11 the audit proved nothing
  but could not check everything (its findings accuse nobody) · 130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gwtf.errors import GwtfError
from gwtf.node.cli import audit, data, earnings, export, local, nodes, runs, stake, start, wallet
from gwtf.node.cli.args import Command
from gwtf.node.cli.output import add_json_flags
from gwtf.node.settings import Settings, load_settings

EXIT_INTERRUPTED = 130
#: The command families, in the order ``--help`` lists them.
FAMILIES = (local, wallet, nodes, start, stake, earnings, runs, data, audit, export)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The parser with every family's commands, and the command each name runs."""
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
    commands: dict[str, Command] = {}
    for family in FAMILIES:
        commands.update(family.add_commands(sub))
    add_json_flags(parser)
    return parser, commands


def load_cli_settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        {"chain.rpc_url": args.rpc_url, "chain.devnet_file": args.devnet_file},
        config_file=args.config,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gwtf-node` console script; returns the process exit code."""
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    from rich.console import Console  # after parsing: --help and usage errors never need it

    # Wide enough for the tables when piped (rich assumes 80 columns without a terminal).
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        settings = load_cli_settings(args)
        return commands[args.command](args, settings, console)
    except GwtfError as err:
        return _report(err)
    except BaseExceptionGroup as group:
        # A GwtfError raised inside a libp2p host's nursery arrives wrapped in a group.
        errors = _leaves(group)
        if errors and all(isinstance(e, GwtfError) for e in errors):
            return _report(errors[0])  # type: ignore[arg-type]
        raise
    except KeyboardInterrupt:
        print("gwtf-node: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _report(err: GwtfError) -> int:
    message = " ".join(str(err).split())  # one line, always
    print(f"gwtf-node: error: {message}", file=sys.stderr)
    return err.exit_code


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    leaves: list[BaseException] = []
    for error in group.exceptions:
        leaves += _leaves(error) if isinstance(error, BaseExceptionGroup) else [error]
    return leaves


if __name__ == "__main__":
    sys.exit(main())
