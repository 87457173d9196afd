"""bench.batch_scan: its three value shapes take the varint widths the raft-performance.md section says they
measure (the inline walk's one- and two-byte paths), and each decodes to the values it was built from."""

from __future__ import annotations

from bench.batch_scan import metadata_values
from kraft.storage.batch import HEADER_SIZE, build_batch, decode_offset_values
from kraft.storage.varint import size_of_varint


def _widths(values: list[bytes]) -> set[tuple[int, int]]:
    """(record length, value length) varint widths of value-only records at offset deltas >= 64."""
    return {(size_of_varint(6 + len(v) + size_of_varint(len(v))), size_of_varint(len(v))) for v in values}


def test_each_shape_takes_the_widths_it_is_named_for() -> None:
    assert _widths(metadata_values("change", 10)) == {(1, 1)}
    assert (2, 1) in _widths(metadata_values("partition", 1000)) <= {(1, 1), (2, 1)}
    assert _widths(metadata_values("partition_dirs", 10)) == {(2, 2)}


def test_a_benched_batch_decodes_to_its_values() -> None:
    for shape in ("change", "partition", "partition_dirs"):
        values = metadata_values(shape, 100)
        batch = build_batch(1000, [(None, v) for v in values], leader_epoch=3, timestamp_ms=1)
        assert len(batch) > HEADER_SIZE
        assert decode_offset_values(batch) == [(1000 + i, v) for i, v in enumerate(values)]
