"""The ``replication-offset-checkpoint`` file (kraft.broker.hwm_checkpoint): verified on read (a damaged
file is detected, logged and never used), written once per log dir for all of its partitions, only when
something changed, off the event loop and in order."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from kraft.broker import hwm_checkpoint
from kraft.broker.types import TopicPartition
from kraft.observability.logging import KeyValueFormatter

ENTRIES = {
    (TopicPartition("orders", 0), "id-orders"): 1_200,
    (TopicPartition("orders", 1), "id-orders"): 0,
    (TopicPartition("a.b_c-d", 17), "id-abc"): 9_876_543_210,
}


def test_a_checkpoint_round_trips_with_its_checksum(tmp_path: Path) -> None:
    data = hwm_checkpoint.encode(ENTRIES)
    assert data.startswith(b"2\n3\n") and data.splitlines()[-1].startswith(b"crc32c ")
    hwm_checkpoint.write(tmp_path, ENTRIES)
    assert hwm_checkpoint.read_checked(tmp_path) == (ENTRIES, "")
    assert hwm_checkpoint.read_checked(tmp_path / "none") == ({}, "missing")


def test_a_version_1_file_of_an_earlier_build_is_still_read_strictly(tmp_path: Path) -> None:
    assert hwm_checkpoint.decode(b"1\n1\norders 0 7 id-orders\n") == {
        (TopicPartition("orders", 0), "id-orders"): 7
    }
    for bad in (
        b"1\n2\norders 0 7 id-orders\n",  # torn: fewer lines than announced
        b"1\n1\norders 0 -7 id-orders\n",  # a negative offset
        b"1\n1\norders 0 07 id-orders\n",  # a leading zero
        b"1\n1\norders 0 7\n",  # no topic id
        b"1\n2\norders 0 7 x\norders 0 8 x\n",  # the same partition twice
        b"1\n1\norders 0 7 x",  # no final newline
    ):
        with pytest.raises(ValueError):
            hwm_checkpoint.decode(bad)


def _damaged_versions(data: bytes) -> list[tuple[str, bytes]]:
    """Every single-bit flip, every truncation, every zeroed run of 1 to 8 bytes, a few extensions."""
    out: list[tuple[str, bytes]] = []
    for at in range(len(data)):
        for bit in range(8):
            out.append((f"flip {at}.{bit}", data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]))
        out.append((f"truncate {at}", data[:at]))
        for length in range(1, 9):
            out.append(
                (f"zero {at}+{length}", data[:at] + bytes(min(length, len(data) - at)) + data[at + length :])
            )
    for suffix in (b"\n", b"0", b"orders 2 5 id-orders\n", bytes(4096)):
        out.append((f"extend {suffix[:8]!r}", data + suffix))
    return out


def test_every_damaged_checkpoint_is_refused_never_read_as_other_values() -> None:
    original = hwm_checkpoint.encode(ENTRIES)
    damaged = _damaged_versions(original)
    assert len(damaged) > 10 * len(original)
    for what, data in damaged:
        if data == original:  # zeroing bytes that were zero already changes nothing
            continue
        with pytest.raises((ValueError, UnicodeDecodeError)):
            hwm_checkpoint.decode(data)
            pytest.fail(f"{what}: accepted")


def test_an_offset_damaged_into_another_digit_is_caught_by_the_checksum(tmp_path: Path) -> None:
    """The damage a strict parse alone would accept: 1200 → 9200 is still a well-formed offset."""
    data = hwm_checkpoint.encode(ENTRIES)
    (tmp_path / hwm_checkpoint.FILE_NAME).write_bytes(data.replace(b"orders 0 1200", b"orders 0 9200"))
    entries, problem = hwm_checkpoint.read_checked(tmp_path)
    assert entries == {} and problem.startswith("crc32c mismatch")


def test_an_unusable_checkpoint_is_logged_with_the_file_and_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / hwm_checkpoint.FILE_NAME).write_bytes(b"2\n1\norders 0 7 x\n")
    caplog.set_level(logging.WARNING, logger="kraft")
    assert hwm_checkpoint.read(tmp_path) == {}
    lines = [
        KeyValueFormatter().format(r) for r in caplog.records if r.getMessage() == "hwm_checkpoint_unusable"
    ]
    assert len(lines) == 1 and hwm_checkpoint.FILE_NAME in lines[0] and "crc32c" in lines[0]
    caplog.clear()
    assert hwm_checkpoint.read(tmp_path / "fresh") == {}  # no file yet: nothing to say
    assert not [r for r in caplog.records if r.getMessage() == "hwm_checkpoint_unusable"]


async def test_the_writer_writes_only_changed_dirs_and_the_shutdown_write_comes_last(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    writer = hwm_checkpoint.CheckpointWriter()
    first = {a: dict(ENTRIES), b: {}}
    assert await writer.write_changed(first) == 2
    assert await writer.write_changed({a: dict(ENTRIES), b: {}}) == 0  # idle: nothing rewritten
    moved = {**ENTRIES, (TopicPartition("orders", 1), "id-orders"): 5}
    assert await writer.write_changed({a: moved, b: {}}) == 1
    assert hwm_checkpoint.read_checked(a).entries == moved
    assert hwm_checkpoint.read_checked(b) == ({}, "")

    # A periodic write cancelled mid-flight (the broker stopping) still finishes on its thread; the
    # shutdown write waits for it, so the newest values are the ones left on disk.
    newer = {**moved, (TopicPartition("orders", 1), "id-orders"): 6}
    newest = {**moved, (TopicPartition("orders", 1), "id-orders"): 7}
    task = asyncio.ensure_future(writer.write_changed({a: newer, b: {}}))
    await asyncio.sleep(0)
    task.cancel()
    assert writer.write_now({a: newest, b: {}}) == 1
    assert hwm_checkpoint.read_checked(a).entries == newest
    assert not (a / (hwm_checkpoint.FILE_NAME + ".tmp")).exists()
