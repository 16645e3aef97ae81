"""A client of a running node's local API, for ``gwtf-node status|claim`` (stdlib HTTP only)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from gwtf.errors import GwtfError, NodeNotRunning

MAX_ANSWER_BYTES = 16 * 1024 * 1024


def api_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def socket_url(sock: socket.socket) -> str:
    """The API's URL on a bound socket (IPv6 hosts bracketed)."""
    host, port = sock.getsockname()[:2]
    return api_url(host, port)


def call_api(
    url: str, path: str, body: dict[str, Any] | None = None, token: str = "", timeout_s: float = 60
) -> Any:
    """GET (or POST ``body``) ``path`` of the node API at ``url``; its JSON answer. No node
    answering is ``NodeNotRunning``; an error answer is a ``GwtfError`` with its detail."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method="GET" if body is None else "POST"
    )
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            body_bytes = answer.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read(MAX_ANSWER_BYTES)).get("detail", exc.reason)
        except (ValueError, AttributeError):
            detail = exc.reason
        raise GwtfError(f"the node at {url} answered {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise NodeNotRunning(
            f"no node answers at {url} ({getattr(exc, 'reason', exc)}); start it with "
            "`gwtf-node start`, or point --api-port at the one running"
        ) from exc
    try:
        return json.loads(body_bytes)
    except ValueError as exc:
        raise GwtfError(
            f"what answers at {url} is not a GWTF node's API (no JSON); check --api-port"
        ) from exc
