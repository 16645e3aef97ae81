"""One home per node: the folder that holds everything one node keeps, and how a command finds
the node that runs there.

A node's home is ``--home DIR``, else ``node.data_dir``, else ``.gwtf/nodes/<node name>`` (the
``--node-name`` of its wallet, ``main`` by default), so several nodes on one machine never share
a file. It holds the node's database (``node.sqlite``), its API token (``api-token``), its hop
evidence (``evidence/``), a lone data node's resume points (``checkpoints/run-<id>/``,
``gwtf.node.runtime.resume``), the lock that keeps a second process out (``node.lock``) and, while
the node runs, ``node.json``: which node it is, its run and where its API answers (kept,
marked stopped, when it stops). ``status``,
``earnings``, ``receipts`` and ``claim`` read that file, so each speaks to its own node's API
and database, whatever port the API took. A setting that puts one of these files elsewhere
(``db.url``, ``api.token_file``, ``chain.evidence_dir``) still wins.

This module imports nothing heavy: the read-only commands use it before anything else loads.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gwtf.node.settings import Settings

#: Where homes named after their node live, relative to the working directory (as the devnet
#: file is).
HOMES = Path(".gwtf") / "nodes"
DEFAULT_NODE_NAME = "main"
RUNNING_FILE = "node.json"
#: Held by the running node (``gwtf-node start``), so no second process takes its home.
LOCK_FILE = "node.lock"
#: A running file is a few hundred bytes; a larger one is not ours.
MAX_RUNNING_BYTES = 64 * 1024


def home_of(settings: Settings, home: str | None = None, node_name: str | None = None) -> Path:
    """The home of the node named ``node_name``: ``home`` when given, else ``node.data_dir``
    when set, else ``.gwtf/nodes/<node_name>``."""
    if home:
        return Path(home)
    if settings.node.data_dir:
        return Path(settings.node.data_dir)
    return HOMES / (node_name or DEFAULT_NODE_NAME)


def home_settings(settings: Settings, home: Path) -> dict[str, str]:
    """Overrides that put the node's database, API token and evidence in ``home``, for each
    that no setting has put elsewhere (the defaults name no home)."""
    from gwtf.node.settings import Settings

    defaults = Settings()
    wanted = (
        ("db.url", f"sqlite:///{home / 'node.sqlite'}", settings.db.url, defaults.db.url),
        ("api.token_file", str(home / "api-token"), settings.api.token_file,
         defaults.api.token_file),
        ("chain.evidence_dir", str(home / "evidence"), settings.chain.evidence_dir,
         defaults.chain.evidence_dir),
    )  # fmt: skip
    return {key: value for key, value, now, default in wanted if now == default}


@dataclass(frozen=True)
class RunningNode:
    """What a running node writes in its home: who it is and where to reach it."""

    node: str  # its address on chain
    peer_id: str
    run_id: int
    role: str
    api_url: str  # "" when its API is off, or before it serves
    p2p_address: str
    pid: int
    #: "starting" (placing itself, waiting for its run's data node or loading its stage),
    #: "running" (serving), "stopped" (the file of a node that left).
    state: str = "running"


def write_running(home: Path, running: RunningNode) -> None:
    """Write ``home/node.json`` whole (a reader sees the old file or the new one)."""
    home.mkdir(parents=True, exist_ok=True)
    fd, draft = tempfile.mkstemp(prefix=f".{RUNNING_FILE}.", dir=home)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(running), out)
    os.replace(draft, home / RUNNING_FILE)


def read_running(home: Path) -> RunningNode | None:
    """The node running in ``home``, or None: no file, a file that is not ours, or no process
    holding the home's lock (a node killed without its goodbye leaves its file behind, and its
    pid may be another process's by now: the lock dies with the node)."""
    running = _read(home)
    return running if running is not None and running.pid > 0 and is_locked(home) else None


def is_locked(home: Path) -> bool:
    """Whether a node process holds ``home/node.lock`` (``gwtf-node start`` does while it runs)."""
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of the shared lock, if it was taken
    return False


def clear_running(home: Path, pid: int) -> None:
    """Mark ``home/node.json`` stopped if process ``pid`` wrote it (a newer node's file stays):
    it keeps saying which node and run the home is of, for the commands run while it is down."""
    last = _read(home)
    if last is not None and last.pid == pid:
        write_running(home, replace(last, pid=0, api_url="", state="stopped"))


def last_run(home: Path) -> int | None:
    """The run the node of ``home`` last ran in, running or not (None: it never started)."""
    last = _read(home)
    return last.run_id if last is not None else None


def _read(home: Path) -> RunningNode | None:
    path = home / RUNNING_FILE
    try:
        if path.stat().st_size > MAX_RUNNING_BYTES:
            return None
        data: Any = json.loads(path.read_text())
        return RunningNode(**data)
    except (OSError, ValueError, TypeError):
        return None


def speaking_for(node: str, home: Path, running: RunningNode | None) -> str:
    """The line a command prints first: which node it speaks for, and whether it runs."""
    if running is None:
        where = "not running"
    elif running.state == "starting":
        where = "starting: waiting for its run (see its output)"
    else:
        where = f"running, API {running.api_url}" if running.api_url else "running, no API"
    return f"node {node} (home {home}, {where})"
