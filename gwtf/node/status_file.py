"""A node process's status file and results file, as ``gwtf.node.process`` writes them and the
swarm's supervisor, the demo and the benchmarks read them.

The status (``<name>.status.json``) is rewritten whole by atomic rename, so a reader, or a
``kill -9`` mid-write, never sees a torn file; it stays small. A data node's iteration results
are appended, one JSON line each, to ``<name>.results.jsonl``: a restarted process appends to its
predecessor's, and a line torn by a kill is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_status(path: Path, status: dict[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(status))
    os.replace(temporary, path)


def results_file_of(status_file: Path) -> Path:
    """Where a data node appends its iteration results (``x.status.json`` -> ``x.results.jsonl``):
    a restarted process appends to its predecessor's."""
    return status_file.with_name(status_file.name.removesuffix(".status.json") + ".results.jsonl")


def read_results(status_file: Path) -> list[dict[str, Any]]:
    """A data node's iteration results so far; a line torn by a kill mid-write is left out."""
    try:
        lines = results_file_of(status_file).read_text().splitlines()
    except OSError:
        return []
    results = []
    for line in lines:
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return results


@dataclasses.dataclass
class ResultsLog:
    """Appends a data node's new iteration results (dataclasses) to its results file."""

    path: Path
    written: int = 0

    def append(self, results: Sequence[Any]) -> None:
        new = results[self.written :]
        if new:
            with self.path.open("a") as out:
                if self.written == 0 and out.tell() > 0:
                    out.write("\n")  # a predecessor's last line may be torn: not this one's first
                out.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in new)
            self.written += len(new)
