"""`kraft pipeline` argument errors: one line on stderr, exit 1, and no JVM started for them."""

from __future__ import annotations

from pathlib import Path

import pytest
from spark_log_builders import BatchSpec, write_partition
from typer.testing import CliRunner

from kraft.cli.main import app

pytestmark = pytest.mark.spark

runner = CliRunner()


def _error_line(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_missing_log_dir_is_one_line(tmp_path: Path) -> None:
    line = _error_line(
        ["pipeline", "compact", "--log-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    )
    assert line.startswith("error: ") and "does not exist" in line
    line = _error_line(
        ["pipeline", "metadata-report", "--log-dir", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert "no kraft log files" in line


def test_compact_refuses_out_inside_log_dir_and_non_empty_out(tmp_path: Path) -> None:
    write_partition(tmp_path / "in", "t", 0, [BatchSpec(((b"k", b"v", ()),), 1)])
    line = _error_line(
        ["pipeline", "compact", "--log-dir", str(tmp_path / "in"), "--out", str(tmp_path / "in" / "x")]
    )
    assert "must not be inside" in line
    write_partition(tmp_path / "out", "t", 0, [BatchSpec(((b"k", b"v", ()),), 1)])
    line = _error_line(
        ["pipeline", "compact", "--log-dir", str(tmp_path / "in"), "--out", str(tmp_path / "out")]
    )
    assert "already holds segments" in line
