"""`kraft metadata dump` options from kafka-dump-log.sh: --files, --print-data-log, an offset range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kraft.cli.main import app, run
from kraft.cli.metadata import render_bytes
from kraft.metadata import records as metadata_records
from kraft.storage.log import METADATA_LOG_DIR_NAME, SegmentedLog
from kraft.storage.snapshot import SnapshotDirectory, SnapshotFileId
from kraft.v1 import metadata_pb2 as pb

runner = CliRunner()


def _partition_log(root: Path) -> Path:
    """orders-0: offsets 0..5, one record per batch, rolled after offset 2 (two segments)."""
    directory = root / "orders-0"
    with SegmentedLog.open(directory) as log:
        log.append_records([(b"k0", b"hello")], leader_epoch=1, timestamp_ms=1)
        log.append_records([(None, b"\x00\xff\x10")], leader_epoch=1, timestamp_ms=2)
        log.append_records([(b"k2", None)], leader_epoch=1, timestamp_ms=3)
        log.roll()
        for i in range(3, 6):
            log.append_records([(f"k{i}".encode(), f"v{i}".encode())], leader_epoch=1, timestamp_ms=i)
    return directory


def _metadata_log(root: Path) -> Path:
    directory = root / METADATA_LOG_DIR_NAME
    value = metadata_records.encode_value(metadata_records.wrap(pb.TopicRecord(name="orders", topic_id="t1")))
    with SegmentedLog.open(directory) as log:
        for i in range(4):
            log.append_records([(None, value)], leader_epoch=1, timestamp_ms=i)
    writer = SnapshotDirectory(directory).create(
        SnapshotFileId(2, 1), last_contained_log_timestamp=1, timestamp_ms=5
    )
    writer.append_records([(None, value)])
    writer.freeze()
    return directory


def _dump(*args: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["metadata", "dump", *args, "--json"])
    assert result.exit_code == 0, result.output
    dumps: list[dict[str, Any]] = json.loads(result.stdout)
    return dumps


def _records(dumps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in dumps for b in d["batches"] for r in b.get("records", [])]


def test_files_and_print_data_log_show_partition_records_as_text_or_hex(tmp_path: Path) -> None:
    segment = _partition_log(tmp_path) / "00000000000000000000.log"
    # Without --print-data-log a partition's records are sizes only (never "decoded" as metadata).
    plain = _records(_dump("--files", str(segment)))
    assert [r["offset"] for r in plain] == [0, 1, 2]
    assert all("payload" not in r for r in plain)
    shown = _records(_dump("--files", str(segment), "--print-data-log"))
    assert [r["payload"] for r in shown] == [
        {"key": {"text": "k0"}, "value": {"text": "hello"}},
        {"key": None, "value": {"hex": "00ff10"}},
        {"key": {"text": "k2"}, "value": None},  # a tombstone
    ]
    text = runner.invoke(app, ["metadata", "dump", "--files", str(segment), "--print-data-log"])
    assert text.exit_code == 0, text.output
    assert (
        '| offset: 0 keySize: 2 valueSize: 5 payload: {"key": {"text": "k0"}, "value": {"text": "hello"}}'
        in (text.stdout)
    )


def test_files_accepts_several_files_comma_separated_or_repeated(tmp_path: Path) -> None:
    directory = _partition_log(tmp_path)
    first, second = sorted(directory.glob("*.log"))
    for args in (["--files", f"{first},{second}"], ["--files", str(first), "--files", str(second)]):
        dumps = _dump(*args)
        assert [d["file"] for d in dumps] == [str(first), str(second)]
        assert [r["offset"] for r in _records(dumps)] == [0, 1, 2, 3, 4, 5]


def test_metadata_files_are_decoded_as_metadata(tmp_path: Path) -> None:
    directory = _metadata_log(tmp_path)
    snapshot = next(directory.glob("*.checkpoint"))
    dumps = _dump("--files", str(directory / "00000000000000000000.log"), "--files", str(snapshot))
    assert [d["kind"] for d in dumps] == ["segment", "snapshot"]
    payloads = [r["payload"] for r in _records(dumps) if "payload" in r]
    assert len(payloads) == 5 and all("orders" in json.dumps(p) for p in payloads)
    # A copy outside __cluster_metadata-0 needs --cluster-metadata-decoder to be read as metadata.
    copy = tmp_path / "copy.log"
    copy.write_bytes((directory / "00000000000000000000.log").read_bytes())
    assert all("payload" not in r for r in _records(_dump("--files", str(copy))))
    decoded = _records(_dump("--files", str(copy), "--cluster-metadata-decoder"))
    assert all("orders" in json.dumps(r["payload"]) for r in decoded)


def test_offset_range_selects_records_and_skips_whole_segments(tmp_path: Path) -> None:
    directory = _partition_log(tmp_path)
    dumps = _dump("--log-dir", str(directory), "--offsets-from", "3", "--offsets-to", "4")
    assert [Path(d["file"]).name for d in dumps] == ["00000000000000000003.log"]  # first one not read
    assert [r["offset"] for r in _records(dumps)] == [3, 4]
    dumps = _dump("--log-dir", str(directory), "--offsets-from", "2", "--offsets-to", "3", "--headers-only")
    assert [(b["baseOffset"]) for d in dumps for b in d["batches"]] == [2, 3]
    # Only an upper bound; metadata log: its snapshot (records without log offsets) is left out.
    metadata = _metadata_log(tmp_path)
    dumps = _dump("--log-dir", str(metadata), "--offsets-to", "1")
    assert [d["kind"] for d in dumps] == ["segment"]
    assert [r["offset"] for r in _records(dumps)] == [0, 1]
    # A snapshot named in --files is shown whole whatever the range.
    snapshot = str(next(metadata.glob("*.checkpoint")))
    assert _dump("--files", snapshot, "--offsets-from", "50") == _dump("--files", snapshot)


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    directory = _partition_log(tmp_path)
    segment = str(directory / "00000000000000000000.log")
    for args, message in (
        (["--files", str(tmp_path / "nope.log")], "not a file"),
        (["--files", str(directory / "00000000000000000000.index")], "not a segment"),
        (["--files", segment, "--offsets-from", "5", "--offsets-to", "4"], "--offsets-from 5 is past"),
    ):
        result = runner.invoke(app, ["metadata", "dump", *args])
        assert result.exit_code == 1, args
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_neither_or_both_inputs_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _partition_log(tmp_path)
    segment = str(directory / "00000000000000000000.log")
    for args, message in (
        ([], "kraft metadata dump: Missing option '--log-dir' (or --files)"),
        (
            ["--log-dir", str(directory), "--files", segment],
            "kraft metadata dump: give --log-dir or --files, not both",
        ),
    ):
        assert run(["metadata", "dump", *args]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_render_bytes_prefers_text_and_falls_back_to_hex() -> None:
    assert render_bytes(None) is None
    assert render_bytes(b"line\tone\n") == {"text": "line\tone\n"}
    assert render_bytes("π".encode()) == {"text": "π"}
    assert render_bytes(b"\x1b[31m") == {"hex": "1b5b33316d"}  # a terminal escape is not printed raw
    assert render_bytes(b"\xc3\x28") == {"hex": "c328"}  # invalid UTF-8
