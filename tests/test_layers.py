"""The layers point one way (DESIGN.md §3): the pure core and the on-chain encoding import nothing
of the project's adapters nor of the heavy libraries, and the API never imports the node."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ADAPTER_LIBRARIES = {"torch", "libp2p", "web3", "sqlalchemy", "fastapi", "trio", "eth_tester"}
PROJECT_ADAPTERS = {"node", "api", "migrations"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in item.names)
        elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
            roots.add(item.module.split(".")[0])
    return roots


def python_files(*relative: str) -> list[Path]:
    files: list[Path] = []
    for rel in relative:
        target = ROOT / rel
        files.extend([target] if target.is_file() else sorted(target.rglob("*.py")))
    return [f for f in files if f.exists()]


PURE_FILES = python_files(
    "gwtf", "coordinator_free", "contracts/encoding.py", "contracts/merkle.py"
)


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_no_adapter(path: Path) -> None:
    forbidden = (ADAPTER_LIBRARIES | PROJECT_ADAPTERS) & imported_roots(path)
    assert not forbidden, f"{path.relative_to(ROOT)} imports {sorted(forbidden)}"


@pytest.mark.parametrize("path", python_files("api"), ids=lambda p: str(p.relative_to(ROOT)))
def test_api_does_not_import_the_node(path: Path) -> None:
    assert "node" not in imported_roots(path)


def test_error_root_imports_nothing() -> None:
    assert imported_roots(ROOT / "gwtf" / "errors.py") <= {"__future__"}


def test_the_scan_sees_imports() -> None:
    # Guard against a scanner that silently finds nothing: this very file imports pytest.
    assert "pytest" in imported_roots(Path(__file__))
