"""``gwtf-node earnings|receipts|claim``: what a node did and earned, and getting paid.

Each speaks for one node, found by its home (``gwtf.node.home``: ``--home``, or ``.gwtf/nodes/NAME``
of ``--node-name``) and says which. ``earnings`` and ``receipts`` ask the node's API while it
runs (an answer at once) and otherwise read its database in the home beside the chain, so they
work whether or not the node is running. ``claim`` asks the running node to claim now (a running
node claims every settled epoch by itself; this one forces a retry), through its API with the
token in its home.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gwtf.errors import ConfigError, GwtfError, NodeNotRunning
from gwtf.node.cli.args import Command, add_home_flags, address, node_home, port, positive, whole
from gwtf.node.cli.output import emit, fields, table
from gwtf.node.home import RunningNode, home_settings, last_run, speaking_for
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console

    from gwtf.api.schemas import Earnings
    from gwtf.node.chain.actions import Contracts
    from gwtf.node.store.database import Database


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    earnings = sub.add_parser("earnings", help="a node's earnings per epoch (database + chain)")
    _node_flags(earnings)
    receipts = sub.add_parser("receipts", help="the receipts a node signed and countersigned")
    _node_flags(receipts)
    receipts.add_argument("--epoch", type=whole, help="only this epoch")
    receipts.add_argument("--limit", type=positive, default=20, help="how many, newest first")
    receipts.add_argument("--offset", type=whole, default=0)
    claim = sub.add_parser("claim", help="have the running node claim its settled epochs now")
    which = claim.add_mutually_exclusive_group()
    which.add_argument("--epoch", type=whole, help="claim this epoch")
    which.add_argument("--all", action="store_true", help="claim every settled epoch (default)")
    add_home_flags(claim)
    claim.add_argument(
        "--api-port", type=port, help="the running node's API port (default: its home's)"
    )
    return {"earnings": cmd_earnings, "receipts": cmd_receipts, "claim": cmd_claim}


def _node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run", type=whole, help="run id (default the running node's, or chain.run_id)"
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--wallet", help="the wallet whose node to show (its key names it)")
    who.add_argument("--node", type=address, help="the node's address")
    add_home_flags(parser)
    parser.add_argument("--db-url", help="the node's database (default: the one in its home)")


def cmd_earnings(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.api.schemas import Earnings

    home, running = node_home(args, settings)
    node = _node_of(args, settings, running)
    run_id = run_of(args, settings, home)
    if _ask_running(args, running, node, run_id):
        assert running is not None
        earned = Earnings.model_validate(_call(running, "/v1/earnings"))
    else:
        earned = earnings_in(_db_url(args, settings, home), settings, run_id, node)
    columns = ["epoch", "phase", "units", "certified", "missed", "challenged", "pending ETH",
               "claimable ETH", "claimed ETH", "chain says ETH"]  # fmt: skip
    rows = [
        [e.epoch, e.phase, e.units_worked, e.units_certified, e.units_missed or None,
         e.units_challenged, e.pending.eth, e.claimable.eth, e.claimed.eth,
         e.chain_claimed.eth if e.chain_claimed else None]
        for e in earned.epochs
    ]  # fmt: skip

    def render(c: Console) -> None:
        c.print(speaking_for(node, home, running), highlight=False)
        c.print(table(f"earnings of node {node} in run {run_id}", columns, rows, right_from=2))
        for e in earned.epochs:
            if e.missed:
                c.print(f"epoch {e.epoch}: {e.units_missed} units missed: {e.missed}")
        c.print(
            f"claimed {earned.total_claimed.eth} ETH; claimable {earned.total_claimable.eth} "
            f"ETH; pending {earned.total_pending.eth} ETH"
        )
        for hold in earned.stake_holds:
            c.print(hold.detail, highlight=False)

    return emit(args, console, earned, render)


def earnings_in(
    db_url: str, settings: Settings, run_id: int, node: str, contracts: Contracts | None = None
) -> Earnings:
    """``node``'s earnings in ``run_id`` by its database at ``db_url`` and the chain."""
    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.chain.epochs import EpochLedger
    from gwtf.node.local_api.snapshot import SnapshotBox
    from gwtf.node.local_api.views import NodeViews
    from gwtf.node.local_api.watcher import ChainReader
    from gwtf.node.store.views import NodeRecords

    db = _open(db_url)
    try:
        if contracts is None:
            contracts, _ = open_contracts(settings)
        records = NodeRecords(db)
        chain = ChainReader(contracts, EpochLedger(contracts, run_id, None), records, node).read()
        return NodeViews(SnapshotBox(chain=chain), records, run_id, node).earnings()
    finally:
        db.close()


