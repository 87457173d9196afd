"""The image store: the applied metadata image and its offset, in SQLite (aiosqlite).

One transaction per save, so the tables and ``meta.offset`` always describe one consistent image; a
restart loads the image and replays only records above that offset.  Saves write only what differs from
the previously saved image (images share unchanged parts, so the diff is found by identity, cheaply).
The tables are plain so an operator can query them (``kraft metadata shell``):

``meta(key PRIMARY KEY, value)``
    ``offset`` (last applied record, -1 = none), ``epoch``, ``schema_version``, ``updated_at_ms``.
``brokers(broker_id PRIMARY KEY, epoch, incarnation_id, rack, fenced, in_controlled_shutdown,
endpoints JSON, features JSON, log_dirs JSON, unclean_shutdown, offline_replicas JSON)``
    one row per registered broker; ``fenced``/``in_controlled_shutdown``/``unclean_shutdown`` are 0/1
    (``unclean_shutdown``: KIP-966, a registration whose data may be gone, kept until its unfence);
    ``offline_replicas``: ``[[topic_id, partition], …]`` sorted, the broker's replicas on a log dir it took
    offline (never elected while there).  The last two columns were added without a schema version change
    (an older build can still open the file): a store whose ``brokers`` lacks one was written by an older
    build, which may have dropped what it did not know of records it replayed, so it is discarded when
    opened and rebuilt from the log (once).
``topics(topic_id PRIMARY KEY, name UNIQUE, partitions)``
``partitions(topic_id, partition_id, leader, leader_epoch, partition_epoch, replicas JSON, isr JSON)``
    primary key (topic_id, partition_id); ``leader`` -1 = offline.  ``replicas``/``isr`` are JSON
    arrays of broker ids (``[1,2,3]``; ``json_each(replicas)`` in SQL).  No secondary index: the bulk
    write of a snapshot is the hot path (an index on ``leader`` doubled it); a scan of 1,000,000 rows
    takes well under a second.
``partition_elr(topic_id, partition_id, elr JSON, last_known_elr JSON, leader_recovery_state,
last_unclean_leader_epoch)``
    KIP-966's eligible leader replicas, KIP-704's recovery state and the leader epoch of the partition's
    latest unclean election (0 = none), one row only for a partition where any differs from its default
    (ELR empty, RECOVERED, 0): nearly always none, so the hot ``partitions`` rows stay as they were.
    Added without a schema version change: a store written before the table has no rows, which is what
    its log held (its partition digests differ, so it is discarded once anyway); one whose table lacks
    ``last_unclean_leader_epoch`` is discarded when opened, like a ``brokers`` table without
    ``unclean_shutdown``.
``configs(resource_type, resource_name, name, value)``
    resource_type 2 = topic, 4 = broker; primary key (resource_type, resource_name, name).
``features(name PRIMARY KEY, level)``
``acls(id PRIMARY KEY, resource_type, resource_name, pattern_type, principal, host, operation,
permission_type)``
    one row per ACL (AccessControlEntryRecord), the enums as Kafka's numbers (kraft.security.acl).  Added
    without a schema version change: a store written before it has no ACL rows, which is what its log held.

The store is a cache, never a source of truth (issue #14): ``meta.checksum`` covers ``offset``, ``epoch``
and every row — an order-independent sum (mod 2^64) of one digest per row, kept up to date incrementally by
:meth:`SqliteImageStore.save`, so a save still writes only what changed. A row's digest is the CRC-32 of its
canonical text, except for partition rows (the hot path: a million of them in a bulk save), whose digest is
Python's ``hash()`` of ``(crc32(topic_id), partition_id, registration)`` — ints and tuples of ints only, so
it does not depend on ``PYTHONHASHSEED``; it may change with the Python version, which just discards the
store once (a cache). (Text CRCs made a bulk save of 200,000 partitions about 3 times slower.)
:meth:`SqliteImageStore.load` recomputes the sum; a store that cannot be read, fails its checksum, has none
(an older build) or is otherwise inconsistent is *discarded* — one ``event=image_store_discarded reason=…``
line, the file deleted and created empty (a damaged page can outlive deleted rows) — and the image is
rebuilt from the log (the controller's local snapshot + log, or
the broker's fetch from the controller). A store *ahead* of the log (an offset the log never committed) is
discarded by the caller, which knows the log: :meth:`SqliteImageStore.discard_file` before opening
(controller: at or above its local log end), or saving the empty image (broker: at or above the controller's
high watermark). A storage failure (:func:`is_storage_failure`: disk full, I/O error) is never a reason to
discard: :meth:`SqliteImageStore.open` and :meth:`SqliteImageStore.load` raise it, and the controller
fail-stops on it (:mod:`kraft.metadata.store_writer`). Pages the rows do not cover (indexes, the schema's
root page numbers, cell pointers) are checked by ``PRAGMA quick_check`` with every load (a few % of the
load's time). Damage arising after the load surfaces as SQLite's "malformed" error on the next save: the
file is started afresh and the whole image written (:meth:`SqliteImageStore.save`), never a reason to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from functools import partial
from itertools import chain, islice
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from kraft.clock import Clock
from kraft.metadata.chunked import CHUNK, chunks_of
from kraft.metadata.elr_holders import ElrHolders
from kraft.metadata.image import (
    BrokerFeatureRange,
    BrokerRegistration,
    ConfigKey,
    Endpoint,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from kraft.metadata.pmap import persistent
from kraft.observability.logging import get_logger
from kraft.observability.thread_names import set_native_name
from kraft.security.acl import AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS brokers (
    broker_id INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    incarnation_id TEXT NOT NULL,
    rack TEXT,
    fenced INTEGER NOT NULL,
    in_controlled_shutdown INTEGER NOT NULL,
    endpoints TEXT NOT NULL,
    features TEXT NOT NULL,
    log_dirs TEXT NOT NULL,
    unclean_shutdown INTEGER NOT NULL DEFAULT 0,
    offline_replicas TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS topics (
    topic_id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id TEXT NOT NULL,
    partition_id INTEGER NOT NULL,
    leader INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    partition_epoch INTEGER NOT NULL,
    replicas TEXT NOT NULL,
    isr TEXT NOT NULL,
    PRIMARY KEY (topic_id, partition_id)
) WITHOUT ROWID;
DROP INDEX IF EXISTS partitions_by_leader;
CREATE TABLE IF NOT EXISTS partition_elr (
    topic_id TEXT NOT NULL,
    partition_id INTEGER NOT NULL,
    elr TEXT NOT NULL,
    last_known_elr TEXT NOT NULL,
    leader_recovery_state INTEGER NOT NULL,
    last_unclean_leader_epoch INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS configs (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (resource_type, resource_name, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS features (name TEXT PRIMARY KEY, level INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS acls (
    id TEXT PRIMARY KEY,
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission_type INTEGER NOT NULL
) WITHOUT ROWID;
"""


