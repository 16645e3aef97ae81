"""`gwtf-node devnet`: a development chain with the GWTF contracts deployed, for many processes.

By default an embedded eth-tester chain is served over JSON-RPC on 127.0.0.1 (see
``node.devnet.rpc``) until Ctrl-C. With ``--rpc-url`` the contracts are deployed on an existing
chain instead (anvil, hardhat, geth --dev) and the command returns. Either way the RPC URL,
contract addresses and funded dev accounts are printed and written to the devnet file that
other commands read (default ``.gwtf/devnet.json``).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from web3 import Web3

from contracts.bindings import deploy_suite
from gwtf.errors import ChainError
from node.chain.adapter import connect, format_eth
from node.chain.deployment import DevAccount, DevnetInfo, write_devnet_file
from node.devnet.rpc import DevnetHttpServer, EthTesterRpc


@dataclass
class RunningDevnet:
    """A devnet that is up: its description, and the server when it is embedded."""

    info: DevnetInfo
    server: DevnetHttpServer | None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def start_embedded_server(host: str, port: int) -> DevnetHttpServer:
    try:
        server = DevnetHttpServer(EthTesterRpc(), host, port)
    except OSError as exc:
        raise ChainError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or stop "
            "the devnet already running there"
        ) from exc
    return server.start_background()


def dev_accounts(w3: Web3, server: DevnetHttpServer | None) -> tuple[DevAccount, ...]:
    """The chain's funded accounts; with their (public test) keys when the devnet is ours."""
    addresses = list(w3.eth.accounts)
    keys = [""] * len(addresses)
    if server is not None:
        keys = ["0x" + key.to_bytes().hex() for key in server.rpc.tester.backend.account_keys]
    return tuple(
        DevAccount(address, key, int(w3.eth.get_balance(address)))
        for address, key in zip(addresses, keys, strict=True)
    )


def start_devnet(host: str, port: int, rpc_url: str | None, out_file: str | Path) -> RunningDevnet:
    """Start (or reach) the chain, deploy the contracts, write the devnet file."""
    server = None if rpc_url else start_embedded_server(host, port)
    try:
        url = rpc_url or (server.url if server else "")
        w3 = connect(url)
        accounts = dev_accounts(w3, server)
        if not accounts:
            raise ChainError(
                f"the chain at {url} has no unlocked dev accounts to deploy from; use anvil or "
                "the embedded devnet"
            )
        suite = deploy_suite(w3, accounts[0].address)
        info = DevnetInfo(url, int(w3.eth.chain_id), suite.addresses, accounts)
        write_devnet_file(out_file, info)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return RunningDevnet(info, server)


def describe(info: DevnetInfo, out_file: str | Path, console: Console) -> None:
    console.print(f"chain {info.chain_id} at [bold]{info.rpc_url}[/bold]")
    for name, address in info.contracts.items():
        console.print(f"  {name:<13} {address}")
    table = Table(title="funded dev accounts (public test keys: never send real value to them)")
    for heading in ("#", "address", "ETH", "private key"):
        table.add_column(heading)
    for index, account in enumerate(info.accounts):
        table.add_row(
            str(index), account.address, format_eth(account.balance_wei), account.private_key
        )
    console.print(table)
    console.print(f"written to {out_file}")


def run_devnet(
    host: str,
    port: int,
    rpc_url: str | None,
    out_file: str | Path,
    console: Console,
    wait: Callable[[], None] | None = None,
    as_json: bool = False,
) -> DevnetInfo:
    """The command: start, describe (``as_json``: the devnet file's JSON on stdout, one line),
    then serve until interrupted (embedded chain only)."""
    devnet = start_devnet(host, port, rpc_url, out_file)
    if as_json:
        print(json.dumps(devnet.info.to_json()), flush=True)
    else:
        describe(devnet.info, out_file, console)
    if devnet.server is None:
        return devnet.info
    if not as_json:
        console.print(
            "serving JSON-RPC; press Ctrl-C to stop (the chain is forgotten when it stops)"
        )
    try:
        (wait or _wait_forever)()
    except KeyboardInterrupt:
        console.print("stopping the devnet")
    finally:
        devnet.stop()
        # The addresses in the file point at a chain that no longer exists.
        with contextlib.suppress(FileNotFoundError):
            Path(out_file).unlink()
    return devnet.info


def _wait_forever() -> None:
    threading.Event().wait()
