"""The layers point one way: the pure core and the on-chain encoding import nothing
of the project's adapters nor of the heavy libraries, the API never imports the node, and the
node's rooms import only rooms below them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ADAPTER_LIBRARIES = {"torch", "libp2p", "web3", "sqlalchemy", "fastapi", "trio", "eth_tester"}
PROJECT_ADAPTERS = {"node", "api", "migrations"}


def root_of(module: str) -> str:
    """A module's top-level name; a package of the project counts by its name under gwtf."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gwtf" and len(parts) > 1 else parts[0]


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            roots.update(root_of(alias.name) for alias in item.names)
        elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
            roots.add(root_of(item.module))
    return roots


def python_files(*relative: str) -> list[Path]:
    files: list[Path] = []
    for rel in relative:
        target = ROOT / rel
        files.extend([target] if target.is_file() else sorted(target.rglob("*.py")))
    return [f for f in files if f.exists()]


PURE_FILES = python_files(
    "gwtf/__init__.py",
    "gwtf/errors.py",
    "gwtf/coordinator_free",
    "gwtf/contracts/encoding.py",
    "gwtf/contracts/merkle.py",
)


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_no_adapter(path: Path) -> None:
    forbidden = (ADAPTER_LIBRARIES | PROJECT_ADAPTERS) & imported_roots(path)
    assert not forbidden, f"{path.relative_to(ROOT)} imports {sorted(forbidden)}"


@pytest.mark.parametrize("path", python_files("gwtf/api"), ids=lambda p: str(p.relative_to(ROOT)))
def test_api_does_not_import_the_node(path: Path) -> None:
    assert "node" not in imported_roots(path)


# The node's rooms, lowest first: a room may import only rooms of earlier layers. A room is a
# package directly under gwtf/node/ or gwtf/node/runtime/, or a top-level module of gwtf/node/
# (gwtf.node.runtime itself holds the live node's assembly).
NODE_LAYERS: list[set[str]] = [
    {
        "gwtf.node.training",
        "gwtf.node.p2p",
        "gwtf.node.failpoints",
        "gwtf.node.logs",
        "gwtf.node.status_file",
    },
    {"gwtf.node.settings"},
    {"gwtf.node.chain", "gwtf.node.store", "gwtf.node.runtime.flow", "gwtf.node.home"},
    {"gwtf.node.receipts"},
    {"gwtf.node.devnet", "gwtf.node.runtime.dataplane", "gwtf.node.audit"},
    {"gwtf.node.export"},
    {"gwtf.node.runtime.discovery"},
    {"gwtf.node.runtime.replicas"},
    {"gwtf.node.runtime.roles"},
    {"gwtf.node.runtime"},
    {"gwtf.node.local_api"},
    {"gwtf.node.composition", "gwtf.node.swarm"},
    {"gwtf.node.demo"},
    {"gwtf.node.process", "gwtf.node.cli"},
]


def room_of(module: str) -> str:
    parts = module.split(".")
    if (
        len(parts) >= 4
        and parts[2] == "runtime"
        and (ROOT / "gwtf" / "node" / "runtime" / parts[3]).is_dir()
    ):
        return ".".join(parts[:4])
    return ".".join(parts[:3])


def node_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((ROOT / "gwtf" / "node").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts).removesuffix(".__init__")] = path
    return modules


def imported_node_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            found.update(alias.name for alias in item.names)
        elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
            found.add(item.module)
    return {name for name in found if name.startswith("gwtf.node.")}


def test_every_node_room_has_a_layer() -> None:
    placed = set().union(*NODE_LAYERS)
    rooms = {room_of(module) for module in node_modules() if module != "gwtf.node"}
    assert rooms == placed, f"rooms without a layer: {sorted(rooms - placed)}"


def test_node_rooms_import_only_lower_rooms() -> None:
    layer_of = {room: rank for rank, rooms in enumerate(NODE_LAYERS) for room in rooms}
    wrong = []
    for module, path in node_modules().items():
        source = room_of(module) if module != "gwtf.node" else "gwtf.node"
        for target in map(room_of, imported_node_modules(path)):
            if target != source and layer_of[target] >= layer_of.get(source, -1):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports that point up or sideways: " + "; ".join(sorted(wrong))


def test_error_root_imports_nothing() -> None:
    assert imported_roots(ROOT / "gwtf" / "errors.py") <= {"__future__"}


def test_the_scan_sees_imports() -> None:
    # Guard against a scanner that silently finds nothing: this very file imports pytest, and the
    # node's process imports the composition root (a room of a later layer than the roles).
    assert "pytest" in imported_roots(Path(__file__))
    assert "gwtf.node.composition" in imported_node_modules(ROOT / "gwtf" / "node" / "process.py")
    assert room_of("gwtf.node.runtime.roles.relay") == "gwtf.node.runtime.roles"
    assert room_of("gwtf.node.runtime.live_node") == "gwtf.node.runtime"


def test_the_packages_installed_are_the_projects_own(tmp_path: Path) -> None:
    """setuptools' own discovery with pyproject.toml's patterns (namespace packages included, its
    default for ``[tool.setuptools.packages.find]``) finds the project's packages and nothing npm
    puts beside them: ``node_modules`` matches ``node*``."""
    import tomllib

    from setuptools import find_namespace_packages as find_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = found["packages"]["find"]["include"]
    (tmp_path / "node_modules" / "pkg").mkdir(parents=True)
    (tmp_path / "gwtf" / "sub").mkdir(parents=True)
    for init in ("gwtf/__init__.py", "gwtf/sub/__init__.py"):
        (tmp_path / init).write_text("")
    assert sorted(find_packages(tmp_path, include=include)) == ["gwtf", "gwtf.sub"]
    tops = {name.split(".")[0] for name in find_packages(ROOT, include=include)}
    assert tops == {"gwtf"}
