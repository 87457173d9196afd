"""The Raft core modules must stay IO-free: no asyncio, grpc, aiosqlite, time, random or os imports."""

from __future__ import annotations

import ast
from pathlib import Path

import kraft.raft

FORBIDDEN = {"asyncio", "grpc", "aiosqlite", "time", "random", "os"}
CORE_PATTERNS = ("core*.py", "state*.py", "quorum*.py")


def _core_modules() -> list[Path]:
    package_dir = Path(kraft.raft.__file__).parent
    return sorted({path for pattern in CORE_PATTERNS for path in package_dir.glob(pattern)})


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            roots.add("__import__")
    return roots


def test_the_core_modules_exist() -> None:
    names = {path.name for path in _core_modules()}
    assert {"core.py", "state.py", "quorum.py", "core_log.py", "core_output.py"} <= names


def test_core_modules_import_nothing_that_does_io() -> None:
    offenders = {
        path.name: sorted(_imported_roots(path) & (FORBIDDEN | {"__import__"}))
        for path in _core_modules()
        if _imported_roots(path) & (FORBIDDEN | {"__import__"})
    }
    assert offenders == {}
