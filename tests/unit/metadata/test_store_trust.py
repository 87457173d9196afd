"""The image store is a cache, never a source of truth (issue #14): a store that is unreadable, fails its
checksum, has none, or is ahead of the log is discarded (one line) and the image rebuilt from the log."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata import store as store_module
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.node.metadata_layer import discard_store_ahead_of_log
from kraft.v1 import common_pb2
from kraft.v1 import metadata_pb2 as pb

# The same sample image as test_store.py (test modules here are not importable from each other).


def _apply(image: MetadataImage, *payloads: Message) -> MetadataImage:
    delta = MetadataDelta(image)
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), image.offset + 1 + i, 3)
    return delta.apply()


def _sample() -> MetadataImage:
    return _apply(
        MetadataImage.empty(),
        pb.RegisterBrokerRecord(
            broker_id=1,
            incarnation_id="i1",
            broker_epoch=0,
            fenced=False,
            rack="r1",
            log_dirs=["/d"],
            endpoints=[
                common_pb2.Endpoint(name="PLAINTEXT", host="h", port=1, security_protocol="PLAINTEXT")
            ],
            features=[
                pb.BrokerFeature(name="metadata.version", min_supported_version=1, max_supported_version=1)
            ],
        ),
        pb.RegisterBrokerRecord(broker_id=2, incarnation_id="i2", broker_epoch=1, fenced=True),
        pb.TopicRecord(name="t", topic_id="T"),
        pb.PartitionRecord(partition_id=0, topic_id="T", replicas=[1, 2], isr=[1, 2], leader=1),
        pb.PartitionRecord(partition_id=1, topic_id="T", replicas=[2, 1], isr=[2], leader=2),
        pb.ConfigRecord(resource_type=2, resource_name="t", name="retention.ms", value="10"),
        pb.FeatureLevelRecord(name="metadata.version", feature_level=1),
    )


async def _saved(path: Path, *images: MetadataImage) -> None:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        for image in images:
            await store.save(image)
    finally:
        await store.close()


async def _load(path: Path) -> tuple[MetadataImage, str | None]:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        image = await store.load()
        return image, store.discarded
    finally:
        await store.close()


def _edit(path: Path, sql: str) -> None:
    # Closed here, not by the garbage collector (``with connect()`` only commits): an open connection to a
    # file the store then deletes and creates again would be closed at some later, random moment.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(sql)


async def test_incremental_saves_keep_a_valid_checksum(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    first = _sample()
    second = _apply(
        first,
        pb.TopicRecord(name="u", topic_id="U"),
        pb.PartitionRecord(partition_id=0, topic_id="U", replicas=[1], isr=[1], leader=1),
        pb.PartitionChangeRecord(topic_id="T", partition_id=1, leader=1),
        pb.ConfigRecord(resource_type=2, resource_name="t", name="retention.ms", value="20"),
        pb.UnregisterBrokerRecord(broker_id=2, broker_epoch=1),
    )
    third = _apply(second, pb.RemoveTopicRecord(topic_id="T"))
    await _saved(path, first, second, third)
    loaded, discarded = await _load(path)
    assert discarded is None
    assert loaded == third


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        ("UPDATE topics SET name = 'EVIL-orders' WHERE topic_id = 'T'", "a renamed topic"),
        ("UPDATE meta SET value = '999999999' WHERE key = 'offset'", "an offset far ahead"),
        ("UPDATE partitions SET leader = 2 WHERE topic_id = 'T' AND partition_id = 0", "a moved leader"),
        ("DELETE FROM brokers WHERE broker_id = 2", "a deleted row"),
        ("DELETE FROM meta WHERE key = 'checksum'", "no checksum (an older build)"),
    ],
)
async def test_an_edited_store_is_discarded_and_loads_empty(tmp_path: Path, edit: str, what: str) -> None:
    path = tmp_path / "image.sqlite"
    await _saved(path, _sample())
    _edit(path, edit)
    loaded, discarded = await _load(path)
    assert discarded is not None, what
    assert loaded == MetadataImage.empty()
    # Discarded means gone: the next open finds an empty (valid) store, not the damage again.
    again, discarded_again = await _load(path)
    assert discarded_again is None and again == MetadataImage.empty()
    # And it works as a store again.
    await _saved(path, _sample())
    assert (await _load(path)) == (_sample(), None)


async def test_an_unreadable_store_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    loaded, discarded = await _load(path)
    assert loaded == MetadataImage.empty() and discarded is None  # discarded at open, then empty
    await _saved(path, _sample())
    assert (await _load(path))[0] == _sample()


async def test_a_controller_store_ahead_of_its_log_is_deleted_before_it_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    image = _sample()  # offset 6
    await _saved(path, image)
    assert SqliteImageStore.stored_offset(path) == image.offset
    assert not discard_store_ahead_of_log(path, log_end_offset=image.offset + 1)  # consistent: kept
    assert path.exists()
    assert discard_store_ahead_of_log(path, log_end_offset=image.offset)  # the log never had offset 6
    assert not path.exists() and SqliteImageStore.stored_offset(path) is None
    assert not discard_store_ahead_of_log(None, 0)


def test_the_checksum_verifies_in_another_process_with_another_hash_seed(tmp_path: Path) -> None:
    """Partition digests use ``hash()`` of ints and tuples only: independent of ``PYTHONHASHSEED``."""
    path = tmp_path / "image.sqlite"
    asyncio.run(_saved(path, _sample()))
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from kraft.clock import SystemClock\n"
        "from kraft.metadata.store import SqliteImageStore\n"
        "async def main():\n"
        "    store = await SqliteImageStore.open(Path(sys.argv[1]), clock=SystemClock())\n"
        "    image = await store.load()\n"
        "    await store.close()\n"
        "    print(store.discarded, image.offset, len(image.topics_by_id))\n"
        "asyncio.run(main())\n"
    )
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["None", str(_sample().offset), "1"], done.stdout


# --- byte-level damage of the file (issue #14's corruption suite) ----------------------------------


def _bigger_sample() -> MetadataImage:
    """The sample with enough partitions and configs to spread over several SQLite pages (a damaged
    byte then lands in table data, b-tree structure, the header or free space alike)."""
    payloads: list[Message] = []
    for t in range(6):
        topic_id = f"topic-{t}"
        payloads.append(pb.TopicRecord(name=f"orders-{t}", topic_id=topic_id))
        for p in range(40):
            replicas = [1 + (p % 2), 2 - (p % 2)]
            payloads.append(
                pb.PartitionRecord(
                    partition_id=p, topic_id=topic_id, replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
        payloads.append(
            pb.ConfigRecord(resource_type=2, resource_name=f"orders-{t}", name="x", value="y" * 50)
        )
    return _apply(_sample(), *payloads)


@functools.cache
def _pristine_store() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "image.sqlite"
        asyncio.run(_saved(path, _bigger_sample()))
        # Closed cleanly: the WAL was checkpointed into the file and removed.
        assert not Path(f"{path}-wal").exists()
        return path.read_bytes()


def _damaged(pristine: bytes, kind: str, position: int, length: int, mask: int) -> bytes:
    data = bytearray(pristine)
    if kind == "flip":
        data[position] ^= mask
    elif kind == "zero":
        data[position : position + length] = bytes(len(data[position : position + length]))
    elif kind == "truncate":
        del data[position:]
    else:  # extend: garbage after the last page (a torn or misdirected write)
        data += bytes([mask]) * length
    return bytes(data)


async def _load_and_rebuild(path: Path) -> tuple[str, MetadataImage]:
    """What a node does with its store: open and load it, then save the next image (incrementally
    when the load verified, in full when it was discarded) — and the next start loads exactly that."""
    expected = _bigger_sample()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        loaded = await store.load()
        if loaded == expected:
            assert store.discarded is None
            outcome = "verified"
        else:
            # Discarded (at open: unreadable; at load: checksum or consistency) — never anything between.
            assert loaded == MetadataImage.empty(), f"served a damaged image at offset {loaded.offset}"
            outcome = "discarded"
        # Damage load never reads (an index page) shows up here: the save starts the file afresh.
        later = _apply(
            expected if outcome == "verified" else MetadataImage.empty(),
            pb.TopicRecord(name="later", topic_id="topic-later"),
            pb.PartitionRecord(partition_id=0, topic_id="topic-later", replicas=[1], isr=[1], leader=1),
        )
        await store.save(later)
    finally:
        await store.close()
    assert await _load(path) == (later, None)
    return outcome, loaded


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(("flip", "zero", "truncate", "extend")),
    mask=st.integers(1, 255),
    length=st.integers(1, 4096),
    data=st.data(),
)
def test_byte_damage_anywhere_in_the_file_is_verified_or_discarded_never_served(
    kind: str, mask: int, length: int, data: st.DataObject
) -> None:
    pristine = _pristine_store()
    # Positions drawn over the whole file: header, b-tree pages, table rows, free space.
    position = data.draw(st.integers(0, len(pristine) - 1), label="position")
    damaged = _damaged(pristine, kind, position, length, mask)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "image.sqlite"
        path.write_bytes(damaged)
        asyncio.run(_load_and_rebuild(path))


@pytest.mark.parametrize("kind", ["flip", "zero", "truncate", "extend"])
def test_damage_in_every_page_is_verified_or_discarded(kind: str) -> None:
    """Deterministic sweep next to the hypothesis test: one damage in the middle of every page (page
    size from the header), so every table's pages and the schema page are hit at least once."""
    pristine = _pristine_store()
    page_size = int.from_bytes(pristine[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = len(pristine) // page_size
    assert pages >= 5, pages
    outcomes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for page in range(pages):
            position = page * page_size + page_size // 2
            damaged = _damaged(pristine, kind, position, 64, 0x5A)
            path = Path(tmp) / f"image-{page}.sqlite"
            path.write_bytes(damaged)
            outcome, _ = asyncio.run(_load_and_rebuild(path))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if kind in ("flip", "zero", "truncate"):
        # Damage inside table data must be noticed somewhere (a page in the middle of the file is data).
        assert outcomes.get("discarded", 0) >= 1, outcomes


@pytest.mark.parametrize("structure_check", [True, False], ids=["found-at-load", "found-by-the-save"])
def test_a_damaged_index_page_that_load_never_reads_is_rebuilt_by_the_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, structure_check: bool
) -> None:
    """The topic-name index is not read by a load (its checksum covers rows, not indexes).  The load's
    structural check (``PRAGMA quick_check``) finds the damaged page and discards the store.  Without it
    (damage after the load: the check is switched off here) the next save met "database disk image is
    malformed" and — a failed save is fatal on a controller — the node stopped at every restart; the save
    starts the file afresh."""
    if not structure_check:

        async def unchecked(db: object) -> None:
            return None

        monkeypatch.setattr(store_module, "_check_structure", unchecked)
    pristine = _pristine_store()
    path = tmp_path / "image.sqlite"
    path.write_bytes(pristine)
    with contextlib.closing(sqlite3.connect(path)) as db:
        (root,) = db.execute(
            "SELECT rootpage FROM sqlite_master WHERE tbl_name = 'topics' AND type = 'index'"
        ).fetchone()
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    damaged = bytearray(pristine)
    start = (root - 1) * page_size
    # The cell content (the index keys) sits at the end of the page: zero its second half.
    damaged[start + page_size // 2 : start + page_size] = bytes(page_size // 2)
    path.write_bytes(bytes(damaged))
    outcome, loaded = asyncio.run(_load_and_rebuild(path))
    if structure_check:
        assert outcome == "discarded"
    else:
        assert outcome == "verified" and loaded == _bigger_sample()


def test_a_damaged_meta_cell_pointer_is_discarded_and_the_next_save_verifies() -> None:
    """Regression (found by the byte-damage property above, position 4110, one bit): a flipped bit in a
    cell pointer of the meta table's page (page 2: header of 8 bytes, then 2-byte cell pointers) reads back
    as an extra all-NULL meta row; the load verified (the checksum does not cover the table's structure)
    and the next save wrote a store that failed its checksum on the following start."""
    pristine = _pristine_store()
    page_size = int.from_bytes(pristine[16:18], "big")
    assert pristine[page_size] == 0x0D, "page 2 is the meta table's leaf page"
    position = page_size + 8 + 2 * 3  # the fourth cell's pointer (updated_at_ms)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "image.sqlite"
        path.write_bytes(_damaged(pristine, "flip", position, 1, 1))
        outcome, _ = asyncio.run(_load_and_rebuild(path))
    assert outcome == "discarded"


def _with_root_page_moved(pristine: bytes, index: str, tmp: Path) -> bytes:
    """``pristine`` with one bit of ``index``'s root page number in ``sqlite_master`` flipped so that it
    names the page of the object after it (found by trying the bytes of page 1 that hold the number)."""
    probe = tmp / "probe.sqlite"
    probe.write_bytes(pristine)
    with contextlib.closing(sqlite3.connect(probe)) as db:
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    for position in range(100, page_size):
        if pristine[position] != root:
            continue
        damaged = _damaged(pristine, "flip", position, 1, root ^ (root + 1))
        probe.write_bytes(damaged)
        try:
            with contextlib.closing(sqlite3.connect(probe)) as db:
                row = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
        except sqlite3.DatabaseError:
            continue  # a byte of another field: the schema no longer parses
        if row == (root + 1,):
            return damaged
    raise AssertionError(f"no byte of page 1 holds {index}'s root page")


def test_an_index_root_page_pointing_at_another_table_is_discarded_at_load(tmp_path: Path) -> None:
    """Regression (found by the byte-damage property, position 2383, one bit): the flip made the features
    index's root page the ``acls`` table's.  The load reads tables, not indexes, and verified; the next
    save wrote index cells into the acls table, and the following start discarded the store.  The load's
    structural check now discards it at once, and the save after it verifies."""
    damaged = _with_root_page_moved(_pristine_store(), "sqlite_autoindex_features_1", tmp_path)
    path = tmp_path / "image.sqlite"
    path.write_bytes(damaged)
    outcome, _ = asyncio.run(_load_and_rebuild(path))
    assert outcome == "discarded"


def _with_write_version(data: bytes, version: int) -> bytes:
    """``data`` with the header's "file format write version" byte (offset 18; 2 = WAL) set to ``version``."""
    damaged = bytearray(data)
    damaged[18] = version
    return bytes(damaged)


@pytest.mark.parametrize("version", [3, 6, 0x82, 0xFF])
def test_a_header_write_version_above_2_is_discarded_and_the_next_save_verifies(
    tmp_path: Path, version: int
) -> None:
    """Regression (the byte-damage property above, seen once in session 12 as "attempt to write a readonly
    database"): SQLite opens a file whose write version is above 2 read-only.  The rows were intact, so the
    load verified, and the save failed with SQLITE_READONLY — a storage failure, fatal on a controller at
    every restart.  The store now discards such a file when it opens it."""
    path = tmp_path / "image.sqlite"
    path.write_bytes(_with_write_version(_pristine_store(), version))
    outcome, loaded = asyncio.run(_load_and_rebuild(path))
    assert outcome == "discarded" and loaded == MetadataImage.empty()


async def test_an_empty_store_with_a_read_only_header_is_discarded_and_saves(tmp_path: Path) -> None:
    """The same damage in a store that holds no image yet (a load that returns early): the open catches it."""
    path = tmp_path / "image.sqlite"
    await _saved(path)  # tables created, nothing saved
    path.write_bytes(_with_write_version(path.read_bytes(), 7))
    await _saved(path, _sample())
    assert (await _load(path)) == (_sample(), None)
