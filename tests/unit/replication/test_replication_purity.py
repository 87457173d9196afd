"""kraft.replication stays pure: no IO, no clock, no randomness, through its whole import closure.

The same two checks as tests/unit/raft/test_raft_core_purity.py: the sources import none of
asyncio/grpc/aiosqlite/time/random/os, and a fresh interpreter that imports every module has loaded no
package that does IO (a direct-import check cannot see what an imported kraft module pulls in).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import kraft.replication

PACKAGE_DIR = Path(kraft.replication.__file__).parent
SOURCE_ROOT = PACKAGE_DIR.parent.parent
FORBIDDEN_DIRECT_IMPORTS = {"asyncio", "grpc", "aiosqlite", "time", "random", "os", "__import__"}
IO_PACKAGES = ("grpc", "asyncio", "uvloop", "socket", "ssl", "selectors", "sqlite3", "aiosqlite", "threading")

_PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
for name in sys.argv[3:]:
    importlib.import_module(name)
import kraft
print(json.dumps({"kraft_file": kraft.__file__,
                  "loaded": [n for n in json.loads(sys.argv[2]) if n in sys.modules]}))
"""


def _modules() -> list[Path]:
    return sorted(PACKAGE_DIR.glob("*.py"))


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


def test_the_replication_modules_exist() -> None:
    assert {path.name for path in _modules()} >= {"epochs.py", "truncation.py"}


def test_replication_modules_import_nothing_that_does_io_or_reads_the_clock() -> None:
    offenders = {
        path.name: sorted(_imported_roots(path) & FORBIDDEN_DIRECT_IMPORTS)
        for path in _modules()
        if _imported_roots(path) & FORBIDDEN_DIRECT_IMPORTS
    }
    assert offenders == {}


def test_importing_the_replication_package_loads_no_io_package() -> None:
    names = [".".join(path.relative_to(SOURCE_ROOT).with_suffix("").parts) for path in _modules()]
    names = [name.removesuffix(".__init__") for name in names]
    completed = subprocess.run(
        [sys.executable, "-I", "-c", _PROBE, str(SOURCE_ROOT), json.dumps(IO_PACKAGES), *names],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert Path(result["kraft_file"]) == SOURCE_ROOT / "kraft" / "__init__.py"
    assert result["loaded"] == []
