"""The checked-in generated code under kraft/v1/ is exactly what `make proto` produces from proto/.

Regenerates every .proto into a temporary directory with the Makefile's flags and compares byte for byte,
so a .proto edited without `make proto` (or a hand-edited generated file) fails here instead of at runtime.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
GENERATED = REPO / "kraft" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _regenerate(out_dir: Path) -> None:
    protos = sorted(str(p.relative_to(REPO)) for p in (PROTO_ROOT / "kraft" / "v1").glob("*.proto"))
    assert protos, "no .proto files found under proto/kraft/v1"
    # The mypy plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) live next to the interpreter, as in the
    # Makefile's PATH="$(BIN):$PATH".
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-Iproto",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"protoc failed: {result.stderr.strip()}"


def _generated_files(root: Path) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in root.iterdir()
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    }


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    _regenerate(tmp_path)
    fresh = _generated_files(tmp_path / "kraft" / "v1")
    checked_in = _generated_files(GENERATED)
    missing = sorted(set(fresh) - set(checked_in))
    orphaned = sorted(set(checked_in) - set(fresh))
    stale = sorted(name for name in set(fresh) & set(checked_in) if fresh[name] != checked_in[name])
    problems = []
    if missing:
        problems.append(f"not generated yet: {missing}")
    if orphaned:
        problems.append(f"generated code without a .proto: {orphaned}")
    if stale:
        problems.append(f"stale (differs from its .proto): {stale}")
    if problems:
        pytest.fail("kraft/v1 is out of date — run `make proto`: " + "; ".join(problems))
