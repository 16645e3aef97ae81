"""Loading the compiled contracts (``gwtf/contracts/artifacts.json``) and checking they are current.

Owns the sources hash that ``gwtf/contracts/compile.js`` writes, recomputed here the same way
(sha256 over ``path NUL content NUL`` of every ``.sol`` under ``gwtf/contracts/``, sorted by path),
so a source edited without ``make contracts`` is caught before a stale bytecode is deployed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gwtf.errors import ChainError

CONTRACTS_DIR = Path(__file__).resolve().parent
ARTIFACTS_PATH = CONTRACTS_DIR / "artifacts.json"
REBUILD_HINT = "gwtf/contracts/artifacts.json is missing or stale; run `make contracts`"


@dataclass(frozen=True)
class CompiledContract:
    """One contract's ABI and creation bytecode."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str


@dataclass(frozen=True)
class Artifacts:
    """Everything ``compile.js`` wrote."""

    compiler: str
    evm_version: str
    sources_sha256: str
    contracts: dict[str, CompiledContract]

    def get(self, name: str) -> CompiledContract:
        """The contract called ``name``, or a ChainError that says how to rebuild."""
        try:
            return self.contracts[name]
        except KeyError:
            raise ChainError(f"contract {name} is not in the artifacts; {REBUILD_HINT}") from None


def source_paths(contracts_dir: Path = CONTRACTS_DIR) -> list[str]:
    """Repo-relative POSIX paths of every Solidity source, sorted."""
    root = contracts_dir.parent
    return sorted(path.relative_to(root).as_posix() for path in contracts_dir.rglob("*.sol"))


def sources_sha256(contracts_dir: Path = CONTRACTS_DIR) -> str:
    """The hash compile.js stores: sha256 over ``path\\0content\\0`` of each sorted source."""
    root = contracts_dir.parent
    digest = hashlib.sha256()
    for rel in source_paths(contracts_dir):
        digest.update(rel.encode() + b"\0")
        digest.update((root / rel).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def read_artifacts(path: Path = ARTIFACTS_PATH) -> Artifacts:
    """Parses an artifacts file; a missing or malformed one is a ChainError with the fix."""
    try:
        raw = json.loads(path.read_text())
        contracts = {
            name: CompiledContract(name=name, abi=entry["abi"], bytecode=entry["bytecode"])
            for name, entry in raw["contracts"].items()
        }
        return Artifacts(
            compiler=raw["compiler"],
            evm_version=raw["evmVersion"],
            sources_sha256=raw["sourcesSha256"],
            contracts=contracts,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ChainError(f"{REBUILD_HINT} ({path} unreadable: {exc})") from exc


@cache
def load_artifacts(check_fresh: bool = True) -> Artifacts:
    """The project's artifacts; with ``check_fresh`` the sources hash must match the .sol files
    (skipped automatically where the sources are not shipped, e.g. an installed wheel)."""
    artifacts = read_artifacts()
    if check_fresh and source_paths() and artifacts.sources_sha256 != sources_sha256():
        raise ChainError(REBUILD_HINT)
    return artifacts
