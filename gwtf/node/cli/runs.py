"""``gwtf-node runs list|open|fund|add-data-node|close|refund``: training runs on chain.

A sponsor opens a run (its model, stages, epoch length, reward per epoch, challenge window and
minimum stake) with its first funding, tops it up, names its data nodes, closes it, and takes back
what no epoch will pay once the last epoch's claims are over.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from gwtf.errors import ConfigError
from gwtf.node.cli.args import Command, address, eth_amount, positive, seconds, stage_count, whole
from gwtf.node.cli.output import emit, table
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console

    from gwtf.node.chain.actions import RunModel
    from gwtf.node.chain.adapter import RunInfo


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    runs = sub.add_parser("runs", help="list, open, fund, close and refund training runs")
    actions = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the latest runs on chain")
    listing.add_argument("--limit", type=positive, default=50, help="how many, newest first")
    opening = actions.add_parser("open", help="open and fund a run (the sponsor)")
    _sponsor_flags(opening)
    opening.add_argument("--model", default="gpt-tiny", help="the run's model, e.g. gpt-tiny")
    opening.add_argument("--stages", type=stage_count, required=True, help="pipeline stages")
    opening.add_argument(
        "--seq-len", type=positive, help="tokens per sequence (default: training.seq_len)"
    )
    opening.add_argument(
        "--batch-size",
        type=positive,
        help="sequences per microbatch (default: training.batch_size)",
    )
    opening.add_argument("--seed", type=whole, help="the run's seed (default: training.seed)")
    opening.add_argument(
        "--wire-dtype", choices=("param", "bfloat16", "float16"),
        help="what activations and gradients travel as: param (exact) or a half dtype, half the "
        "bytes (default: training.wire_dtype)",
    )  # fmt: skip
    opening.add_argument(
        "--data", help="the run's data set (`data prepare`'s manifest.json or folder); its hash "
        "is the run's data set hash (default: the shipped Tiny Shakespeare text)",
    )  # fmt: skip
    opening.add_argument(
        "--epoch-length-s", type=seconds, default=3600,
        help="how long an epoch lasts, up to 30 days (default 3600); shorter epochs pay sooner "
        "and cost more certificates",
    )  # fmt: skip
    opening.add_argument(
        "--challenge-window-s", type=seconds, default=3600,
        help="time to audit an epoch before it settles, at least 600 (default 3600): "
        "an epoch's rewards are claimable 2 epochs plus this after it starts",
    )  # fmt: skip
    opening.add_argument("--units-per-hop", type=positive, default=10)
    opening.add_argument(
        "--reward-per-epoch-eth", type=eth_amount, required=True,
        help="the most one epoch's certificates may reserve",
    )  # fmt: skip
    opening.add_argument(
        "--hop-price-eth", type=eth_amount, required=True,
        help="what each certified forward hop earns (a backward hop twice as much); a "
        "certificate is accepted only if the run's funds cover every hop at this price",
    )  # fmt: skip
    opening.add_argument("--min-stake-eth", type=eth_amount, required=True)
    opening.add_argument("--fund-eth", type=eth_amount, required=True, help="first funding")
    sponsor_actions = {
        "fund": "add funds to a run",
        "close": "close a run (the sponsor)",
        "refund": "withdraw a closed run's unspent funds (the sponsor)",
    }
    for name, text in sponsor_actions.items():
        action = actions.add_parser(name, help=text)
        _sponsor_flags(action)
        action.add_argument("--run", type=whole, required=True, help="run id")
        if name == "fund":
            action.add_argument("--eth", type=eth_amount, required=True, help="amount (ETH)")
    data_node = actions.add_parser("add-data-node", help="name one of the sponsor's nodes")
    _sponsor_flags(data_node)
    data_node.add_argument("--run", type=whole, required=True, help="run id")
    data_node.add_argument("--node", type=address, required=True, help="the data node's address")
    return {"runs": cmd_runs}


def _sponsor_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wallet", required=True, help="the sponsor's wallet keystore")
    parser.add_argument("--password-file", help="file holding the keystore password")


def cmd_runs(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.chain.actions import (
        RunConfig,
        add_data_node,
        close_run,
        dataset_hash_of,
        fund_run,
        model_config_hash,
        open_contracts,
        open_run,
        withdraw_refund,
    )
    from gwtf.node.chain.adapter import Sender, format_eth
    from gwtf.node.chain.wallet import open_wallet, resolve_password
    from gwtf.node.local_api.watcher import run_fields

    contracts, _ = open_contracts(settings)
    if args.runs_command == "list":
        count = int(contracts.ledger.functions.runCount().call())
        port = contracts.port()
        newest = range(count, max(0, count - max(1, args.limit)), -1)
        runs = [run for i in newest if (run := port.run_info(i)) is not None]
        data = [run_fields(run) for run in runs]
        return emit(args, console, data, lambda c: c.print(runs_table(runs)))
    sponsor = Sender.from_account(open_wallet(args.wallet, resolve_password(args.password_file)))
    if args.runs_command == "open":
        run_model = _run_model(args, settings)
        config = RunConfig(
            model_config_hash=model_config_hash(run_model),
            dataset_hash=dataset_hash_of(args.data or ""),
            stage_count=args.stages,
            epoch_length_s=args.epoch_length_s,
            units_per_hop=args.units_per_hop,
            reward_per_epoch_wei=args.reward_per_epoch_eth,
            challenge_window_s=args.challenge_window_s,
            min_stake_wei=args.min_stake_eth,
            hop_price_wei=args.hop_price_eth,
        )
        run_id = open_run(contracts, sponsor, config, args.fund_eth)
        first = 2 * args.epoch_length_s + args.challenge_window_s
        done = (
            f"opened run {run_id} ({run_model.describe()}); the first epoch's "
            f"rewards are claimable {first // 60} min after it starts"
        )
    elif args.runs_command == "fund":
        run_id = args.run
        fund_run(contracts, sponsor, run_id, args.eth)
        done = f"added {format_eth(args.eth)} ETH to run {run_id}"
    elif args.runs_command == "add-data-node":
        run_id = args.run
        add_data_node(contracts, sponsor, run_id, args.node)
        done = f"named {args.node} a data node of run {run_id}"
    elif args.runs_command == "close":
        run_id = args.run
        close_run(contracts, sponsor, run_id)
        at = int(contracts.ledger.functions.refundableAt(run_id).call())
        done = f"closed run {run_id}; its unspent funds can be refunded from unix time {at}"
    else:
        run_id = args.run
        amount = withdraw_refund(contracts, sponsor, run_id)
        done = f"refunded {format_eth(amount)} ETH of run {run_id} to {sponsor.address}"
    run = contracts.port().run_info(run_id)
    assert run is not None, "the transaction above named an existing run"
    return emit(args, console, run_fields(run), lambda c: c.print(done))


def _run_model(args: argparse.Namespace, settings: Settings) -> RunModel:
    """What the run commits to: ``--model`` in ``--stages``, the vocabulary of ``--data``'s
    tokenizer (the byte tokenizer without it), and the sequence length, batch size and seed
    (``training``'s unless given); refused unless this node can train it."""
    import dataclasses

    from gwtf.node.chain.actions import RunModel
    from gwtf.node.training.errors import ModelConfigError
    from gwtf.node.training.partition import model_for_run

    training = dataclasses.replace(
        settings.training,
        model=args.model,
        stages=args.stages,
        data=args.data or "",
        vocab_size=0,
        seq_len=args.seq_len or settings.training.seq_len,
        batch_size=args.batch_size or settings.training.batch_size,
        seed=settings.training.seed if args.seed is None else args.seed,
        wire_dtype=args.wire_dtype or settings.training.wire_dtype,
    )
    run = RunModel.of(training)
    try:
        model_for_run(run.model, run.seq_len, run.stages, run.vocab_size)
    except ModelConfigError as exc:
        raise ConfigError(f"--model {args.model}: {exc}") from exc
    return run


def runs_table(runs: list[RunInfo]) -> Any:
    from gwtf.node.chain.adapter import format_eth

    columns = ["run", "sponsor", "stages", "epoch s", "reward/epoch ETH", "pool ETH",
               "min stake ETH", "open"]  # fmt: skip
    rows = [
        [r.run_id, r.sponsor, r.stage_count, r.epoch_length_s, format_eth(r.reward_per_epoch_wei),
         format_eth(r.balance_wei), format_eth(r.min_stake_wei), "yes" if not r.closed else "no"]
        for r in runs
    ]  # fmt: skip
    return table("runs", columns, rows, right_from=2)