IMAGE_STORE_FILE = "metadata-image.sqlite"
"""The store's file name in the metadata dir (controller and broker); `kraft metadata shell` looks for it."""


class ImageStoreError(Exception):
    """The store file is unusable (newer schema, corrupt)."""


_STORAGE_ERROR_CODES = frozenset(
    {sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY}
)


def is_storage_failure(error: BaseException) -> bool:
    """True when ``error`` says the disk failed (an OSError, SQLite's I/O error, disk full, cannot open,
    read-only) rather than that the file holds something unusable: deleting the store fixes the latter,
    never the former (and discarding a good cache on a full disk only hides why the node must stop)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:  # the cause chain: a wrapped OSError counts
        seen.add(id(current))
        if isinstance(current, OSError):
            return True
        code = getattr(current, "sqlite_errorcode", None)
        if isinstance(current, sqlite3.Error) and code is not None and code & 0xFF in _STORAGE_ERROR_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


def storage_error_fields(error: BaseException) -> dict[str, object]:
    """``sqlite_error=SQLITE_FULL`` (the primary result code's name) for a fatal line, when known."""
    name = getattr(error, "sqlite_errorname", None)
    return {} if not isinstance(error, sqlite3.Error) or not name else {"sqlite_error": name}


_MASK64 = (1 << 64) - 1
_log = get_logger("image_store")


def _topic_key(topic_id: str) -> int:
    return zlib.crc32(topic_id.encode())


def _partition_digest(topic_key: int, partition_id: int, partition: PartitionRegistration) -> int:
    # Only ints and tuples of ints: tuple hashing of those is deterministic across processes.
    return hash((topic_key, partition_id, partition))  # a NamedTuple hashes as its tuple


def _row_crc(kind: str, row: Iterable[Any]) -> int:
    """CRC-32 of one row's canonical text (the same whether built from an image or read back)."""
    return zlib.crc32("\x1f".join([kind, *map(str, row)]).encode())


class _RowSum:
    """Order-independent digest of a set of rows: their count and the sum of their CRCs (mod 2^64)."""

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def add(self, kind: str, row: Iterable[Any]) -> None:
        self.count += 1
        self.total = (self.total + _row_crc(kind, row)) & _MASK64

    def remove(self, kind: str, row: Iterable[Any]) -> None:
        self.count -= 1
        self.total = (self.total - _row_crc(kind, row)) & _MASK64

    def add_digests(self, count: int, total: int) -> None:
        self.count += count
        self.total = (self.total + total) & _MASK64

    def copy(self) -> _RowSum:
        other = _RowSum()
        other.count, other.total = self.count, self.total
        return other

    def checksum(self, offset: int, epoch: int) -> str:
        """What ``meta.checksum`` holds for these rows at ``offset``/``epoch``."""
        return f"v1:{zlib.crc32(f'{offset}|{epoch}|{self.count}|{self.total}'.encode()):08x}"


def _config_rows(key: tuple[int, str], values: Mapping[str, str]) -> Iterator[tuple[Any, ...]]:
    for name, value in values.items():
        yield (key[0], key[1], name, value)


def _acl_row(acl_id: str, acl: StandardAcl) -> tuple[Any, ...]:
    return (
        acl_id,
        int(acl.resource_type),
        acl.resource_name,
        int(acl.pattern_type),
        acl.principal,
        acl.host,
        int(acl.operation),
        int(acl.permission),
    )


def _acl_from_row(row: tuple[Any, ...]) -> StandardAcl:
    """ValueError for an enum number this build does not know (the store is then discarded)."""
    _, rtype, name, pattern, principal, host, operation, permission = row
    return StandardAcl(
        ResourceType(rtype),
        name,
        PatternType(pattern),
        principal,
        host,
        AclOperation(operation),
        AclPermissionType(permission),
    )


_IDS_FORMATS = ["[" + ",".join(["%d"] * n) + "]" for n in range(17)]
"""``"[%d,%d,%d]"`` for a list of three ids, and so on up to 16: one ``%`` a list instead of a ``str()`` per
id and a join (a bulk creation meets a new replica list at almost every row; issue #17, session 18)."""


def _ids(values: tuple[int, ...]) -> str:
    """A list of broker ids as its JSON text (``[1,2,3]``, no spaces): what a row holds and ``_parse_ids``
    reads.  ``%d`` writes an int as ``str()`` does."""
    if len(values) < len(_IDS_FORMATS):
        return _IDS_FORMATS[len(values)] % values
    return "[" + ",".join(map(str, values)) + "]"


def _parse_ids(text: str) -> tuple[int, ...]:
    return tuple(json.loads(text))


def _parse_shared(parsed: dict[str, tuple[int, ...]], text: str) -> tuple[int, ...]:
    ids = parsed.get(text)
    if ids is None:
        ids = parsed[text] = _parse_ids(text)
    return ids


def _broker_row(b: BrokerRegistration) -> tuple[Any, ...]:
    return (
        b.broker_id,
        b.epoch,
        b.incarnation_id,
        b.rack,
        int(b.fenced),
        int(b.in_controlled_shutdown),
        json.dumps([[e.name, e.host, e.port, e.security_protocol] for e in b.endpoints]),
        json.dumps([[f.name, f.min_version, f.max_version] for f in b.features]),
        json.dumps(list(b.log_dirs)),
        int(b.unclean_shutdown),
        json.dumps(sorted(b.offline_replicas)),
    )


def _has_elr_row(partition: PartitionRegistration) -> bool:
    """Whether ``partition`` has a ``partition_elr`` row (any of its KIP-966/704 fields off its default): the
    rule :func:`_changed_partition_rows` inlines, on its unpacked fields."""
    return bool(
        partition.elr
        or partition.last_known_elr
        or partition.leader_recovery_state
        or partition.last_unclean_leader_epoch
    )


def _elr_row(topic_id: str, partition_id: int, partition: PartitionRegistration) -> tuple[Any, ...]:
    return (
        topic_id,
        partition_id,
        _ids(partition.elr),
        _ids(partition.last_known_elr),
        partition.leader_recovery_state,
        partition.last_unclean_leader_epoch,
    )


def _changed_partition_rows(
    changed: list[tuple[TopicImage, TopicImage | None]],
    sums: _RowSum,
    elr_rows: list[tuple[Any, ...]],
    elr_gone: list[tuple[str, int]],
) -> Iterator[tuple[Any, ...]]:
    # Images share one tuple per distinct replica list, so each list's text is built once per save
    # (a million rows have a few thousand distinct lists); the text is the same as _ids() gives.
    # ``sums`` is updated as rows are produced (on the SQLite thread, like the rows themselves).
    # The hot loop of a broker's save after bulk work (issue #17, session 18): each changed registration is
    # unpacked once (the ELR tests and the row read the locals), the row is built here rather than by a
    # function per row, a new list's text is one ``%`` (:data:`_IDS_FORMATS`).  Same rows, same digests.
    texts: dict[tuple[int, ...], str] = {}
    formats = _IDS_FORMATS
    n_formats = len(formats)
    for topic, before in changed:
        topic_id = topic.topic_id
        key = _topic_key(topic_id)
        # Versions of a topic share every chunk of partitions no delta touched since (the same tuple
        # object, at the same position): only the other chunks are compared, partition by partition.
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
                was: PartitionRegistration | None = None
                if offset < n_old:
                    was = old[offset]
                    if was is partition:
                        continue
                    total -= hash((key, partition_id, was))  # _partition_digest, inlined (hot loop)
                    count -= 1
                total += hash((key, partition_id, partition))  # _partition_digest, inlined (hot loop)
                count += 1
                replicas, isr, leader, leader_epoch, partition_epoch, elr, lke, recovery, unclean = partition
                if elr or lke or recovery or unclean:  # _has_elr_row(partition), inlined
                    elr_rows.append(_elr_row(topic_id, partition_id, partition))
                # _has_elr_row(was), inlined: its elr, last_known_elr, leader_recovery_state, last_unclean_…
                elif was is not None and (was[5] or was[6] or was[7] or was[8]):
                    elr_gone.append((topic_id, partition_id))
                replicas_text = texts.get(replicas)
                if replicas_text is None:
                    n = len(replicas)
                    replicas_text = texts[replicas] = (
                        formats[n] % replicas if n < n_formats else _ids(replicas)
                    )
                isr_text: str | None = replicas_text
                if isr is not replicas:
                    isr_text = texts.get(isr)
                    if isr_text is None:
                        n = len(isr)
                        isr_text = texts[isr] = formats[n] % isr if n < n_formats else _ids(isr)
                yield (topic_id, partition_id, leader, leader_epoch, partition_epoch, replicas_text, isr_text)
        sums.add_digests(count, total)


def _gone_topic_rows(
    previous: MetadataImage, removed: list[str], sums: _RowSum, gone: list[tuple[str]]
) -> Iterator[tuple[str]]:
    """The ``topics`` rows to delete for ``removed`` (also appended to ``gone``), each one's digest
    subtracted from ``sums`` on the way."""
    for topic_id in removed:
        old = previous.topics_by_id[topic_id]
        sums.remove("t", (old.topic_id, old.name, len(old.partitions)))
        row = (topic_id,)
        gone.append(row)
        yield row


def _changed_topic_rows(
    previous: MetadataImage,
    updated: list[tuple[str, TopicImage]],
    sums: _RowSum,
    changed: list[tuple[TopicImage, TopicImage | None]],
) -> Iterator[tuple[str, str, int]]:
    """The ``topics`` rows of ``updated`` topics, each with its previous version appended to ``changed``
    and the digests moved in ``sums`` on the way."""
    before_of = previous.topics_by_id.get
    for topic_id, topic in updated:
        before = before_of(topic_id)
        if before is not None:
            sums.remove("t", (before.topic_id, before.name, len(before.partitions)))
        row = (topic.topic_id, topic.name, len(topic.partitions))
        sums.add("t", row)
        changed.append((topic, before))
        yield row


def _gone_topic_keys(previous: MetadataImage, gone: list[tuple[str]], sums: _RowSum) -> Iterator[tuple[str]]:
    """``gone`` as it is, each removed topic's partition digests subtracted from ``sums`` on the way."""
    for row in gone:
        topic_id = row[0]
        partitions = previous.topics_by_id[topic_id].partitions
        key = _topic_key(topic_id)
        total = 0
        for partition_id, partition in enumerate(partitions):
            total += hash((key, partition_id, partition))  # _partition_digest, inlined (hot loop)
        sums.add_digests(-len(partitions), -total)
        yield row


async def _check_structure(db: aiosqlite.Connection) -> None:
    """SQLite's own structural check of every page (``PRAGMA quick_check``: b-tree pages, cell pointers,
    free list, each page used once; not index contents).  The checksum covers the rows a load reads, not
    the pages under them: a flipped bit in ``sqlite_master`` made an index's root the ``acls`` table's page
    (found by the byte-damage property test) — the load verified, and the next save wrote index cells into
    that table, so the following start discarded the store.  Run on the SQLite thread with the load (one
    sequential pass over the file, a fraction of what decoding the rows costs)."""
    async with db.execute("PRAGMA quick_check") as cursor:
        problems = [str(row[0]) async for row in cursor]
    if problems != ["ok"]:
        raise ImageStoreError(f"damaged file: {' '.join(problems)[:200]}")


_WRITE_VERSION_AT = 18  # the file header's "file format write version" byte (1 rollback journal, 2 WAL)


def _read_only_header(path: Path) -> str | None:
    """Why SQLite treats the file as read-only although nothing else is wrong with it, or None.

    SQLite opens a file whose header says "file format write version" > 2 read-only (a future format it
    may read but not write); every SQLite so far writes 1 or 2, so another value is damage.  The rows and
    pages are intact, so the load verifies, and the next save failed with "attempt to write a readonly
    database" — a storage failure, fatal on a controller at every restart (found by the byte-damage
    property test: a flipped bit at byte 18).  Read from the file itself: SQLite decides it from the main
    file's header, before any WAL frame.  Called on the store's own file with its connection open (the
    header is written when the tables are created), so a short read means no header yet."""
    with path.open("rb") as file:
        header = file.read(100)
    if len(header) < 100 or header[_WRITE_VERSION_AT] <= 2:
        return None
    return f"damaged header: file format write version {header[_WRITE_VERSION_AT]} (read-only to SQLite)"


_META_KEYS = frozenset({"offset", "epoch", "schema_version", "updated_at_ms", "checksum"})


def _checked_meta(rows: list[tuple[object, object]]) -> dict[str, str]:
    """The meta rows as a dict, refused unless each is a known key with a text value, once: the
    checksum covers ``offset`` and ``epoch`` but not the table's structure, and a damaged cell pointer
    (found by the byte-damage property test: a flipped bit in page 2) reads back as an extra all-NULL row
    — the next save's ``INSERT OR REPLACE`` then met that damage and wrote a store that failed its checksum
    on the next start.  Refusing it here discards the file at load, and the save starts it afresh."""
    meta: dict[str, str] = {}
    for key, value in rows:
        if not isinstance(key, str) or not isinstance(value, str) or key not in _META_KEYS or key in meta:
            raise ImageStoreError(f"damaged meta table (row {key!r}={value!r})")
        meta[key] = value
    return meta


SAVE_CHUNK_ROWS = 2_000
"""Rows one step of a save's large writes holds at most (partitions, topics, their deletions; one
``executemany``, the pause after it): ~10-18 ms of the SQLite thread at its ~5-9 µs a row (issue #17,
session 15; ~3 µs a row since session 18's multi-row statements, :meth:`SqliteImageStore._insert_paced`:
a step of partition rows is then 14 statements of 142, 1,988 rows)."""
SAVE_PAUSE_RATIO = 0.0
"""After each full chunk a save pauses this many times as long as the chunk took, by default
(``controller.image.store.save.pause.percent`` / 100): 1.0 holds a large save to about half a core, for
twice as long.  Off by default: measured in-process and with three saving processes on 2 cores, pacing did
not lower a 1-ms timer's lateness (docs/internals/raft-performance.md, session 15's image store section)."""

_ITER_CHUNK_SIZE = 64  # aiosqlite.connect()'s default
STORE_THREAD_NAME = "kraft-image-store"


def _named_connect(path: str, thread: list[int]) -> sqlite3.Connection:
    set_native_name(STORE_THREAD_NAME)
    thread.append(threading.get_ident())  # (read by SqliteImageStore.thread_cpu_s)
    return sqlite3.connect(path, isolation_level=None)


class SqliteImageStore:
    """Async SQLite store of one image.  Use :meth:`open`, then :meth:`load` / :meth:`save`."""

    def __init__(self, db: aiosqlite.Connection, path: Path, clock: Clock, thread: int | None = None) -> None:
        self._db = db
        self._thread = thread  # aiosqlite's worker thread (pthread id), for thread_cpu_s
        self.last_save_rows = 0
        """Rows the last :meth:`save` wrote to the partition and topic tables (their deletions too)."""
        self._clock = clock  # stamps updated_at_ms, times a paced save's chunks
        self.chunk_rows = SAVE_CHUNK_ROWS
        """Rows of one step of a save's large writes at most (:meth:`_write_paced`, :meth:`_insert_paced`)."""
        self.pause_ratio = SAVE_PAUSE_RATIO
        """After each full chunk the save pauses this many times the chunk's time (0: yields only)."""
        self.pause: Callable[[float], Awaitable[None]] = asyncio.sleep
        """How a save pauses between chunks, in seconds (tests look at the store there)."""
        self.path = path
        self._saved: MetadataImage | None = None
        self._sums = _RowSum()
        self.discarded: str | None = None
        """Why the last :meth:`load` discarded what the store held (None = it was used as is)."""

    @classmethod
    async def open(cls, path: Path, *, clock: Clock) -> SqliteImageStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return await cls._open(path, clock)
        except (sqlite3.DatabaseError, ValueError) as exc:
            if is_storage_failure(exc):
                raise  # a full or failing disk: the file may be fine, and a new one would fail the same way
            # Not a database any more (damaged, truncated, overwritten): a cache, so start it afresh.
            cls.discard_file(path, f"unreadable: {type(exc).__name__}: {exc}")
            return await cls._open(path, clock)

    @classmethod
    async def _open(cls, path: Path, clock: Clock) -> SqliteImageStore:
        thread: list[int] = []
        db, current = await cls._connect(path, thread)
        read_only = _read_only_header(path)
        if read_only is not None:
            await db.close()
            cls.discard_file(path, read_only)
            db, current = await cls._connect(path, thread)
        if not current:
            await db.close()
            # An older build's tables: CREATE TABLE IF NOT EXISTS keeps them as they are, and what it
            # saved may lack what it could not know (a broker's unclean_shutdown flag, its offline replicas,
            # a partition's last unclean leader epoch).
            cls.discard_file(
                path,
                "written by an older build: brokers lacks unclean_shutdown/offline_replicas"
                " or partition_elr lacks last_unclean_leader_epoch",
            )
            db, _ = await cls._connect(path, thread)
        return cls(db, path, clock, thread[-1] if thread else None)

    def thread_cpu_s(self) -> float | None:
        """CPU seconds the store's SQLite thread has used so far (None where the platform cannot tell):
        a save's rows are built and written there, so a save's CPU is the difference around it."""
        if self._thread is None or not hasattr(time, "pthread_getcpuclockid"):
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread))
        except OSError:  # the thread ended (the store is closed)
            return None

    @staticmethod
    async def _connect(path: Path, thread: list[int]) -> tuple[aiosqlite.Connection, bool]:
        """The connection, tables created, and whether they have every column of :data:`SCHEMA`."""
        # Autocommit mode: transactions are exactly the explicit BEGIN … COMMIT in save().
        # aiosqlite.connect() as it is, but the connector (run first on aiosqlite's worker thread) names
        # that thread ``image-store`` to the kernel: 0.6-0.9 CPU-s of each controller during a 106k
        # shutdown were an unnamed ``python`` thread in bench.controller --cpu (issue #17, session 15).
        db = await aiosqlite.Connection(partial(_named_connect, str(path), thread), _ITER_CHUNK_SIZE)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.executescript(SCHEMA)
            async with db.execute("SELECT value FROM meta WHERE key = 'schema_version'") as cursor:
                row = await cursor.fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise ImageStoreError(
                    f"{path}: schema version {row[0]} is newer than this build ({SCHEMA_VERSION})"
                )
            async with db.execute("SELECT name FROM pragma_table_info('brokers')") as cursor:
                columns = {name async for (name,) in cursor}
            async with db.execute("SELECT name FROM pragma_table_info('partition_elr')") as cursor:
                partition_columns = {name async for (name,) in cursor}
        except BaseException:
            await db.close()
            raise
        return db, columns.issuperset(("unclean_shutdown", "offline_replicas")) and (
            "last_unclean_leader_epoch" in partition_columns
        )

    @staticmethod
    def discard_file(path: Path, reason: str) -> None:
        """Delete the store file (and its WAL/SHM) with one log line; the next open starts empty."""
        _log.warning("image_store_discarded", path=str(path), reason=reason)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    @staticmethod
    def stored_offset(path: Path) -> int | None:
        """The offset the store file claims, read cheaply (None: no file, nothing saved, unreadable)."""
        if not path.exists():
            return None
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
                row = db.execute("SELECT value FROM meta WHERE key = 'offset'").fetchone()
        except sqlite3.Error:
            return None
        return None if row is None else int(row[0])

    async def close(self) -> None:
        await self._db.close()

    @property
    def saved_offset(self) -> int:
        return -1 if self._saved is None else self._saved.offset

    async def load(self) -> MetadataImage:
        """The stored image (empty when nothing was saved yet, or when the store was discarded because it
        failed verification — then :attr:`discarded` says why and the store holds nothing)."""
        self.discarded = None
        try:
            return await self._load_verified()
        except (ImageStoreError, sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            if is_storage_failure(exc):
                raise
            reason = (
                str(exc) if isinstance(exc, ImageStoreError) else f"unreadable: {type(exc).__name__}: {exc}"
            )
            await self.clear(reason)
            return MetadataImage.empty()

    async def clear(self, reason: str) -> None:
        """Start the store afresh (one ``image_store_discarded`` line): the image is rebuilt from the log.

        The file is deleted and created again, never merely emptied with DELETEs: a damaged page can
        outlive the rows (a b-tree or free-list page the next save reuses), and then every later load
        found the damage again and discarded the store for good (the byte-damage tests found this)."""
        self.discarded = reason
        try:
            await self._db.close()
        except sqlite3.Error as exc:
            if is_storage_failure(exc):
                raise
            # Closing a damaged database may complain; the file is deleted next anyway.
        self.discard_file(self.path, reason)
        fresh = await self._open(self.path, self._clock)
        self._db, self._thread = fresh._db, fresh._thread
        self._saved = MetadataImage.empty()
        self._sums = _RowSum()

    async def _load_verified(self) -> MetadataImage:
        db = self._db
        sums = _RowSum()
        meta = _checked_meta([row async for row in _rows(db, "SELECT key, value FROM meta")])
        if "offset" not in meta:
            self._saved = MetadataImage.empty()
            self._sums = sums
            return self._saved
        if "checksum" not in meta:
            raise ImageStoreError("no checksum (written by an older build, or edited)")
        await _check_structure(db)
        brokers: dict[int, BrokerRegistration] = {}
        async for row in _rows(db, "SELECT * FROM brokers"):
            sums.add("b", row)
            brokers[row[0]] = BrokerRegistration(
                broker_id=row[0],
                epoch=row[1],
                incarnation_id=row[2],
                rack=row[3],
                fenced=bool(row[4]),
                in_controlled_shutdown=bool(row[5]),
                endpoints=tuple(Endpoint(n, h, p, s) for n, h, p, s in json.loads(row[6])),
                features=tuple(BrokerFeatureRange(n, lo, hi) for n, lo, hi in json.loads(row[7])),
                log_dirs=tuple(json.loads(row[8])),
                unclean_shutdown=bool(row[9]),
                offline_replicas=frozenset((t, p) for t, p in json.loads(row[10])),
            )
        partitions: dict[str, list[PartitionRegistration]] = {}
        extras: dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], int, int]] = {}
        async for topic_id, partition_id, elr, lke, recovery, unclean_epoch in _rows(
            db, "SELECT * FROM partition_elr"
        ):
            extras[(topic_id, partition_id)] = (_parse_ids(elr), _parse_ids(lke), recovery, unclean_epoch)
        # The rows hold every partition with an ELR or last known ELR: the image's index of them, for free.
        elr_holders = ElrHolders.from_partitions(key for key, extra in extras.items() if extra[0] or extra[1])
        query = "SELECT * FROM partitions "
        # One shared tuple per distinct list text, as images built by replay share them (memory, speed).
        parsed: dict[str, tuple[int, ...]] = {}
        keys: dict[str, int] = {}
        p_count = p_total = 0
        async for row in _rows(db, query + "ORDER BY topic_id, partition_id"):
            (
                topic_id,
                partition_id,
                leader,
                leader_epoch,
                partition_epoch,
                replicas,
                isr,
            ) = row
            if partition_id != len(partitions.get(topic_id, ())):
                raise ImageStoreError(
                    f"topic {topic_id} lacks a row for partition {len(partitions.get(topic_id, ()))}"
                )
            replica_ids = _parse_shared(parsed, replicas)
            isr_ids = replica_ids if isr == replicas else _parse_shared(parsed, isr)
            registration = PartitionRegistration(replica_ids, isr_ids, leader, leader_epoch, partition_epoch)
            if extras:
                extra = extras.pop((topic_id, partition_id), None)
                if extra is not None:
                    registration = PartitionRegistration(
                        replica_ids, isr_ids, leader, leader_epoch, partition_epoch, *extra
                    )
            partitions.setdefault(topic_id, []).append(registration)
            key = keys.get(topic_id)
            if key is None:
                key = keys[topic_id] = _topic_key(topic_id)
            p_total += hash((key, partition_id, registration))  # _partition_digest, inlined (hot loop)
            p_count += 1
        sums.add_digests(p_count, p_total)
        if extras:
            raise ImageStoreError(
                f"{self.path}: partition_elr rows without a partition: {sorted(extras)[:3]}"
            )
        topics: dict[str, TopicImage] = {}
        names: dict[str, str] = {}
        async for topic_id, name, count in _rows(db, "SELECT topic_id, name, partitions FROM topics"):
            sums.add("t", (topic_id, name, count))
            parts = tuple(partitions.get(topic_id, ()))
            if len(parts) != count:
                raise ImageStoreError(
                    f"{self.path}: topic {name} has {len(parts)} partition rows, expected {count}"
                )
            topics[topic_id] = TopicImage(name, topic_id, parts)
            names[name] = topic_id
        configs: dict[ConfigKey, dict[str, str]] = {}
        async for rtype, rname, key, value in _rows(db, "SELECT * FROM configs"):
            sums.add("c", (rtype, rname, key, value))
            configs.setdefault(ConfigKey(rtype, rname), {})[key] = value
        levels: dict[str, int] = {}
        async for name, level in _rows(db, "SELECT name, level FROM features"):
            sums.add("f", (name, level))
            levels[name] = level
        acls: dict[str, StandardAcl] = {}
        async for row in _rows(db, "SELECT * FROM acls"):
            sums.add("a", row)
            acls[row[0]] = _acl_from_row(tuple(row))
        offset, epoch = int(meta["offset"]), int(meta.get("epoch", -1))
        if sums.checksum(offset, epoch) != meta["checksum"]:
            raise ImageStoreError(f"checksum mismatch at offset {offset} (damaged or edited)")
        if not partitions.keys() <= topics.keys():
            raise ImageStoreError("partition rows of a topic that has no topic row")
        image = MetadataImage(
            offset=offset,
            epoch=epoch,
            brokers=brokers,
            topics_by_id=topics,
            topic_ids_by_name=names,
            configs=configs,
            features=levels,
            acls=acls,
            elr_holders=elr_holders,
        )
        image.set_partition_total(p_count)  # (every partition row belongs to a topic: checked above)
        self._saved = image
        self._sums = sums
        return image

    async def save(self, image: MetadataImage) -> None:
        """Persist ``image`` in one transaction, writing only what changed since the last save/load.

        A file found damaged while writing (SQLite's "database disk image is malformed": damage in a page
        :meth:`load` never reads, such as the topic-name index) is started afresh and the whole image
        written to it — a cache, so never a reason to stop the node (it used to fail every save, so a
        controller stopped at each restart).  A storage failure (disk full, I/O error) is raised."""
        try:
            await self._save(image)
        except sqlite3.DatabaseError as exc:
            if is_storage_failure(exc):
                raise
            await self.clear(f"damaged, found while saving: {type(exc).__name__}: {exc}")
            await self._save(image)

    async def _save(self, image: MetadataImage) -> None:
        previous = self._saved if self._saved is not None else MetadataImage.empty()
        db = self._db
        if db.in_transaction:  # a save cancelled half-way (shutdown) left its transaction open
            await db.execute("ROLLBACK")
        # Updated on a copy: a failed save rolls back the rows, so the digest must not move either.
        sums = self._sums.copy()
        self.last_save_rows = 0
        try:
            await db.execute("BEGIN")
            await self._save_brokers(previous, image, sums)
            await self._save_topics(previous, image, sums)
            if image.configs is not previous.configs:
                await self._save_configs(previous, image, sums)
            if image.features is not previous.features:
                for item in previous.features.items():
                    sums.remove("f", item)
                for item in image.features.items():
                    sums.add("f", item)
                await db.execute("DELETE FROM features")
                await db.executemany("INSERT INTO features VALUES (?, ?)", list(image.features.items()))
            if image.acls is not previous.acls:
                await self._save_acls(previous, image, sums)
            await db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [
                    ("offset", str(image.offset)),
                    ("epoch", str(image.epoch)),
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("updated_at_ms", str(self._clock.wall_ms())),
                    ("checksum", sums.checksum(image.offset, image.epoch)),
                ],
            )
            await db.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (e.g. SQLITE_FULL) may have rolled back already: a second ROLLBACK would
            # raise "no transaction is active" and hide the real error.
            with contextlib.suppress(Exception):
                if db.in_transaction:
                    await db.execute("ROLLBACK")
            raise
        self._saved = image
        self._sums = sums

    async def _save_brokers(self, previous: MetadataImage, image: MetadataImage, sums: _RowSum) -> None:
        if image.brokers is previous.brokers:
            return
        gone = [(b,) for b in previous.brokers if b not in image.brokers]
        changed = [_broker_row(b) for i, b in image.brokers.items() if previous.brokers.get(i) is not b]
        for broker_id, old in previous.brokers.items():
            if image.brokers.get(broker_id) is not old:
                sums.remove("b", _broker_row(old))
        for row in changed:
            sums.add("b", row)
        await self._db.executemany("DELETE FROM brokers WHERE broker_id = ?", gone)
        await self._db.executemany(
            "INSERT OR REPLACE INTO brokers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", changed
        )

    async def _save_topics(self, previous: MetadataImage, image: MetadataImage, sums: _RowSum) -> None:
        if image.topics_by_id is previous.topics_by_id:
            return
        # Only the chunks the versions do not share are compared (kraft.metadata.pmap): a pass over every
        # topic was ~5-10 ms of the event loop per save at 10,000 topics, on every controller.
        # In steps, the loop yielding between them: after a snapshot load the two maps share nothing and
        # every topic is compared (~30-60 ms at 100,000 topics in one go).
        diff = persistent(image.topics_by_id).changes_since_steps(previous.topics_by_id)
        while True:
            try:
                next(diff)
            except StopIteration as done:
                removed, updated = done.value
                break
            await asyncio.sleep(0)
        # Generators, like the partition rows below: every per-topic step (a CRC per topic row, ~3 µs,
        # 0.2-0.3 s at 100,000 topics after a snapshot load) runs on the SQLite thread, not in one
        # event-loop turn.  Each fills the list the next statement reads.
        gone: list[tuple[str]] = []
        await self._write_paced(
            "DELETE FROM topics WHERE topic_id = ?", _gone_topic_rows(previous, removed, sums, gone)
        )
        # A removed topic's partition digests (20 ms for 100,000 partitions), likewise.
        await self._write_paced(
            "DELETE FROM partitions WHERE topic_id = ?", _gone_topic_keys(previous, gone, sums)
        )
        await self._write_paced("DELETE FROM partition_elr WHERE topic_id = ?", gone)
        changed: list[tuple[TopicImage, TopicImage | None]] = []
        await self._insert_paced("topics", 3, _changed_topic_rows(previous, updated, sums, changed))
        # A generator: the rows are built on the SQLite thread, not on the event loop.
        elr_rows: list[tuple[Any, ...]] = []
        elr_gone: list[tuple[str, int]] = []
        await self._insert_paced("partitions", 7, _changed_partition_rows(changed, sums, elr_rows, elr_gone))
        # Filled while the rows above were produced.
        await self._write_paced("DELETE FROM partition_elr WHERE topic_id = ? AND partition_id = ?", elr_gone)
        await self._insert_paced("partition_elr", 6, elr_rows)
        # The working lists hold a pair or a new tuple per topic: freed where this frame ends they are one
        # deallocation of ~100,000 objects (several ms) after a snapshot load.
        for items in (changed, updated, removed, gone):
            await _drop_paced(items)

    async def _write_paced(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
        """``executemany(sql, rows)`` inside the save's transaction, :attr:`chunk_rows` rows per statement,
        pausing :attr:`pause_ratio` times each full chunk's time before the next.  The rows are still
        produced on the SQLite thread (``rows`` is consumed there) and the transaction stays open across
        the pauses: a reader sees the previous save until COMMIT, a failure rolls every chunk back."""
        source = iter(rows)
        while True:
            taken = [0]
            started_ms = self._clock.monotonic_ms()
            await self._db.executemany(sql, _counted(islice(source, self.chunk_rows), taken))
            self.last_save_rows += taken[0]
            if taken[0] < self.chunk_rows:
                return  # the source ran out (a statement with fewer rows than a chunk is never paused after)
            await self.pause(max(0, self._clock.monotonic_ms() - started_ms) * self.pause_ratio / 1000)

    async def _insert_paced(self, table: str, width: int, rows: Iterable[tuple[Any, ...]]) -> None:
        """``INSERT OR REPLACE`` of ``rows`` (``width`` columns each) into ``table``, paced like
        :meth:`_write_paced` (at most :attr:`chunk_rows` rows a step, the same pauses), but
        :func:`_rows_per_statement` rows in each statement: one multi-row ``VALUES`` list per group of rows,
        the groups of a step in one ``executemany`` whose parameter sets are the groups, flattened.

        Why: ``executemany`` of one row a statement costs ~1.8 µs a partition row (binding, a step and a
        reset per row, and the GIL released and taken again around every step); a statement of 142 rows
        ~1.1 µs (issue #17, session 18).  Same rows, in the same order, in the same transaction; the last
        group of the source, shorter, goes in one-row statements.  The rows are still produced on the
        SQLite thread (``executemany`` consumes the groups there)."""
        one = f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * width)})"
        per = max(1, min(self.chunk_rows, _rows_per_statement(width)))
        many = one + f", ({', '.join('?' * width)})" * (per - 1)
        groups_per_step = max(1, self.chunk_rows // per)
        state = _Grouping()
        groups = _flat_groups(iter(rows), per, state)
        while not state.done:
            before = state.taken
            started_ms = self._clock.monotonic_ms()
            await self._db.executemany(many, islice(groups, groups_per_step))
            if state.done:
                if state.rest:
                    await self._db.executemany(one, state.rest)  # the source's last, shorter group
                self.last_save_rows += state.taken - before
                return
            self.last_save_rows += state.taken - before
            await self.pause(max(0, self._clock.monotonic_ms() - started_ms) * self.pause_ratio / 1000)

    async def _save_acls(self, previous: MetadataImage, image: MetadataImage, sums: _RowSum) -> None:
        gone = [(i,) for i in previous.acls if i not in image.acls]
        for acl_id, old in previous.acls.items():
            if image.acls.get(acl_id) is not old:
                sums.remove("a", _acl_row(acl_id, old))
        changed = [_acl_row(i, a) for i, a in image.acls.items() if previous.acls.get(i) is not a]
        for row in changed:
            sums.add("a", row)
        await self._db.executemany("DELETE FROM acls WHERE id = ?", gone)
        await self._db.executemany("INSERT OR REPLACE INTO acls VALUES (?, ?, ?, ?, ?, ?, ?, ?)", changed)

    async def _save_configs(self, previous: MetadataImage, image: MetadataImage, sums: _RowSum) -> None:
        for key in set(previous.configs) | set(image.configs):
            values = image.configs.get(key, {})
            if previous.configs.get(key) is values:
                continue
            for row in _config_rows(key, previous.configs.get(key, {})):
                sums.remove("c", row)
            for row in _config_rows(key, values):
                sums.add("c", row)
            await self._db.execute(
                "DELETE FROM configs WHERE resource_type = ? AND resource_name = ?",
                (key[0], key[1]),
            )
            await self._db.executemany(
                "INSERT INTO configs VALUES (?, ?, ?, ?)",
                [(key[0], key[1], k, v) for k, v in values.items()],
            )


_Row = TypeVar("_Row")


def _counted(rows: Iterable[_Row], taken: list[int]) -> Iterator[_Row]:
    """``rows`` as they are, ``taken[0]`` counting them (on the thread that consumes them)."""
    for row in rows:
        taken[0] += 1
        yield row


MAX_STATEMENT_PARAMETERS = 999
"""Parameters of one statement at most: SQLite's default limit before 3.32 (32,766 since), so any build
takes the multi-row statements of :meth:`SqliteImageStore._insert_paced`."""


def _rows_per_statement(width: int) -> int:
    """Rows of ``width`` columns in one multi-row ``INSERT`` (142 partition rows)."""
    return max(1, MAX_STATEMENT_PARAMETERS // width)


class _Grouping:
    """What :func:`_flat_groups` has taken from its source so far (read on the loop between steps)."""

    __slots__ = ("done", "rest", "taken")

    def __init__(self) -> None:
        self.taken = 0
        self.done = False
        self.rest: list[tuple[Any, ...]] = []


def _flat_groups(rows: Iterator[tuple[Any, ...]], per: int, state: _Grouping) -> Iterator[list[Any]]:
    """``rows`` ``per`` at a time, each group's values in one flat list (one multi-row statement's
    parameters); the last group, shorter (or empty), is left in ``state.rest`` and ``state.done`` set."""
    while True:
        group = list(islice(rows, per))
        state.taken += len(group)
        if len(group) < per:
            state.rest = group
            state.done = True
            return
        yield list(chain.from_iterable(group))


DROP_STEP_ITEMS = 4_096
"""Items of a save's working list freed between two loop turns (:func:`_drop_paced`)."""


async def _drop_paced(items: list[Any]) -> None:
    """Empty ``items`` (a save's own working list) :data:`DROP_STEP_ITEMS` at a time, yielding the loop
    between the steps."""
    while len(items) > DROP_STEP_ITEMS:
        del items[-DROP_STEP_ITEMS:]
        await asyncio.sleep(0)
    items.clear()


async def _rows(db: aiosqlite.Connection, query: str) -> AsyncIterator[Any]:
    async with db.execute(query) as cursor:
        async for row in cursor:
            yield row
