"""The Raft core, its messages and its API module must stay IO-free, through their whole import closure.

Two checks, because each sees what the other cannot:

- the *closure* check imports the modules in a fresh interpreter and asserts that no IO package was
  loaded along the way, however indirectly (a core module importing ``kraft.errors`` once pulled in
  grpc this way, which a check of direct imports never saw);
- the *direct import* check reads the sources for ``time``, ``random`` and ``os``: the interpreter loads
  ``time`` and ``os`` at start-up, so only the source can show that the core reads the clock or the
  environment itself instead of taking ``now_ms`` and a seeded ``random.Random`` from its caller.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import kraft.raft

PACKAGE_DIR = Path(kraft.raft.__file__).parent
SOURCE_ROOT = PACKAGE_DIR.parent.parent
# The core (core*.py, state*.py, quorum*.py), the messages it speaks, the driver ports it is written
# against, and the API module the state machine uses.
CORE_PATTERNS = ("core*.py", "state*.py", "quorum*.py", "messages.py", "ports.py", "api.py")

# Packages whose presence in sys.modules means something in the closure can do IO or schedule it:
# networking (grpc and what it sits on), event loops, databases, and threads (the core is driven from
# one task and replayed deterministically by the simulation; this also keeps out stdlib logging, which
# imports threading: the core reports through its Output and the driver logs).
IO_PACKAGES = (
    "grpc",
    "asyncio",
    "uvloop",
    "socket",
    "ssl",
    "select",
    "selectors",
    "subprocess",
    "sqlite3",
    "aiosqlite",
    "threading",
    "concurrent.futures",
)
FORBIDDEN_DIRECT_IMPORTS = {"asyncio", "grpc", "aiosqlite", "time", "random", "os"}

# Runs in a fresh interpreter: -I ignores PYTHONPATH, user site-packages and the current directory, so
# only the source tree under test and the installed dependencies are importable.
_CLOSURE_PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
for name in sys.argv[3:]:
    importlib.import_module(name)
import kraft
loaded = [name for name in json.loads(sys.argv[2]) if name in sys.modules]
print(json.dumps({"kraft_file": kraft.__file__, "loaded": loaded}))
"""


def _core_modules() -> list[Path]:
    return sorted({path for pattern in CORE_PATTERNS for path in PACKAGE_DIR.glob(pattern)})


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(SOURCE_ROOT).with_suffix("").parts)


def _io_packages_loaded_by(module_names: list[str]) -> list[str]:
    """Which of IO_PACKAGES a fresh interpreter has loaded after importing ``module_names``."""
    completed = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            _CLOSURE_PROBE,
            str(SOURCE_ROOT),
            json.dumps(IO_PACKAGES),
            *module_names,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    # The probe must have imported this source tree, not an installed copy of kraft.
    assert Path(result["kraft_file"]) == SOURCE_ROOT / "kraft" / "__init__.py"
    loaded: list[str] = result["loaded"]
    return loaded


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
    assert {
        "core.py",
        "state.py",
        "quorum.py",
        "core_log.py",
        "core_output.py",
        "messages.py",
        "ports.py",
        "api.py",
    } <= names


def test_the_closure_check_sees_an_io_package_when_one_is_imported() -> None:
    # Guards the closure check against passing vacuously.
    assert "asyncio" in _io_packages_loaded_by(["kraft.raft", "asyncio"])


def test_importing_the_core_loads_no_io_package() -> None:
    assert _io_packages_loaded_by([_module_name(path) for path in _core_modules()]) == []


def test_core_modules_import_nothing_that_does_io_or_reads_the_clock() -> None:
    offenders = {
        path.name: sorted(_imported_roots(path) & (FORBIDDEN_DIRECT_IMPORTS | {"__import__"}))
        for path in _core_modules()
        if _imported_roots(path) & (FORBIDDEN_DIRECT_IMPORTS | {"__import__"})
    }
    assert offenders == {}
