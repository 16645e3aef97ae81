"""`gwtf-node devnet`: a development chain with the GWTF contracts deployed, for many processes.

The chain is anvil (``gwtf.node.devnet.anvil``), a child of this process bound to 127.0.0.1, served
until Ctrl-C or SIGTERM. Where anvil's binary is not installed (npm has it for Linux and macOS on
x64 and arm64), the embedded eth-tester chain served over JSON-RPC (``gwtf.node.devnet.rpc``) stands
in, and one line on stderr says so. With ``--rpc-url`` the contracts are deployed on an existing
chain instead (one with an unlocked dev account) and the command returns. Either way the RPC
URL, contract addresses and funded dev accounts are printed and written to the devnet file that
other commands read (default ``.gwtf/devnet.json``); it is removed when our chain stops, since
its addresses die with it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.table import Table
from web3 import Web3

from gwtf.contracts.artifacts import load_artifacts
from gwtf.contracts.bindings import SuiteParams, deploy_suite
from gwtf.errors import ChainError
from gwtf.node.chain.adapter import connect, format_eth
from gwtf.node.chain.deployment import DevAccount, DevnetInfo, write_devnet_file
from gwtf.node.devnet.anvil import BACKENDS, DEFAULT_ANVIL, is_runnable, start_anvil
from gwtf.node.devnet.rpc import DevnetHttpServer, EthTesterRpc

#: A devnet mines a block per transaction, not per 12 s: the court's windows are 20 blocks and
#: a draw's seed block 2 after the last party input, so that a local run reaches its rulings.
DEVNET_PARAMS = SuiteParams(court_phase_blocks=20, court_draw_delay_blocks=2)


class LocalChain(Protocol):
    """A chain this process runs: where it answers, its dev accounts (address, key)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def keys(self) -> tuple[tuple[str, str], ...]: ...

    def wait(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class EmbeddedChain:
    """eth-tester in this process, served over HTTP JSON-RPC from a thread."""

    server: DevnetHttpServer
    name: str = "embedded eth-tester"

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def keys(self) -> tuple[tuple[str, str], ...]:
        tester = self.server.rpc.tester
        secrets = ["0x" + key.to_bytes().hex() for key in tester.backend.account_keys]
        return tuple(zip(tester.get_accounts(), secrets, strict=True))

    def wait(self) -> None:
        threading.Event().wait()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class RunningDevnet:
    """A devnet that is up: its description, and the chain when it is ours."""

    info: DevnetInfo
    chain: LocalChain | None
    out_file: Path

    def wait(self) -> None:
        """Block while our chain runs (raises ``ChainError`` if it dies)."""
        if self.chain is not None:
            self.chain.wait()

    def stop(self) -> None:
        if self.chain is None:
            return
        self.chain.stop()
        # The addresses in the file point at a chain that no longer exists.
        self.out_file.unlink(missing_ok=True)


def start_embedded(host: str, port: int) -> EmbeddedChain:
    try:
        server = DevnetHttpServer(EthTesterRpc(), host, port)
    except OSError as exc:
        raise ChainError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or stop "
            "the devnet already running there"
        ) from exc
    return EmbeddedChain(server.start_background())


def anvil_log_path(out_file: Path) -> Path:
    """anvil's log, next to the devnet file: ``devnet.json`` → ``devnet-anvil.log``."""
    return out_file.with_name(f"{out_file.stem}-anvil.log")


def start_local_chain(
    host: str, port: int, out_file: Path, backend: str, anvil: Path | None
) -> LocalChain:
    """anvil, or the embedded chain when asked for or when anvil's binary is missing."""
    if backend not in BACKENDS:
        raise ChainError(f"unknown devnet backend {backend!r}; use one of {', '.join(BACKENDS)}")
    binary = anvil or DEFAULT_ANVIL
    if backend == "eth-tester":
        return start_embedded(host, port)
    if is_runnable(binary):
        return start_anvil(binary, host, port, anvil_log_path(out_file))
    if backend == "anvil":
        raise ChainError(
            f"no anvil binary at {binary}; `make install` installs it (npm ci), or pass --anvil"
        )
    print(
        f"gwtf-node: no anvil binary at {binary} (npm has it for Linux and macOS, x64 and "
        "arm64); serving the embedded eth-tester chain instead",
        file=sys.stderr,
        flush=True,
    )
    return start_embedded(host, port)


def dev_accounts(w3: Web3, chain: LocalChain | None) -> tuple[DevAccount, ...]:
    """The chain's funded accounts; with their (public test) keys when the chain is ours."""
    if chain is None:
        pairs = [(address, "") for address in w3.eth.accounts]
    else:
        pairs = [(Web3.to_checksum_address(address), key) for address, key in chain.keys]
    return tuple(
        DevAccount(address, key, int(w3.eth.get_balance(address))) for address, key in pairs
    )


def start_devnet(
    host: str,
    port: int,
    rpc_url: str | None,
    out_file: str | Path,
    *,
    backend: str = "auto",
    anvil: Path | None = None,
) -> RunningDevnet:
    """Start (or reach) the chain, deploy the contracts, write the devnet file."""
    out_file = Path(out_file)
    load_artifacts()  # refuse stale or missing artifacts before starting anything
    chain = None if rpc_url else start_local_chain(host, port, out_file, backend, anvil)
    try:
        url = rpc_url or (chain.url if chain else "")
        w3 = connect(url)
        accounts = dev_accounts(w3, chain)
        if not accounts:
            raise ChainError(
                f"the chain at {url} has no unlocked dev accounts to deploy from; use anvil or "
                "the embedded devnet"
            )
        suite = deploy_suite(w3, accounts[0].address, DEVNET_PARAMS)
        info = DevnetInfo(url, int(w3.eth.chain_id), suite.addresses, accounts)
        write_devnet_file(out_file, info)
    except BaseException:
        if chain is not None:
            chain.stop()
        raise
    return RunningDevnet(info, chain, out_file)


def describe(devnet: RunningDevnet, console: Console) -> None:
    info = devnet.info
    kind = f" ({devnet.chain.name})" if devnet.chain else ""
    console.print(f"chain {info.chain_id} at [bold]{info.rpc_url}[/bold]{kind}")
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
    console.print(f"written to {devnet.out_file}")


def run_devnet(
    host: str,
    port: int,
    rpc_url: str | None,
    out_file: str | Path,
    console: Console,
    *,
    backend: str = "auto",
    anvil: Path | None = None,
    as_json: bool = False,
) -> DevnetInfo:
    """The command: start, describe (``as_json``: the devnet file's JSON on stdout, one line),
    then serve until interrupted (our own chain only)."""
    with sigterm_interrupts():
        devnet = start_devnet(host, port, rpc_url, out_file, backend=backend, anvil=anvil)
        try:
            if as_json:
                print(json.dumps(devnet.info.to_json()), flush=True)
            else:
                describe(devnet, console)
            if devnet.chain is None:
                return devnet.info
            if not as_json:
                console.print(
                    "serving JSON-RPC; press Ctrl-C to stop (the chain is forgotten when it stops)"
                )
            devnet.wait()
        except KeyboardInterrupt:
            if not as_json:
                console.print("stopping the devnet")
        finally:
            devnet.stop()
    return devnet.info


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the devnet as Ctrl-C does (the chain stopped, the file removed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
