"""How a command shows its result: a rich rendering for a person, or one JSON document
(``--json``) for a script. Amounts are ETH for a person and wei (decimal text) beside ETH in JSON;
addresses are checksummed and peer ids base58 in both."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich and pydantic load only when a command prints, not for --help
    from rich.console import Console
    from rich.table import Table

Render = Callable[["Console"], None]


def add_json_flags(parser: argparse.ArgumentParser) -> None:
    """Give every leaf command under ``parser`` a ``--json`` flag (once)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                add_json_flags(child)
            return
    if not any("--json" in action.option_strings for action in parser._actions):
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


def emit(args: argparse.Namespace, console: Console, data: Any, render: Render) -> int:
    """Print ``data`` as JSON with ``--json``, else let ``render`` draw it; exit code 0."""
    if getattr(args, "json", False):
        print(json.dumps(plain(data), indent=2))
    else:
        render(console)
    return 0


def plain(data: Any) -> Any:
    """``data`` with pydantic models, bytes and tuples made JSON's own types."""
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, dict):
        return {str(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    if isinstance(data, bytes):
        return "0x" + data.hex()
    return data


def table(title: str, columns: list[str], rows: list[list[Any]], right_from: int = 1) -> Table:
    """A table whose columns from ``right_from`` on are right-aligned (numbers)."""
    from rich.table import Table

    out = Table(title=title)
    for i, column in enumerate(columns):
        out.add_column(column, justify="right" if i >= right_from else "left")
    for row in rows:
        out.add_row(*("" if cell is None else str(cell) for cell in row))
    return out


def fields(title: str, values: dict[str, Any]) -> Table:
    """A two-column table of named values."""
    return table(title, ["", ""], [[k, v] for k, v in values.items()], right_from=2)