def cmd_receipts(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.api.schemas import ReceiptPage

    home, running = node_home(args, settings)
    node = _node_of(args, settings, running)
    run_id = run_of(args, settings, home)
    if not 1 <= args.limit <= 500 or args.offset < 0:
        raise ConfigError("--limit must be 1..500 and --offset 0 or more")
    if _ask_running(args, running, node, run_id):
        assert running is not None
        query = f"/v1/receipts?offset={args.offset}&limit={args.limit}"
        query += "" if args.epoch is None else f"&epoch={args.epoch}"
        page = ReceiptPage.model_validate(_call(running, query))
    else:
        from gwtf.node.local_api.snapshot import SnapshotBox
        from gwtf.node.local_api.views import NodeViews
        from gwtf.node.store.views import NodeRecords

        db = _open(_db_url(args, settings, home))
        try:
            page = NodeViews(SnapshotBox(), NodeRecords(db), run_id, node).receipts(
                args.offset, args.limit, args.epoch
            )
        finally:
            db.close()
    columns = ["epoch", "iteration", "microbatch", "stage", "direction", "attempt", "as",
               "peer", "units", "countersigned"]  # fmt: skip
    rows = [
        [r.epoch, r.iteration, r.microbatch_id, r.stage, r.direction, r.attempt,
         "worker" if r.as_worker else "receiver", r.counterparty if r.as_worker else r.worker,
         r.units, "yes" if r.counterparty_signature else "no"]
        for r in page.items
    ]  # fmt: skip
    title = f"receipts {page.offset + 1}-{page.offset + len(page.items)} of {page.total}"

    def render(c: Console) -> None:
        c.print(speaking_for(node, home, running), highlight=False)
        c.print(table(title, columns, rows, 0))

    return emit(args, console, page, render)


def cmd_claim(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.local_api.client import api_url, call_api
    from gwtf.node.local_api.server import api_token

    home, running = node_home(args, settings)
    if args.api_port is not None:
        url = api_url(settings.api.host, args.api_port)
    elif running is not None and running.api_url:
        url = running.api_url
    elif running is not None:
        raise NodeNotRunning(
            f"the node in {home} is {running.state} and does not serve its API yet; claim once "
            "it serves (it claims each settled epoch by itself then)"
        )
    else:
        raise NodeNotRunning(
            f"no node runs in {home}: start it (`gwtf-node start`), and it claims every settled "
            "epoch by itself; or say which node with --node-name or --home"
        )
    token_file = Path(home_settings(settings, home).get("api.token_file", settings.api.token_file))
    if not token_file.is_file():
        raise ConfigError(
            f"no API token at {token_file}: run this where the node runs, with its --home or "
            "--node-name (or its api.token_file)"
        )
    token = api_token(token_file)
    result = call_api(url, "/v1/claim", {"epoch": args.epoch}, token=token, timeout_s=300)
    claims = result["claims"]

    def render(c: Console) -> None:
        c.print(f"node in {home}, API {url}", highlight=False)
        if not result["asked"]:
            c.print("nothing to claim")
        elif not claims:
            epochs = ", ".join(map(str, result["asked"]))
            c.print(
                f"epochs {epochs}: not claimed yet (the chain or the data node did not answer "
                "in time); the node tries again by itself: see `gwtf-node earnings`"
            )
        for claim in claims:
            c.print(
                fields(
                    f"epoch claim from {claim['data_node']}",
                    {
                        "status": claim["status"],
                        "units": claim["units"],
                        "paid ETH": claim["amount"]["eth"],
                        "error": claim["error"] or "",
                    },
                )
            )

    return emit(args, console, result, render)


def unclaimed_report(
    settings: Settings, contracts: Contracts, run_id: int, node: str, db_url: str
) -> list[str]:
    """``unclaimed_work`` of ``node`` by its database at ``db_url`` (none: nothing done yet)."""
    from gwtf.node.chain.epochs import EpochLedger

    if db_url.startswith("sqlite:///") and not Path(db_url.removeprefix("sqlite:///")).is_file():
        return []
    epochs = EpochLedger(contracts, run_id, None)
    earned = earnings_in(db_url, settings, run_id, node, contracts)
    period_s = int(contracts.ledger.functions.CLAIM_PERIOD_S().call())
    return unclaimed_work(earned, lambda e: epochs.epoch_times(e).settles_at, period_s)


def unclaimed_work(
    earned: Earnings, settles_at: Callable[[int], int], claim_period_s: int
) -> list[str]:
    """A line per epoch in which the node worked and was not yet paid in full: what it can
    claim, from when and until when (its owner must have the node claim it by then)."""
    lines = []
    for e in earned.epochs:
        if e.phase in ("closed", "missed") or not (e.units_worked or int(e.claimable.wei)):
            continue
        if int(e.claimed.wei) and not int(e.claimable.wei):
            continue
        opens = settles_at(e.epoch)
        what = (
            f"{e.claimable.eth} ETH claimable" if int(e.claimable.wei)
            else f"{e.units_worked} units of work, {e.pending.eth} ETH expected"
        )  # fmt: skip
        lines.append(
            f"epoch {e.epoch}: {what}; claimable from {when(opens)} until "
            f"{when(opens + claim_period_s)}"
        )
    return lines


def when(unix_s: int) -> str:
    """A chain time for a person: UTC, to the minute."""
    import datetime

    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def run_of(args: argparse.Namespace, settings: Settings, home: Path) -> int:
    """The run a command is about: ``--run``, else ``chain.run_id``, else the home node's."""
    run_id = args.run if args.run is not None else settings.chain.run_id
    if run_id < 1:
        run_id = last_run(home) or 0
    if run_id < 1:
        raise ConfigError("say which run: --run ID (or chain.run_id in gwtf.toml)")
    return int(run_id)


def _node_of(args: argparse.Namespace, settings: Settings, running: RunningNode | None) -> str:
    """The node's address: given, read (no password needed) from its key's keystore, or the
    one running in the home."""
    from gwtf.node.chain.wallet import node_key_path, read_keystore_address

    if args.node:
        return str(args.node)  # checksummed by its flag's type
    if args.wallet:
        key = node_key_path(args.wallet, args.node_name)
    elif running is not None:
        return running.node
    else:
        key = Path(settings.node.key_file)
    if not Path(key).is_file():
        raise ConfigError(f"no node key at {key}: register the node first, or pass --node")
    return read_keystore_address(key)


def _ask_running(
    args: argparse.Namespace, running: RunningNode | None, node: str, run_id: int
) -> bool:
    """Whether the node running in the home answers for ``node`` in ``run_id``: its API then
    shows what its database and the chain would."""
    if running is None or not running.api_url or args.db_url:
        return False
    if running.node.lower() != node.lower():
        raise ConfigError(
            f"the node running in this home is {running.node}, not {node}: check --home, "
            "--node-name or --node"
        )
    return running.run_id == run_id


def _call(running: RunningNode, path: str) -> Any:
    from gwtf.node.local_api.client import call_api

    return call_api(running.api_url, path, timeout_s=30)


def _db_url(args: argparse.Namespace, settings: Settings, home: Path) -> str:
    return str(args.db_url or home_settings(settings, home).get("db.url", settings.db.url))


def _open(url: str) -> Database:
    from gwtf.node.store.database import open_database

    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.is_file():
            raise GwtfError(
                f"no node database at {path}: a node keeps its receipts there once started; "
                "pass --db-url (db.url) if it is elsewhere"
            )
    return open_database(url, migrate=False)  # a reader changes nothing
