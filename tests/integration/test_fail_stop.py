"""Fail-stop of real controller processes (issue #14): a controller that cannot do its job exits non-zero
with one ``event=fatal`` line instead of lingering (disk full) or leading with an empty image (a committed
batch that fails its CRC)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tmpfs import fill, small_tmpfs

from kraft.cluster.quorum import QuorumFactory
from kraft.metadata.records import encode_value, wrap
from kraft.node.supervisor import EXIT_FATAL
from kraft.storage.log import METADATA_LOG_DIR_NAME, SegmentedLog
from kraft.storage.quorum_state import QuorumState, QuorumStateStore
from kraft.v1 import metadata_pb2 as mpb

pytestmark = pytest.mark.integration

METADATA_LAYER = {
    # Rolls a segment every few no-op records, so a full disk is hit within a second or two.
    "metadata.log.segment.bytes": "1024",
    "metadata.max.idle.interval.ms": "50",
}


def fatal_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if " event=fatal " in line]


def test_a_controller_whose_disk_fills_up_exits_with_one_fatal_line(
    quorum_factory: QuorumFactory, tmp_path: Path
) -> None:
    quorum = quorum_factory(size=1, overrides=METADATA_LAYER, test_append=False)
    node_dir = quorum.base_dir / "node1"
    with small_tmpfs(node_dir, "16m"):
        quorum.start()
        node = quorum.nodes[1]
        quorum.wait_for_leader(timeout_s=30)
        fill(node_dir)
        code = node.wait_exit(timeout_s=30)
        quorum.close()
    assert code == EXIT_FATAL, node.log_tail(40)
    [line] = fatal_lines(node.log_path)
    # Whichever write meets the full disk first: usually the Raft log (a segment rolls every few no-ops),
    # under load the image store (a save every 500 ms; SQLite says SQLITE_FULL, at start while opening it).
    # Either way one line naming what failed and why — never a traceback and exit 1.
    if "reason=image_store_write_failed" in line:
        assert "sqlite_error=SQLITE_FULL" in line or "errno=ENOSPC" in line, line
        assert "metadata-image.sqlite" in line, line
    else:
        assert "reason=raft_driver_failed" in line, line
        assert "errno=ENOSPC" in line, line
    assert "exit_code=70" in line
    assert "Traceback" not in node.log_path.read_text(errors="replace"), node.log_tail(40)


def test_a_controller_with_a_corrupt_committed_batch_exits_instead_of_leading(
    quorum_factory: QuorumFactory,
) -> None:
    quorum = quorum_factory(size=1, overrides=METADATA_LAYER, test_append=False)
    quorum.start()
    node = quorum.nodes[1]
    quorum.wait_for_leader(timeout_s=30)
    assert quorum.terminate(1) == 0
    segment = node.metadata_dir / METADATA_LOG_DIR_NAME / "00000000000000000000.log"
    with segment.open("r+b") as out:
        # Byte 30 of the first batch is in its base timestamp: only the batch CRC can notice the flip.
        out.seek(30)
        byte = out.read(1)
        out.seek(30)
        out.write(bytes([byte[0] ^ 0xFF]))
        out.flush()
        os.fsync(out.fileno())
    node.start()
    code = node.wait_exit(timeout_s=30)
    text = node.log_path.read_text(errors="replace")
    assert code != 0, node.log_tail(40)
    fatal = fatal_lines(node.log_path)
    if code == EXIT_FATAL:
        # Detected while replaying the committed log (the state machine can never get past it).
        [line] = fatal
        assert "reason=raft_listener_failed" in line, line
    else:
        # Detected when the log was opened (storage verification): one `error:` line, exit 1.
        assert code == 1 and not fatal
        assert any(line.startswith("error:") for line in text.splitlines()), node.log_tail(40)
    assert "event=controller_activated" not in text.split("--- start node 1")[-1]


def test_a_controller_whose_committed_log_holds_a_record_that_does_not_apply_exits(
    quorum_factory: QuorumFactory,
) -> None:
    """Issue #14: a batch with a valid CRC whose record cannot be applied to the image (here a partition
    change for a topic that never existed).  Skipping it would lead with an image unlike the log; the
    controller stops with one fatal line naming the record instead."""
    quorum = quorum_factory(size=1, overrides=METADATA_LAYER, test_append=False)
    quorum.start()
    node = quorum.nodes[1]
    quorum.wait_for_leader(timeout_s=30)
    assert quorum.terminate(1) == 0
    bad = encode_value(wrap(mpb.PartitionChangeRecord(topic_id="never-created", partition_id=0, leader=1)))
    with SegmentedLog.open(node.metadata_dir / METADATA_LOG_DIR_NAME) as log:
        offset = log.append_records([(None, bad)], leader_epoch=log.last_epoch, timestamp_ms=0).first_offset
        log.flush()
    node.start()
    code = node.wait_exit(timeout_s=30)
    text = node.log_path.read_text(errors="replace")
    assert code == EXIT_FATAL, node.log_tail(40)
    [line] = fatal_lines(node.log_path)
    assert "reason=raft_listener_failed" in line and "UnreplayableRecordError" in line, line
    assert f"ending at offset {offset}" in line and "change of unknown partition never-created/0" in line
    assert "event=controller_activated" not in text.split("--- start node 1")[-1]


def test_a_controller_with_an_impossible_stored_epoch_exits_instead_of_answering_unavailable(
    quorum_factory: QuorumFactory,
) -> None:
    quorum = quorum_factory(size=1, test_append=False)
    quorum.prepare()
    node = quorum.nodes[1]
    directory = node.metadata_dir / METADATA_LOG_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    QuorumStateStore(directory).write(QuorumState(leader_epoch=2**31 - 1, leader_id=None, voted_id=None))
    node.start()
    code = node.wait_exit(timeout_s=30)
    assert code != 0, node.log_tail(40)
    text = node.log_path.read_text(errors="replace")
    if code == EXIT_FATAL:  # the driver failed on the epoch overflow at run time
        [line] = fatal_lines(node.log_path)
        assert "reason=raft_driver_failed" in line, line
    else:  # refused at start (impossible stored epoch): one error line, exit 1
        assert code == 1 and any(line.startswith("error:") for line in text.splitlines()), text[-2000:]


def test_a_controller_with_a_flipped_byte_in_its_quorum_state_refuses_to_start(
    quorum_factory: QuorumFactory,
) -> None:
    """Issue #14: a flipped digit in the stored epoch is still valid JSON; its checksum catches it and the
    node stops naming the file, instead of running (or resetting) with an epoch it never had."""
    quorum = quorum_factory(size=1, test_append=False)
    quorum.prepare()
    node = quorum.nodes[1]
    directory = node.metadata_dir / METADATA_LOG_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    store = QuorumStateStore(directory)
    store.write(QuorumState(leader_epoch=1234, leader_id=None, voted_id=None))
    pristine = store.path.read_bytes()
    store.path.write_bytes(pristine.replace(b"1234", b"1334"))
    node.start()
    code = node.wait_exit(timeout_s=30)
    text = node.log_path.read_text(errors="replace")
    assert code == 1, node.log_tail(40)
    [error] = [line for line in text.splitlines() if line.startswith("error:")]
    assert "quorum-state" in error and "CRC-32C mismatch" in error, error
    assert store.path.read_bytes() == pristine.replace(b"1234", b"1334")  # left for the operator
