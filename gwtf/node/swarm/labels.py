"""How the swarm's crashes and joins read in its displays."""

from __future__ import annotations

from typing import Any


def crash_label(crash: dict[str, Any]) -> str:
    """``relay-1-0``, ``relay-1-0 (injected)`` (fault injection) or ``relay-1-0 (by hand)``."""
    how = "injected" if crash.get("injected") else "by hand" if crash.get("by_hand") else ""
    return f"{crash['node']} ({how})" if how else str(crash["node"])


def join_label(join: dict[str, Any]) -> str:
    return f"{join['node']} (restart)" if join.get("restart") else str(join["node"])
