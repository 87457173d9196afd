"""`kraft metadata dump` and the record-decoder registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.storage.batch import LeaderChangeMessage
from kraft.storage.dump import dump_file, register_record_decoder, unregister_record_decoder
from kraft.storage.log import METADATA_LOG_DIR_NAME, SegmentedLog
from kraft.storage.snapshot import SnapshotDirectory, SnapshotFileId

runner = CliRunner()


def _make_log_dir(root: Path) -> Path:
    directory = root / METADATA_LOG_DIR_NAME
    with SegmentedLog.open(directory) as log:
        log.append_control([LeaderChangeMessage(1, (1, 2, 3), (1, 3))], leader_epoch=1, timestamp_ms=5)
        log.append_records([(b"key", b"opaque-value")], leader_epoch=1, timestamp_ms=6)
    writer = SnapshotDirectory(directory).create(
        SnapshotFileId(2, 1), last_contained_log_timestamp=6, timestamp_ms=7
    )
    writer.append_records([(None, b"state")])
    writer.freeze()
    return directory


def test_dump_prints_batches_control_records_and_snapshots(tmp_path: Path) -> None:
    directory = _make_log_dir(tmp_path)
    result = runner.invoke(app, ["metadata", "dump", "--log-dir", str(directory)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("Dumping ") and lines[0].endswith(
        "00000000000000000000.log (segment, 189 bytes)"
    )
    assert "baseOffset: 0 lastOffset: 0 count: 1 partitionLeaderEpoch: 1 isControl: true" in lines[1]
    assert '"type": "LeaderChange"' in lines[2] and '"grantingVoters": [1, 3]' in lines[2]
    assert any("00000000000000000002-0000000001.checkpoint (snapshot" in line for line in lines)
    assert any('"type": "SnapshotFooter"' in line for line in lines)


def test_dump_json_is_machine_readable(tmp_path: Path) -> None:
    directory = _make_log_dir(tmp_path)
    result = runner.invoke(app, ["metadata", "dump", "--log-dir", str(directory), "--json"])
    assert result.exit_code == 0, result.output
    files = json.loads(result.output)
    assert [f["kind"] for f in files] == ["segment", "snapshot"]
    segment = files[0]
    assert segment["error"] is None and segment["validBytes"] == segment["size"]
    assert [b["baseOffset"] for b in segment["batches"]] == [0, 1]
    assert segment["batches"][1]["records"][0] == {
        "offset": 1,
        "keySize": 3,
        "valueSize": 12,
        **{k: v for k, v in segment["batches"][1]["records"][0].items() if k == "payload"},
    }


def test_dump_reports_damage_instead_of_failing(tmp_path: Path) -> None:
    directory = _make_log_dir(tmp_path)
    segment = directory / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF
    segment.write_bytes(bytes(data))
    dump = dump_file(segment)
    assert len(dump["batches"]) == 1
    assert "CRC mismatch" in dump["error"]
    result = runner.invoke(app, ["metadata", "dump", "--log-dir", str(directory)])
    assert result.exit_code == 0
    assert "Found invalid data at position 106" in result.output


def test_registered_decoders_describe_data_records(tmp_path: Path) -> None:
    directory = _make_log_dir(tmp_path)

    def decoder(key: bytes | None, value: bytes | None) -> dict[str, Any] | None:
        return {"decoded": value.decode()} if key == b"key" and value else None

    register_record_decoder(decoder)
    try:
        dump = dump_file(directory / "00000000000000000000.log")
    finally:
        unregister_record_decoder(decoder)
    assert dump["batches"][1]["records"][0]["payload"] == {"decoded": "opaque-value"}


def test_dump_of_a_missing_or_empty_directory_is_a_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["metadata", "dump", "--log-dir", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: --log-dir {tmp_path / 'missing'}: not a directory"
    result = runner.invoke(app, ["metadata", "dump", "--log-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no segment" in result.stderr


def test_dump_given_the_metadata_log_dir_root_uses_its_metadata_partition(tmp_path: Path) -> None:
    _make_log_dir(tmp_path)
    result = runner.invoke(app, ["metadata", "dump", "--log-dir", str(tmp_path), "--headers-only"])
    assert result.exit_code == 0, result.output
    assert f"{METADATA_LOG_DIR_NAME}/00000000000000000000.log" in result.output
    assert "| offset" not in result.output
