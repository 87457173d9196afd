"""The layers of the ``kraft`` package import only downwards (docs/architecture.md, "Layers").

Static: every module under ``kraft/`` is parsed with :mod:`ast` and every import statement counts —
module level, inside functions, and under ``if TYPE_CHECKING:`` — so a late import cannot hide a cycle.
The generated ``kraft/v1`` code is not checked (it imports only protobuf and grpc).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import kraft

PACKAGE_DIR = Path(kraft.__file__).parent

# Layer → the kraft packages it must never import.  Forbidden, rather than allowed, lists: a new leaf
# module (an error mapping, a clock) may be added below without touching this table.
FORBIDDEN: dict[str, frozenset[str]] = {
    "kraft.observability": frozenset(
        {"storage", "raft", "metadata", "broker", "client", "node", "cli", "cluster", "pipeline"}
    ),
    "kraft.storage": frozenset(
        {"raft", "metadata", "broker", "client", "node", "cli", "cluster", "pipeline", "observability"}
    ),
    "kraft.raft": frozenset({"metadata", "broker", "client", "node", "cli", "cluster", "pipeline"}),
    "kraft.metadata": frozenset({"broker", "client", "node", "cli", "cluster", "pipeline"}),
    "kraft.broker": frozenset({"raft", "node", "cli", "cluster", "pipeline"}),
    "kraft.client": frozenset(
        {"storage", "raft", "metadata", "broker", "node", "cli", "cluster", "pipeline", "observability"}
    ),
    "kraft.pipeline": frozenset({"raft", "broker", "client", "node", "cli", "cluster"}),
    "kraft.cluster": frozenset({"node", "cli"}),
    "kraft.node": frozenset({"cli", "cluster", "pipeline"}),
}

# What a broker legitimately needs of the metadata layer: the record types (and change_decode, the
# protobuf-free reader of the commonest record, issue #17) and the image it replays them into.  The
# controller side (controller, service, placement, …) is not the broker's business.
BROKER_METADATA_MODULES = frozenset(
    {"kraft.metadata.records", "kraft.metadata.change_decode", "kraft.metadata.image", "kraft.metadata.delta"}
)

# Modules every layer may import although they live in a higher package, each importing nothing of kraft:
# the one place channels are made (its security options must reach the Raft transport too), and the
# structured logger (storage logs every truncation it makes with file, offset and bytes).
SHARED_LEAVES = frozenset({"kraft.client.channel", "kraft.observability.logging"})


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def _module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    # ``from . import x`` in a package's __init__ is relative to the package itself.
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def kraft_imports(package_dir: Path = PACKAGE_DIR) -> Iterator[Import]:
    return iter(_scanned(package_dir))


@functools.cache
def _scanned(package_dir: Path) -> tuple[Import, ...]:
    """One scan per package directory and session: parsing ~300 modules took ~1 s of CPU (~4-7 s on a
    loaded host) and three tests asked for the same one; a test that writes a package uses a new dir."""
    return tuple(_scan(package_dir))


def _scan(package_dir: Path) -> Iterator[Import]:
    for path in sorted(package_dir.rglob("*.py")):
        importer = _module_name(path, package_dir)
        if importer.startswith("kraft.v1"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(importer, path.name == "__init__.py", node)
                # ``from kraft.x import y`` imports the submodule kraft.x.y when there is one, else kraft.x.
                submodules = (f"{module}.{alias.name}" for alias in node.names)
                names = list(
                    dict.fromkeys(sub if _is_module(sub, package_dir) else module for sub in submodules)
                )
            else:
                continue
            for name in names:
                if name == "kraft" or name.startswith("kraft."):
                    yield Import(importer, name, node.lineno)


@functools.cache
def _is_module(name: str, package_dir: Path = PACKAGE_DIR) -> bool:
    relative = Path(*name.split("."))
    return (package_dir.parent / relative).with_suffix(".py").exists() or (
        package_dir.parent / relative / "__init__.py"
    ).exists()


def _package(name: str) -> str:
    """``kraft.raft.driver`` → ``raft``; a top-level module (``kraft.errors``) → its own name."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer_of(importer: str) -> str | None:
    return next((layer for layer in FORBIDDEN if importer == layer or importer.startswith(layer + ".")), None)


def violations(package_dir: Path = PACKAGE_DIR) -> list[str]:
    found: list[str] = []
    for imp in kraft_imports(package_dir):
        if not _is_module(imp.imported, package_dir) or imp.imported in SHARED_LEAVES:
            continue
        layer = _layer_of(imp.importer)
        if layer is None or _package(imp.imported) == _package(imp.importer):
            continue
        if _package(imp.imported) in FORBIDDEN[layer]:
            found.append(str(imp))
        elif (
            layer == "kraft.broker"
            and _package(imp.imported) == "metadata"
            and imp.imported != "kraft.metadata"
            and imp.imported not in BROKER_METADATA_MODULES
        ):
            found.append(f"{imp} (a broker needs only {sorted(BROKER_METADATA_MODULES)})")
    return found


def test_every_layer_imports_only_the_layers_below_it() -> None:
    assert violations() == []


def test_an_upward_import_inside_a_function_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "kraft"
    for module, text in {
        "__init__.py": "",
        "raft/__init__.py": "",
        "raft/process.py": "def run() -> None:\n    from kraft.metadata.node import install\n",
        "metadata/__init__.py": "",
        "metadata/node.py": "from ..broker import controller_client\n",
        "metadata/image.py": "",
        "broker/__init__.py": "",
        "broker/controller_client.py": "from kraft.metadata import image\nimport kraft.metadata.node\n",
    }.items():
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).write_text(text)
    assert violations(package) == [
        "kraft.broker.controller_client:2 imports kraft.metadata.node (a broker needs only "
        f"{sorted(BROKER_METADATA_MODULES)})",
        "kraft.metadata.node:1 imports kraft.broker.controller_client",
        "kraft.raft.process:2 imports kraft.metadata.node",
    ]


def test_the_shared_channel_module_imports_nothing_of_kraft() -> None:
    leaves = [imp for imp in kraft_imports() if imp.importer in SHARED_LEAVES]
    assert leaves == []


def test_the_scan_sees_function_level_and_type_checking_imports() -> None:
    # Guard against a scan that silently finds nothing: the controller process's wiring is known to
    # import the metadata layer and storage, and the CLI imports the process lazily inside a command.
    found = {(imp.importer, imp.imported) for imp in kraft_imports()}
    assert ("kraft.node.controller", "kraft.node.metadata_layer") in found
    assert ("kraft.cli.controller", "kraft.node.controller") in found
    assert ("kraft.node.metadata_layer", "kraft.node.controller") in found  # under TYPE_CHECKING


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_every_layer_in_the_table_exists(layer: str) -> None:
    assert _is_module(layer), f"{layer} is in the layering table but not in the package"
