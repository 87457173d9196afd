"""Offline readers of broker partition logs (``kraft storage dump``, the pipeline's reader and compaction
planner) read every batch a broker can have accepted, including ones above the 8 MiB default cap."""

from __future__ import annotations

import os
from pathlib import Path

from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.types import ProducedRecord
from kraft.pipeline.compact_plan import scan_segment
from kraft.pipeline.decode import iter_file_batches
from kraft.pipeline.layout import SOURCE_LOG, LogFile
from kraft.storage.batch import DEFAULT_MAX_BATCH_BYTES
from kraft.storage.dump import dump_file


def _segment_with_a_big_batch(tmp_path: Path) -> Path:
    log = segmented_log_opener(1 << 30)(tmp_path / "big-0")
    for value in (b"before", os.urandom(DEFAULT_MAX_BATCH_BYTES + 4096), b"after"):
        log.append_records([ProducedRecord(None, value, 1)], 0, None)
    log.close()
    return tmp_path / "big-0" / "00000000000000000000.log"


def test_dump_reads_every_batch(tmp_path: Path) -> None:
    dumped = dump_file(_segment_with_a_big_batch(tmp_path), with_records=False)
    assert dumped.get("error") is None and len(dumped["batches"]) == 3


def test_the_pipeline_reader_and_planner_read_every_batch(tmp_path: Path) -> None:
    path = _segment_with_a_big_batch(tmp_path)
    for last in (True, False):
        log_file = LogFile(str(path), "big", 0, SOURCE_LOG, 0, path.stat().st_size, last)
        data = memoryview(path.read_bytes())
        assert [b.base_offset for _, b in iter_file_batches(log_file, data)] == [0, 1, 2]
        scan = scan_segment(log_file, checkpoint_bytes=1 << 20)
        assert scan.records == 3
