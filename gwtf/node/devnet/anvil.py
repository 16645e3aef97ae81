"""anvil (Foundry's dev chain, pinned in package-lock.json) as a child of the devnet command.

``start_anvil`` runs the binary on 127.0.0.1 with the chain id and hardfork the contracts are
built for, through ``tether.py`` so that anvil ends with the process that started it however
that process ends. It is ready when it has printed the address it listens on (so a chain
already on that port is never mistaken for it) and answers ``eth_chainId``. The funded dev
accounts and their keys are the ones anvil writes with ``--config-out``: anvil's well-known test
keys, public and never to hold real value.

Everything anvil prints goes to a log file next to the devnet file; a start that fails names
the last lines of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gwtf.errors import ChainError

REPO = Path(__file__).resolve().parents[3]
#: Where `npm ci` links the platform's anvil package (see package.json).
DEFAULT_ANVIL = REPO / "node_modules" / ".bin" / "anvil"
#: The chains `gwtf-node devnet` can serve: anvil where installed (auto), or eth-tester.
BACKENDS = ("auto", "anvil", "eth-tester")
TETHER = Path(__file__).with_name("tether.py")
#: anvil's own default, which wallets and tooling know as a local chain.
CHAIN_ID = 31337
#: The EVM version gwtf/contracts/compile.js compiles for.
HARDFORK = "prague"
DEV_ACCOUNTS = 10
START_TIMEOUT_S = 30.0
POLL_PERIOD_S = 0.05
STOP_TIMEOUT_S = 10.0
TAIL_LINES = 3

_LISTENING = re.compile(r"^Listening on (\S+):(\d+)\s*$", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def is_runnable(binary: Path) -> bool:
    return binary.is_file() and os.access(binary, os.X_OK)


@dataclass
class AnvilChain:
    """A running anvil: its URL, its dev accounts as (address, key), the tethered process."""

    url: str
    keys: tuple[tuple[str, str], ...]
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    name: str = "anvil"

    def wait(self) -> None:
        """Block while anvil runs; an exit nobody asked for is an error."""
        code = self.process.wait()
        raise ChainError(
            f"anvil exited with code {code} ({log_tail(self.log_path)}); see {self.log_path}"
        )

    def stop(self) -> None:
        _end(self.process)


def start_anvil(
    binary: Path, host: str, port: int, log_path: Path, timeout_s: float = START_TIMEOUT_S
) -> AnvilChain:
    """Start anvil and wait until it serves; ``port=0`` lets it pick a free one."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gwtf-anvil-") as scratch:
        config = Path(scratch) / "accounts.json"
        command = [
            str(binary), "--host", host, "--port", str(port), "--chain-id", str(CHAIN_ID),
            "--hardfork", HARDFORK, "--accounts", str(DEV_ACCOUNTS),
            "--config-out", str(config), "--color", "never",
        ]  # fmt: skip
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-I", str(TETHER), *command],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            url, keys = _wait_until_serving(process, host, port, log_path, config, timeout_s)
        except BaseException:
            _end(process)
            raise
    return AnvilChain(url, keys, log_path, process)


def _wait_until_serving(
    process: subprocess.Popen[bytes],
    host: str,
    port: int,
    log_path: Path,
    config: Path,
    timeout_s: float,
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """anvil's URL and dev keys once it has printed where it listens, answers with our chain id
    and has written its account list whole."""
    deadline = time.monotonic() + timeout_s
    url = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise _start_failure(process.returncode, host, port, log_path)
        url = url or _listening_url(log_path)
        if url and _chain_id(url) == CHAIN_ID and (keys := _dev_keys(config)):
            return url, keys
        time.sleep(POLL_PERIOD_S)
    raise ChainError(
        f"anvil was not serving chain {CHAIN_ID} within {timeout_s:g} s "
        f"({log_tail(log_path)}); see {log_path}"
    )


def _start_failure(code: int, host: str, port: int, log_path: Path) -> ChainError:
    tail = log_tail(log_path)
    if "address already in use" in tail.lower():
        return ChainError(
            f"cannot listen on {host}:{port} (anvil: {tail}); pick another --port or stop "
            "the devnet already running there"
        )
    return ChainError(f"anvil exited with code {code} before it served ({tail}); see {log_path}")


def _listening_url(log_path: Path) -> str:
    match = _LISTENING.search(log_path.read_text(errors="replace"))
    if match is None:
        return ""
    host, port = match.groups()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _chain_id(url: str) -> int | None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=1.0) as response:
            return int(json.loads(response.read())["result"], 16)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not up yet (urllib's errors are OSErrors)


def _dev_keys(config: Path) -> tuple[tuple[str, str], ...]:
    """The dev accounts anvil wrote to ``--config-out``, with their keys; none until the file
    is there whole."""
    try:
        data = json.loads(config.read_text())
        return tuple(
            (str(address), str(key))
            for address, key in zip(data["available_accounts"], data["private_keys"], strict=True)
        )
    except (OSError, ValueError, KeyError, TypeError):
        return ()


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()  # the tether ends anvil at the end of its stdin
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def log_tail(log_path: Path) -> str:
    """The last lines anvil printed, on one line."""
    try:
        text = _ANSI.sub("", log_path.read_text(errors="replace"))
    except OSError:
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-TAIL_LINES:]) or "it printed nothing"
