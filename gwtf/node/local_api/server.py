"""Serving the local API beside the node: uvicorn on its own thread and asyncio loop.

py-libp2p runs only under trio, so the API does not share the node's loop: uvicorn runs in a
daemon thread and the app reads only the database and the immutable snapshot. The socket is
bound here first, on the caller's thread, so a port in use is a one-line error before the node
starts, not a traceback in a thread. The bearer token lives in the home (0600).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from gwtf.errors import ConfigError, GwtfError
from gwtf.node.local_api.client import socket_url

log = logging.getLogger(__name__)
TOKEN_BYTES = 32


def api_token(path: str | Path) -> str:
    """The API's bearer token from ``path``, created (0600) when missing."""
    path = Path(path)
    try:
        return _read_or_make_token(path)
    except OSError as exc:
        raise ConfigError(
            f"the API token file {path} cannot be read or made ({exc.strerror}); check its "
            "folder's permissions, or set api.token_file elsewhere"
        ) from exc


def _read_or_make_token(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        # Written whole, then linked into place: a node starting beside this one reads either
        # no file or a complete one, and one of the two tokens wins.
        fd, draft_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
        draft = Path(draft_name)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        try:
            os.link(draft, path)
            return token
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    token = path.read_text().strip()
    if len(token) < 16:
        raise ConfigError(f"{path} holds no valid API token; delete it and a new one is made")
    return token


def bind_api_socket(host: str, port: int) -> socket.socket:
    """A listening socket for the API; a port in use is a ``ConfigError`` saying what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"api.port={port} on {host} cannot be used ({exc.strerror}); another node or program "
            "holds it: stop it, or pass --api-port with a free port (0 picks one)"
        ) from exc
    sock.listen(64)
    return sock


@dataclass
class ApiServer:
    """The API served on a bound socket in a daemon thread until ``stop``."""

    server: uvicorn.Server
    sock: socket.socket
    thread: threading.Thread

    @property
    def url(self) -> str:
        return socket_url(self.sock)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()


def serve_api(app: FastAPI, sock: socket.socket) -> ApiServer:
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except (GwtfError, OSError) as exc:  # the node goes on without its API
            log.error("the local API stopped: %s", exc)

    thread = threading.Thread(target=run, name="local-api", daemon=True)
    thread.start()
    return ApiServer(server, sock, thread)
