"""A save's large writes in chunks (issue #17, session 15): ``SqliteImageStore`` writes partitions, topics and
their deletions ``chunk_rows`` rows per statement, pausing between chunks, the whole save still one
transaction.  Paced, it writes the same rows as in one statement; a reader sees the previous save until the
COMMIT; a failure or a cancellation between chunks leaves the previous save, and the next save still
writes what it must.  Real aiosqlite in tmp dirs, a manual clock (the pauses are recorded, never slept)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest
from google.protobuf.message import Message

from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.v1 import metadata_pb2 as pb

TABLES = ("brokers", "topics", "partitions", "partition_elr", "configs", "features", "acls", "meta")


def _apply(image: MetadataImage, payloads: list[Message]) -> MetadataImage:
    delta = MetadataDelta(image)
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), image.offset + 1 + i, 3)
    return delta.apply()


def _first() -> MetadataImage:
    """Three topics of 37, 40 and 23 partitions (100 rows: chunk sizes that divide it and that do not)."""
    payloads: list[Message] = []
    for t, count in enumerate((37, 40, 23)):
        payloads.append(pb.TopicRecord(name=f"t{t}", topic_id=f"T{t}"))
        for p in range(count):
            replicas = [1 + (p + t) % 4, 1 + (p + t + 1) % 4, 1 + (p + t + 2) % 4]
            payloads.append(
                pb.PartitionRecord(
                    partition_id=p, topic_id=f"T{t}", replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
    return _apply(MetadataImage.empty(), payloads)


def _second(image: MetadataImage) -> MetadataImage:
    """``image`` with T1 removed, every other partition of T0 moved (some with an ELR), T0's ELR of
    partition 3 cleared again, and a new topic T3 of 31 partitions."""
    payloads: list[Message] = [pb.RemoveTopicRecord(topic_id="T1")]
    for p in range(0, 37, 2):
        replicas = image.topics_by_id["T0"].partitions[p].replicas
        payloads.append(
            pb.PartitionChangeRecord(
                topic_id="T0",
                partition_id=p,
                leader=replicas[1],
                isr=pb.BrokerIdList(ids=replicas[1:]),
                eligible_leader_replicas=pb.BrokerIdList(ids=replicas[:1] if p % 3 == 0 else []),
            )
        )
    payloads.append(
        pb.PartitionChangeRecord(
            topic_id="T0", partition_id=3, eligible_leader_replicas=pb.BrokerIdList(ids=[])
        )
    )
    payloads.append(pb.TopicRecord(name="t3", topic_id="T3"))
    for p in range(31):
        payloads.append(
            pb.PartitionRecord(partition_id=p, topic_id="T3", replicas=[2, 3], isr=[2, 3], leader=2)
        )
    return _apply(image, payloads)


def _dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table's rows, sorted (read on a connection of its own)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return {table: sorted(db.execute(f"SELECT * FROM {table}").fetchall()) for table in TABLES}


def _state(path: Path) -> tuple[str | None, int, int]:
    """(stored offset, partition rows, topic rows) as another reader of the file sees them now."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        offset = db.execute("SELECT value FROM meta WHERE key = 'offset'").fetchone()
        partitions = db.execute("SELECT count(*) FROM partitions").fetchone()[0]
        topics = db.execute("SELECT count(*) FROM topics").fetchone()[0]
    return (None if offset is None else offset[0], partitions, topics)


async def _saved(path: Path, chunk_rows: int, *images: MetadataImage) -> dict[str, list[tuple[object, ...]]]:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    store.chunk_rows = chunk_rows
    try:
        await store.load()
        for image in images:
            await store.save(image)
    finally:
        await store.close()
    return _dump(path)


async def _load(path: Path) -> MetadataImage:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        image = await store.load()
        assert store.discarded is None
        return image
    finally:
        await store.close()


@pytest.mark.parametrize("chunk_rows", [1, 7, 20, 37, 100])
async def test_a_paced_save_writes_the_same_rows_as_one_statement(tmp_path: Path, chunk_rows: int) -> None:
    first = _first()
    second = _second(first)
    whole = await _saved(tmp_path / "whole.sqlite", 10**9, first, second)
    paced = await _saved(tmp_path / "paced.sqlite", chunk_rows, first, second)
    assert paced == whole
    assert len(paced["partitions"]) == 37 + 23 + 31
    assert 0 < len(paced["partition_elr"]) < 19
    assert await _load(tmp_path / "paced.sqlite") == second


async def test_a_reader_sees_the_previous_save_until_the_paced_save_commits(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    first = _first()
    second = _second(first)
    store = await SqliteImageStore.open(path, clock=_StepClock(4))
    store.chunk_rows = 5
    store.pause_ratio = 0.5
    seen: list[tuple[str | None, int, int]] = []
    pauses: list[float] = []

    async def look(seconds: float) -> None:
        pauses.append(seconds)
        seen.append(_state(path))
        await asyncio.sleep(0)

    store.pause = look
    try:
        await store.load()
        await store.save(first)
        before = _state(path)
        assert before == (str(first.offset), 100, 3)
        seen.clear()
        pauses.clear()
        await store.save(second)
        assert len(seen) >= 10  # the save paused between its chunks
        assert set(seen) == {before}  # and no reader saw any of it before its COMMIT
        assert _state(path) == (str(second.offset), 37 + 23 + 31, 3)
        # each pause is pause_ratio times the chunk's time: the clock moves 4 ms per read, two reads a chunk
        assert set(pauses) == {0.002}
    finally:
        await store.close()
    assert await _load(path) == second


class _StepClock(ManualClock):
    """A manual clock that moves ``step_ms`` each time it is read (a chunk takes that long)."""

    def __init__(self, step_ms: int) -> None:
        super().__init__()
        self._step_ms = step_ms

    def monotonic_ms(self) -> int:
        self.advance(self._step_ms)
        return super().monotonic_ms()


class _Stop(Exception):
    pass


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), asyncio.CancelledError()])
@pytest.mark.parametrize("fail_at", [1, 4, 12])
async def test_a_failure_between_chunks_leaves_the_previous_save(
    tmp_path: Path, failure: BaseException, fail_at: int
) -> None:
    path = tmp_path / "image.sqlite"
    first = _first()
    second = _second(first)
    third = _apply(second, [pb.RemoveTopicRecord(topic_id="T0")])
    store = await SqliteImageStore.open(path, clock=ManualClock())
    store.chunk_rows = 3
    pauses = iter(range(1, 1000))

    async def fail(_seconds: float) -> None:
        if next(pauses) == fail_at:
            raise failure

    try:
        await store.load()
        await store.save(first)
        store.pause = fail
        with pytest.raises(type(failure)):
            await store.save(second)
        assert _state(path) == (str(first.offset), 100, 3)
        # The same store goes on from the previous save: what it saves next is written in full.
        await store.save(third)
    finally:
        await store.close()
    assert await _load(path) == third


async def test_a_failure_between_chunks_leaves_a_store_that_loads_as_the_previous_save(
    tmp_path: Path,
) -> None:
    path = tmp_path / "image.sqlite"
    first = _first()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    store.chunk_rows = 4

    async def fail(_seconds: float) -> None:
        raise _Stop

    try:
        await store.load()
        await store.save(first)
        store.pause = fail
        with pytest.raises(_Stop):
            await store.save(_second(first))
    finally:
        await store.close()  # (as a process that stops there: the open transaction is never committed)
    assert await _load(path) == first
