"""The image store's partition rows, built in one loop (session 18): the same rows, digests and ELR rows as
the session-17 generator — kept here (``_reference``) as the definition — and a list's text is the JSON the
load parses, for any length.  Written in multi-row statements (session 18): the same table contents as one
row a statement, each paced step at most ``chunk_rows`` rows, every row of a source written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.metadata import store as store_module
from kraft.metadata.chunked import CHUNK, chunks_of, with_changes
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.store import SqliteImageStore

# --- the session-17 code, verbatim but for names -----------------------------------------------------------


def _reference_ids(values: Any) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def _reference_row(
    texts: dict[tuple[int, ...], str], topic_id: str, partition_id: int, partition: PartitionRegistration
) -> tuple[Any, ...]:
    replicas, isr, leader, leader_epoch, partition_epoch, _, _, _, _ = partition
    replicas_text = texts.get(replicas)
    if replicas_text is None:
        replicas_text = texts[replicas] = _reference_ids(replicas)
    if isr is replicas:
        isr_text = replicas_text
    else:
        isr_text = texts.get(isr) or texts.setdefault(isr, _reference_ids(isr))
    return (topic_id, partition_id, leader, leader_epoch, partition_epoch, replicas_text, isr_text)


def _reference_has_elr(partition: PartitionRegistration) -> bool:
    return bool(
        partition.elr
        or partition.last_known_elr
        or partition.leader_recovery_state
        or partition.last_unclean_leader_epoch
    )


def _reference_elr_row(topic_id: str, partition_id: int, partition: PartitionRegistration) -> tuple[Any, ...]:
    return (
        topic_id,
        partition_id,
        _reference_ids(partition.elr),
        _reference_ids(partition.last_known_elr),
        partition.leader_recovery_state,
        partition.last_unclean_leader_epoch,
    )


def _reference(
    changed: list[tuple[TopicImage, TopicImage | None]],
    sums: Any,
    elr_rows: list[tuple[Any, ...]],
    elr_gone: list[tuple[str, int]],
) -> Iterator[tuple[Any, ...]]:
    texts: dict[tuple[int, ...], str] = {}
    for topic, before in changed:
        topic_id = topic.topic_id
        key = store_module._topic_key(topic_id)
        old_chunks = chunks_of(before.partitions) if before is not None else ()
        count = total = 0
        for c, chunk in enumerate(chunks_of(topic.partitions)):
            old = old_chunks[c] if c < len(old_chunks) else ()
            if chunk is old:
                continue
            n_old = len(old)
            first = c * CHUNK
            for offset, partition in enumerate(chunk):
                partition_id = first + offset
                if offset < n_old:
                    was = old[offset]
                    if was is partition:
                        continue
                    total -= store_module._partition_digest(key, partition_id, was)
                    count -= 1
                    if _reference_has_elr(was) and not _reference_has_elr(partition):
                        elr_gone.append((topic_id, partition_id))
                total += hash((key, partition_id, partition))
                count += 1
                if _reference_has_elr(partition):
                    elr_rows.append(_reference_elr_row(topic_id, partition_id, partition))
                yield _reference_row(texts, topic_id, partition_id, partition)
        sums.add_digests(count, total)


# --- images: a base and a changed version ------------------------------------------------------------------

_IDS = st.lists(st.integers(0, 3_000), max_size=20).map(tuple)  # 17-20: past the formats (the join path)


@st.composite
def _registration(draw: st.DrawFn) -> PartitionRegistration:
    replicas = draw(_IDS)
    isr_kind = draw(st.sampled_from(["same", "equal copy", "other"]))
    if isr_kind == "same":
        isr = replicas
    elif isr_kind == "equal copy":  # an equal tuple, another object (an image not built by replay)
        isr = tuple(list(replicas))
    else:
        isr = draw(_IDS)
    rare = draw(st.booleans())
    return PartitionRegistration(
        replicas,
        isr,
        draw(st.integers(-1, 3_000)),
        draw(st.integers(0, 2**31 - 1)),
        draw(st.integers(0, 2**31 - 1)),
        draw(_IDS) if rare else (),
        draw(_IDS) if rare else (),
        draw(st.sampled_from([0, 1])) if rare else 0,
        draw(st.integers(0, 50)) if rare else 0,
    )


@st.composite
def _images(draw: st.DrawFn) -> tuple[MetadataImage, MetadataImage]:
    """A base image (topics of 1, 3 or CHUNK + 7 partitions: a big one is chunked) and a version of it as a
    delta leaves it: some topics kept as they are, others with partitions changed or appended (their
    untouched chunks shared), new topics."""
    pool = draw(st.lists(_registration(), min_size=1, max_size=8))
    pick = st.sampled_from(pool)
    sizes = draw(st.lists(st.sampled_from([1, 3, CHUNK + 7]), min_size=1, max_size=3))
    topics: dict[str, TopicImage] = {}
    for t, size in enumerate(sizes):
        topic_id = f"topic-{t:02d}-xxxxxxxxxxxx"  # as long as a real topic id (22 characters)
        rotation = draw(st.integers(0, len(pool) - 1))
        topics[topic_id] = TopicImage(
            topic_id, topic_id, [pool[(i + rotation) % len(pool)] for i in range(size)]
        )
    base = _image(topics, 10)
    updated = dict(topics)
    for topic_id, topic in topics.items():
        if draw(st.booleans()):
            continue  # kept: the same TopicImage object
        length = len(topic.partitions) + draw(st.integers(0, 2))
        changes = {
            draw(st.integers(0, length - 1)): draw(st.one_of(pick, _registration()))
            for _ in range(draw(st.integers(0, 6)))
        }
        changes.update({p: draw(pick) for p in range(len(topic.partitions), length)})  # appended
        updated[topic_id] = TopicImage(topic.name, topic_id, with_changes(topic.partitions, changes, length))
    for t in range(draw(st.integers(0, 2))):
        updated[f"new-{t}"] = TopicImage(
            f"new-{t}", f"new-{t}", [draw(pick) for _ in range(draw(st.integers(1, 5)))]
        )
    return base, _image(updated, 20)


def _image(topics: dict[str, TopicImage], offset: int) -> MetadataImage:
    return MetadataImage(
        offset=offset,
        epoch=1,
        brokers={},
        topics_by_id=topics,
        topic_ids_by_name={t.name: tid for tid, t in topics.items()},
        configs={},
        features={},
        acls={},
    )


def _changed(base: MetadataImage, image: MetadataImage) -> list[tuple[TopicImage, TopicImage | None]]:
    return [
        (topic, base.topics_by_id.get(topic_id))
        for topic_id, topic in image.topics_by_id.items()
        if base.topics_by_id.get(topic_id) is not topic
    ]


@settings(max_examples=300, deadline=None)
@given(_images())
def test_rows_digests_and_elr_rows_equal_the_session_17_generator(images: tuple[MetadataImage, ...]) -> None:
    base, image = images
    for previous, current in ((MetadataImage.empty(), base), (base, image), (image, base)):
        changed = _changed(previous, current)
        sums, reference_sums = store_module._RowSum(), store_module._RowSum()
        rows: tuple[list[tuple[Any, ...]], list[tuple[str, int]]] = ([], [])
        reference: tuple[list[tuple[Any, ...]], list[tuple[str, int]]] = ([], [])
        built = list(store_module._changed_partition_rows(changed, sums, *rows))
        assert built == list(_reference(changed, reference_sums, *reference))
        assert rows == reference
        assert (sums.count, sums.total) == (reference_sums.count, reference_sums.total)


@pytest.mark.parametrize("length", range(25))
def test_a_list_text_is_the_json_the_load_parses(length: int) -> None:
    ids = tuple(range(10**length % 9_973, 10**length % 9_973 + 7 * length, 7))
    text = store_module._ids(ids)
    assert text == json.dumps(list(ids), separators=(",", ":")) == _reference_ids(ids)
    assert store_module._parse_ids(text) == ids


async def test_a_chunked_topic_changed_in_place_loads_back_equal(tmp_path: Path) -> None:
    replicas = (1, 2, 3)
    base = _image(
        {"T": TopicImage("t", "T", [PartitionRegistration(replicas, replicas, 1, 0, 0)] * (CHUNK + 5))}, 10
    )
    parts = list(base.topics_by_id["T"].partitions)
    parts[3] = PartitionRegistration(replicas, (2, 3), 2, 1, 1)
    parts[CHUNK + 1] = PartitionRegistration((3, 2, 1) * 6, (3,), 3, 1, 1, (3,), (1,), 1, 1)
    changes = {3: parts[3], CHUNK + 1: parts[CHUNK + 1]}
    image = _image({"T": TopicImage("t", "T", with_changes(base.topics_by_id["T"].partitions, changes))}, 20)
    store = await SqliteImageStore.open(tmp_path / "image.sqlite", clock=ManualClock())
    try:
        await store.save(base)
        await store.save(image)
    finally:
        await store.close()
    store = await SqliteImageStore.open(tmp_path / "image.sqlite", clock=ManualClock())
    try:
        loaded = await store.load()
    finally:
        await store.close()
    assert store.discarded is None
    assert list(loaded.topics_by_id["T"].partitions) == parts


# --- multi-row statements ----------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 4, 5, 6, 10, 11, 23])
def test_flat_groups_keep_every_row_in_order(count: int) -> None:
    rows = [(f"t{i}", i, -i) for i in range(count)]
    state = store_module._Grouping()
    groups = list(store_module._flat_groups(iter(rows), 5, state))
    assert state.done and state.taken == count
    assert all(len(group) == 5 * 3 for group in groups)
    flat = [value for group in groups for value in group] + [value for row in state.rest for value in row]
    assert flat == [value for row in rows for value in row]
    assert len(state.rest) == count % 5


def _big(topics: int, per_topic: int, elr_every: int = 0) -> MetadataImage:
    """``topics`` topics of ``per_topic`` partitions (varied lists; every ``elr_every``-th with an ELR)."""
    made: dict[str, TopicImage] = {}
    for t in range(topics):
        topic_id = f"big-{t:02d}-xxxxxxxxxxxxxx"
        parts = []
        for p in range(per_topic):
            replicas = (1 + (p + t) % 9, 10 + p % 7, 20 + t)
            elr = bool(elr_every) and p % elr_every == 0
            parts.append(
                PartitionRegistration(
                    replicas,
                    replicas[:2] if elr else replicas,
                    replicas[0],
                    t,
                    p,
                    replicas[2:] if elr else (),
                )
            )
        made[topic_id] = TopicImage(f"big{t}", topic_id, parts)
    return _image(made, 10)


async def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        return {
            table: sorted(await store._db.execute_fetchall(f"SELECT * FROM {table}"))  # type: ignore[arg-type]
            for table in ("topics", "partitions", "partition_elr")
        }
    finally:
        await store.close()


async def test_multi_row_steps_hold_at_most_chunk_rows_and_write_what_one_row_statements_do(
    tmp_path: Path,
) -> None:
    first = _big(7, 150)  # 1,050 partition rows: 142 a statement, two statements a step of 300 rows
    second = _image(dict(_big(6, 150, elr_every=3).topics_by_id), 20)  # 300 ELR rows: 166 a statement
    steps: list[int] = []
    paced = await SqliteImageStore.open(tmp_path / "paced.sqlite", clock=ManualClock())
    paced.chunk_rows = 300
    seen = [0]

    async def step(_seconds: float) -> None:
        steps.append(paced.last_save_rows - seen[0])
        seen[0] = paced.last_save_rows

    paced.pause = step
    try:
        await paced.save(first)
        steps.append(paced.last_save_rows - seen[0])
        assert paced.last_save_rows == 7 + 1_050
        assert steps == [
            7 + 284,
            284,
            284,
            198,
        ]  # the topics rows (one short statement), then 142 + 142 a step
        steps.clear()
        seen[0] = 0
        await paced.save(second)
        assert steps and all(0 < rows <= 300 for rows in steps)
    finally:
        await paced.close()
    one_row = await SqliteImageStore.open(tmp_path / "one.sqlite", clock=ManualClock())
    one_row.chunk_rows = 1  # one row a statement
    try:
        await one_row.save(first)
        await one_row.save(second)
    finally:
        await one_row.close()
    dumped = await _dump(tmp_path / "paced.sqlite")
    assert dumped == await _dump(tmp_path / "one.sqlite")
    assert len(dumped["partitions"]) == 900 and len(dumped["partition_elr"]) == 300
    store = await SqliteImageStore.open(tmp_path / "paced.sqlite", clock=ManualClock())
    try:
        loaded = await store.load()
    finally:
        await store.close()
    assert store.discarded is None and loaded == second
