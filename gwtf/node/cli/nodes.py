"""``gwtf-node register|join|info|status``: a wallet's nodes on chain, their stake and their runs.

A node is one key (``<wallet>.node-<name>.json``, the wallet's password): its address is the
node on chain and it is the node's libp2p identity, so registering binds both at once. Its
capacity is measured by default (``--capacity auto``: the GPU torch sees, and a short benchmark
of the run's model); each flag overrides one figure.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gwtf.errors import ConfigError, GwtfError
from gwtf.node.cli.args import (
    Command,
    add_home_flags,
    add_wallet_flags,
    address,
    eth_amount,
    in_flight,
    node_home,
    open_node,
    per_hour,
    port,
    stage_count,
    whole,
)
from gwtf.node.cli.earnings import when
from gwtf.node.cli.output import emit, fields
from gwtf.node.home import RunningNode, home_settings, last_run, speaking_for
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console

    from gwtf.node.chain.actions import Capacity


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    register = sub.add_parser("register", help="register a node with its capacity and a stake")
    add_wallet_flags(register)
    register.add_argument("--stake-eth", type=eth_amount, required=True)
    register.add_argument(
        "--capacity",
        choices=("auto", "flags"),
        default="auto",
        help="auto (default): detect the GPU and benchmark the model; flags: only the flags",
    )
    register.add_argument("--model", help="the run's model to benchmark (default training.model)")
    register.add_argument(
        "--stages", type=stage_count, help="the run's stages (default training.stages)"
    )
    register.add_argument("--gpu-model", help="overrides the detected GPU name")
    register.add_argument("--memory-mib", type=per_hour, help="overrides the detected memory")
    register.add_argument("--throughput", type=per_hour, help="microbatches per hour (overrides)")
    register.add_argument("--max-in-flight", type=in_flight, help="microbatches held at once")

    join = sub.add_parser("join", help="join a run with a registered node")
    add_wallet_flags(join)
    join.add_argument("--run", type=whole, required=True, help="run id")

    info = sub.add_parser("info", help="show what the chain knows about a node or a run")
    info.add_argument("--node", type=address, help="node address")
    info.add_argument("--run", type=whole, help="run id")

    status = sub.add_parser("status", help="a wallet's node: chain, stake, runs and the live node")
    status.add_argument("--wallet", required=True, help="wallet keystore path")
    add_home_flags(status)
    status.add_argument("--run", type=whole, help="run id (default chain.run_id)")
    status.add_argument(
        "--api-port", type=port, help="the running node's API port (default: its home's)"
    )
    return {"register": cmd_register, "join": cmd_join, "info": cmd_info, "status": cmd_status}


def cmd_register(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from eth_account import Account

    from gwtf.api.schemas import Amount
    from gwtf.node.chain.actions import open_contracts, register_node
    from gwtf.node.chain.adapter import format_eth
    from gwtf.node.p2p.identity import identity_from_key, peer_id_of

    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args, create=True)
    node_address = Account.from_key(node_key).address
    peer_id = peer_id_of(identity_from_key(node_key)).to_base58()
    capacity = capacity_of(args, settings, console)
    receipt = register_node(contracts, wallet, node_key, capacity, args.stake_eth)
    data = {
        "node": node_address, "peer_id": peer_id, "wallet": wallet.address,
        "stake": Amount.of(args.stake_eth), "capacity": capacity_json(capacity),
        "tx_hash": receipt["transactionHash"], "gas_used": receipt["gasUsed"],
    }  # fmt: skip
    return emit(args, console, data, lambda c: c.print(
        f"registered node {node_address} (peer id {peer_id}) for wallet {wallet.address} "
        f"with {format_eth(args.stake_eth)} ETH stake: {capacity.gpu_model}, "
        f"{capacity.memory_mib} MiB, {capacity.microbatches_per_hour} microbatches/h; "
        f"gas used {receipt['gasUsed']:,}"
    ))  # fmt: skip


def capacity_of(args: argparse.Namespace, settings: Settings, console: Console) -> Capacity:
    """The capacity to register: measured (``--capacity auto``) unless every figure is given."""
    from gwtf.node.chain.actions import Capacity

    given = (args.gpu_model, args.memory_mib, args.throughput)
    if args.capacity == "flags" or None not in given:
        if args.capacity == "flags" and None in given:
            raise ConfigError("--capacity flags needs --gpu-model, --memory-mib and --throughput")
        gpu, memory, throughput = given
    else:
        from gwtf.node.training.capacity import measure_capacity

        model = args.model or settings.training.model
        stages = args.stages or settings.training.stages
        measured = measure_capacity(
            model, stages, settings.training, quiet=getattr(args, "json", False)
        )
        gpu = args.gpu_model or measured.gpu_model
        memory = args.memory_mib or measured.memory_mib
        throughput = args.throughput or measured.microbatches_per_hour
    in_flight = args.max_in_flight or settings.node.capacity
    if memory <= 0 or throughput <= 0 or in_flight <= 0 or not gpu:
        raise ConfigError("capacity figures must be positive and the GPU named")
    return Capacity(str(gpu), int(memory), int(throughput), int(in_flight))


def capacity_json(capacity: Capacity) -> dict[str, Any]:
    return {
        "gpu_model": capacity.gpu_model,
        "memory_mib": capacity.memory_mib,
        "microbatches_per_hour": capacity.microbatches_per_hour,
        "max_in_flight": capacity.max_in_flight,
    }


def cmd_join(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from eth_account import Account

    from gwtf.node.chain.actions import join_run, open_contracts

    contracts, _ = open_contracts(settings)
    wallet, node_key = open_node(args)
    node_address = Account.from_key(node_key).address
    receipt = join_run(contracts, wallet, args.run, node_address)
    data = {"node": node_address, "run_id": args.run, "tx_hash": receipt["transactionHash"]}
    return emit(args, console, data, lambda c: c.print(
        f"node {node_address} joined run {args.run}; gas used {receipt['gasUsed']:,}"
    ))  # fmt: skip


def cmd_info(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.local_api.watcher import node_view, run_fields

    if args.node is None and args.run is None:
        raise ConfigError("say what to show: --node ADDRESS and/or --run ID")
    contracts, _ = open_contracts(settings)
    port = contracts.port()
    data: dict[str, Any] = {}
    if args.node is not None:
        view = node_view(contracts, args.node)
        data["node"] = view.model_dump(mode="json") if view is not None else None
    if args.run is not None:
        run = port.run_info(args.run)
        data["run"] = run_fields(run) if run is not None else None

    def render(c: Console) -> None:
        if "node" in data:
            c.print(_fields("node", data["node"]) if data["node"] else f"no node {args.node}")
        if "run" in data:
            c.print(_fields("run", data["run"]) if data["run"] else f"there is no run {args.run}")

    return emit(args, console, data, render)


def cmd_status(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from gwtf.node.chain.wallet import keystore_address, node_key_path

    key = node_key_path(args.wallet, args.node_name)
    if not key.is_file():
        raise ConfigError(f"wallet {args.wallet} has no node {args.node_name!r} yet: register it")
    node_address = keystore_address(key)
    home, running = node_home(args, settings)
    if running is not None and running.node.lower() != node_address:
        raise ConfigError(
            f"the node running in {home} is {running.node}, not {node_address}: check --home "
            "or --node-name"
        )
    # A running node answers for itself (it reads the chain every few seconds): no chain
    # client to load, so status answers at once. Stopped, the chain and the home are read.
    data = _status_of_running(args, running)
    if data is None:
        data = _status_from_chain(args, settings, home, running, key)
    data["home"] = str(home)
    node_shown = data["node"]["node"] if data["node"] else node_address

    def render(c: Console) -> None:
        c.print(speaking_for(node_shown, home, running if data["live"] else None))
        c.print(_fields("wallet", {"address": data["wallet"], "balance": data["balance"]}))
        if data["node"]:
            hidden = ("wallet_balance", "stake_holds")
            c.print(_fields("node", {k: v for k, v in data["node"].items() if k not in hidden}))
            for hold in data["node"].get("stake_holds", []):
                c.print(hold["detail"], highlight=False)
        else:
            c.print(f"node {node_shown} is not registered")
        if "run" in data:
            c.print(_fields("run", data["run"]))
        live = data["live"]
        if live is None:
            c.print(
                f"not running: {data['live_error']}; its home holds "
                f"{data['disk_bytes'] / 1e6:.1f} MB"
            )
            for line in data["unclaimed"]:
                c.print(f"unclaimed: {line}")
            if data["unclaimed"]:
                c.print("start the node again (`gwtf-node start`) to claim it")
        else:
            c.print(_fields(f"live node at {data['api_url']}", _live_fields(live)))

    return emit(args, console, data, render)


def _status_of_running(
    args: argparse.Namespace, running: RunningNode | None
) -> dict[str, Any] | None:
    """What the node running in the home says of itself and of the chain; None if it does
    not answer (or another run or API port was asked for): then the chain is read."""
    from gwtf.node.local_api.client import call_api

    if running is None or not running.api_url or args.api_port is not None:
        return None
    if args.run is not None and args.run != running.run_id:
        return None
    try:
        live = call_api(running.api_url, "/v1/status", timeout_s=5)
        node = call_api(running.api_url, "/v1/node", timeout_s=5)
        runs = call_api(running.api_url, "/v1/runs", timeout_s=5)
    except GwtfError:  # not answering, or not read the chain yet
        return None
    data: dict[str, Any] = {
        "wallet": node["wallet"], "balance": node["wallet_balance"], "node": node,
        "live": live, "api_url": running.api_url, "unclaimed": [],
    }  # fmt: skip
    data["run"] = {"run_id": running.run_id, "member": any(r["member"] for r in runs)}
    return data


def _status_from_chain(
    args: argparse.Namespace,
    settings: Settings,
    home: Path,
    running: RunningNode | None,
    key: Path,
) -> dict[str, Any]:
    from web3 import Web3

    from gwtf.api.schemas import Amount
    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.chain.wallet import read_keystore_address
    from gwtf.node.local_api.client import api_url, call_api
    from gwtf.node.local_api.watcher import node_view

    wallet_address = read_keystore_address(args.wallet)
    node_address = read_keystore_address(key)
    contracts, _ = open_contracts(settings)
    view = node_view(contracts, node_address)
    balance = contracts.w3.eth.get_balance(Web3.to_checksum_address(wallet_address))
    data: dict[str, Any] = {
        "wallet": wallet_address,
        "balance": Amount.of(balance),
        "node": view.model_dump(mode="json") if view is not None else None,
    }
    run_id = args.run if args.run is not None else settings.chain.run_id or last_run(home) or 0
    if run_id:
        ledger = contracts.ledger.functions
        data["run"] = {
            "run_id": run_id,
            "member": bool(ledger.isAdmitted(run_id, node_address).call()),
        }
    if args.api_port is not None:
        url = api_url(settings.api.host, args.api_port)
    else:
        url = running.api_url if running is not None else ""
    data["live"], data["api_url"], data["unclaimed"] = None, url, []
    if not url:
        data["live_error"] = (
            f"the node in {home} is {running.state}" if running else f"no node runs in {home}"
        )
    else:
        try:
            data["live"] = call_api(url, "/v1/status", timeout_s=5)
        except GwtfError as exc:
            data["live_error"] = str(exc)
    if data["live"] is None:
        from gwtf.node.cli.earnings import unclaimed_report
        from gwtf.node.store.disk import disk_usage

        homed = home_settings(settings, home)
        db_url = str(homed.get("db.url", settings.db.url))
        evidence = homed.get("chain.evidence_dir", settings.chain.evidence_dir)
        data["disk_bytes"] = disk_usage(db_url, evidence).total_bytes
        if run_id:
            # Stopped with work unpaid: only a running node claims, so its owner must know.
            data["unclaimed"] = unclaimed_report(settings, contracts, run_id, node_address, db_url)
    return data


def _live_fields(live: dict[str, Any]) -> dict[str, Any]:
    """What ``status`` shows of a running node's ``/v1/status``."""
    shown = ("role", "stage", "iteration", "epoch", "peers_alive", "flows_in", "flows_out",
             "hops_computed", "throughput_hops_per_s")  # fmt: skip
    values = {k: live[k] for k in shown}
    health = live["health"]
    values["health"] = " ".join(filter(None, (health["status"], health["detail"])))
    if live.get("next_claim_at") is not None:
        values["next claim"] = f"{when(live['next_claim_at'])} " + (
            f"(in {live['next_claim_in_s'] // 60} min)" if live["next_claim_in_s"]
            else "(claimable now)"
        )  # fmt: skip
    if live.get("disk") is not None:
        values["disk MB"] = round(live["disk"]["total_bytes"] / 1e6, 1)
    if live.get("reachability"):
        values["reachability"] = live["reachability"]
    if live.get("memory") is not None:
        values["memory"] = memory_line(live["memory"])
    return values


def memory_line(memory: dict[str, Any]) -> str:
    """The part's memory in one line: its total, what makes it up, and the budget it fits."""
    mib = 2**20
    parts = ", ".join(
        f"{name} {memory[key] / mib:,.1f}"
        for name, key in (
            ("weights", "weights_bytes"),
            ("gradients", "gradients_bytes"),
            ("AdamW", "optimizer_bytes"),
            ("activations", "activations_bytes"),
        )
    )
    return (
        f"{memory['total_bytes'] / mib:,.1f} MiB ({parts}; {memory['in_flight']} microbatches "
        f"in flight) of {memory['budget_bytes'] / mib:,.0f} MiB ({memory['budget_source']})"
    )


def _fields(title: str, values: dict[str, Any]) -> Any:
    from gwtf.api.schemas import Amount

    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Amount):
            value = f"{value.eth} ETH"
        if isinstance(value, dict) and set(value) == {"wei", "eth"}:
            value = f"{value['eth']} ETH"
        if isinstance(value, dict):
            for inner, v in value.items():
                flat[f"{key}.{inner}"] = v
            continue
        flat[key] = value
    return fields(title, flat)
