"""Issue #14's corruption suite at node level, controller side: a real controller node (started
in-process: storage check, Raft over the segmented log, snapshots, the metadata layer and its image
store, gRPC) is given a metadata dir with one damaged file — ``meta.properties``, the snapshot's
``.checkpoint``, a segment's ``.index``/``.timeindex``, ``recovery-point-offset-checkpoint``,
``leader-epoch-checkpoint``, ``quorum-state``, the image store — by a flipped byte, a truncation, zeroed
bytes or garbage appended, and started.  Exactly one of two outcomes is allowed:

- it refuses to start (or stops) with one line that names the damaged file, or
- it becomes the active controller with every committed topic (the acknowledged CreateTopics) there;

never running with less than it acknowledged, never running on the damaged bytes.

Built once: a controller that created ACLs, took a snapshot and created many more; each case copies that
directory.  Every case is one in-process start (0.1 to 0.3 s), not a process (~3 s); the 69 cases
and the build take ~10 s.
"""

from __future__ import annotations

import asyncio
import atexit
import random
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from kraft.client.admin import AdminClient
from kraft.clock import SystemClock
from kraft.config import NodeConfig
from kraft.metadata.store import IMAGE_STORE_FILE, SqliteImageStore
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode, StartupError
from kraft.node.metadata_layer import MetadataLayer, install_metadata_layer
from kraft.node.supervisor import Supervisor
from kraft.storage.ids import random_uuid
from kraft.storage.log import CLEAN_SHUTDOWN_FILE, METADATA_LOG_DIR_NAME, RECOVERY_POINT_FILE
from kraft.storage.meta_properties import META_PROPERTIES_FILE, format_log_dir
from kraft.storage.quorum_state import QUORUM_STATE_FILE
from kraft.v1 import controller_pb2 as cpb

TIMEOUT_S = 20.0
KINDS = ("flip", "zero", "truncate", "extend")
# Text files also get "digit": their last number changed into another one.
TEXT_FILES = frozenset({"meta.properties", "recovery-point", "leader-epoch", "quorum-state"})
# Built in two runs: the first takes a snapshot once ~1 KiB of records were committed; the second (and
# every damaged start) snapshots only after 20 MiB, so the log after the snapshot keeps several segments.
SNAPSHOT_BYTES = 1024
NO_SNAPSHOT_BYTES = 20 << 20
ACLS_BEFORE_SNAPSHOT = 20
ACLS_AFTER_SNAPSHOT = 200
ACLS_PER_REQUEST = 5


class Exited(BaseException):
    """Raised in place of the process exit (the supervisor's exit_process)."""


def _no_exit(code: int) -> NoReturn:
    raise Exited(code)


class _NoWatchdog:
    def cancel(self) -> None:
        return None


def _supervisor() -> Supervisor:
    return Supervisor(exit_process=_no_exit, start_watchdog=lambda _deadline, _fire: _NoWatchdog())


def _config(meta_dir: Path, port: int, snapshot_bytes: int) -> NodeConfig:
    return NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=meta_dir,
        # Several segments with index entries, and a snapshot after the first dozen topics.
        # Segments of two index intervals (4 KiB): several of them, each with index entries.
        metadata_log_segment_bytes=8192,
        metadata_log_max_record_bytes_between_snapshots=snapshot_bytes,
        controller_quorum_election_timeout_ms=200,
        controller_quorum_fetch_timeout_ms=400,
        controller_request_intake_thread=False,
    )


@pytest.fixture(autouse=True)
def _restore_switch_interval() -> Iterator[None]:
    """install_metadata_layer shortens the GIL switch interval for the whole process (a controller
    process's setting): put it back for the tests that run after these."""
    before = sys.getswitchinterval()
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@dataclass
class Running:
    node: ControllerNode
    layer: MetadataLayer
    supervisor: Supervisor
    target: str


async def _start(meta_dir: Path, snapshot_bytes: int = NO_SNAPSHOT_BYTES) -> Running:
    port = free_port()
    supervisor = _supervisor()
    node = ControllerNode(_config(meta_dir, port, snapshot_bytes), supervisor)
    layer = install_metadata_layer(node)
    await node.start()
    return Running(node, layer, supervisor, f"127.0.0.1:{port}")


async def _wait(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _active(running: Running) -> bool:
    controller = running.layer.controller
    return running.supervisor.failure is not None or (controller is not None and controller.is_active)


def _acls(running: Running) -> set[str]:
    controller = running.layer.controller
    assert controller is not None
    return {acl.principal for acl in controller.committed.acls.values()}


@dataclass(frozen=True)
class Pristine:
    meta_dir: Path
    committed: frozenset[str]  # the principal of every acknowledged ACL: what must survive
    offset: int  # the image's offset when the controller stopped


async def _create_acls(target: str, principals: list[str]) -> None:
    """Acknowledged (committed) metadata records: ACLs, which need no brokers."""
    bindings = [
        cpb.AclBinding(
            resource_type=2,
            resource_name="orders",
            pattern_type=3,
            principal=principal,
            host="*",
            operation=3,
            permission_type=3,
        )
        for principal in principals
    ]
    async with AdminClient([target], timeout_s=TIMEOUT_S, clock=SystemClock()) as admin:
        response = await admin.create_acls(bindings)
    assert [r.error_code for r in response.results] == [0] * len(bindings), response


async def _build(meta_dir: Path) -> Pristine:
    format_log_dir(meta_dir, cluster_id=random_uuid(), node_id=1)
    log_dir = meta_dir / METADATA_LOG_DIR_NAME
    first = await _start(meta_dir, SNAPSHOT_BYTES)
    try:
        await _wait(lambda: _active(first), "the controller to activate")
        for i in range(ACLS_BEFORE_SNAPSHOT):
            await _create_acls(first.target, [f"User:before-{i}"])
        await _wait(lambda: any(log_dir.glob("*.checkpoint")), "a snapshot")
    finally:
        await first.node.stop(timeout_ms=2000)
    second = await _start(meta_dir)
    try:
        await _wait(lambda: _active(second), "the controller to activate again")
        for i in range(0, ACLS_AFTER_SNAPSHOT, ACLS_PER_REQUEST):
            await _create_acls(second.target, [f"User:after-{j}" for j in range(i, i + ACLS_PER_REQUEST)])
        committed = _acls(second)
        controller = second.layer.controller
        assert controller is not None
        offset = controller.committed.offset
        # The image store is saved at most every 500 ms: wait until it holds everything, so that it is
        # a real cache of this state.
        store = meta_dir / IMAGE_STORE_FILE
        await _wait(lambda: SqliteImageStore.stored_offset(store) == offset, "the image store to save")
    finally:
        await second.node.stop(timeout_ms=2000)
    assert first.supervisor.failure is None and second.supervisor.failure is None
    assert len(committed) == ACLS_BEFORE_SNAPSHOT + ACLS_AFTER_SNAPSHOT
    assert len(list(log_dir.glob("*.checkpoint"))) == 1
    assert len([p for p in log_dir.glob("*.index") if p.stat().st_size > 0]) >= 2, "indexed segments"
    return Pristine(meta_dir, frozenset(committed), offset)


_built: list[Pristine] = []


async def _pristine() -> Pristine:
    """Built once per test session, copied by every case (building it takes ~2 s)."""
    if not _built:
        root = Path(tempfile.mkdtemp(prefix="kraft-node-corruption-"))
        atexit.register(shutil.rmtree, root, True)  # built once, removed when the test run ends
        meta_dir = root / "meta"
        _built.append(await _build(meta_dir))
    return _built[0]


# --- the damaged files -------------------------------------------------------------------------


def _victim(meta_dir: Path, kind: str) -> Path:
    log_dir = meta_dir / METADATA_LOG_DIR_NAME
    if kind == "meta.properties":
        return meta_dir / META_PROPERTIES_FILE
    if kind == "snapshot":
        return max(log_dir.glob("*.checkpoint"))
    if kind in ("index", "timeindex"):
        # The oldest segment's: a segment below the recovery point, trusted without a scan.
        indexes = [p for p in sorted(log_dir.glob(f"*.{kind}")) if p.stat().st_size > 0]
        assert indexes, f"no non-empty .{kind} file"
        return indexes[0]
    if kind == "recovery-point":
        return log_dir / RECOVERY_POINT_FILE
    if kind == "leader-epoch":
        return log_dir / "leader-epoch-checkpoint"
    if kind == "quorum-state":
        return log_dir / QUORUM_STATE_FILE
    assert kind == "image-store"
    return meta_dir / IMAGE_STORE_FILE


def _damage(path: Path, damage: str, seed: str) -> None:
    """One damage at a position drawn from a per-case seed (deterministic, different per case)."""
    rng = random.Random(zlib.crc32(seed.encode()))
    data = bytearray(path.read_bytes())
    assert data, path
    position = rng.randrange(len(data))
    if damage == "flip":
        data[position] ^= rng.randrange(1, 256)
    elif damage == "zero":
        end = min(len(data), position + rng.randrange(1, 64))
        data[position:end] = bytes(end - position)
        if bytes(data) == path.read_bytes():  # the range was zero already: zero the file's start
            data[0 : min(8, len(data))] = bytes(min(8, len(data)))
    elif damage == "truncate":
        del data[position:]
    elif damage == "digit":
        # A text file's last number changed into another valid number (still parses: only a checksum,
        # or a cross-check against the log, can tell).
        last = max(i for i, byte in enumerate(data) if chr(byte).isdigit())
        data[last] = ord("9") if data[last] != ord("9") else ord("1")
    else:
        data += bytes([rng.randrange(1, 256)]) * rng.randrange(1, 64)
    path.write_bytes(bytes(data))


FILES = (
    "meta.properties",
    "snapshot",
    "index",
    "timeindex",
    "recovery-point",
    "leader-epoch",
    "quorum-state",
    "image-store",
)


async def _start_damaged(meta_dir: Path, victim: Path, pristine: Pristine) -> str:
    """Start the node on the damaged dir; the outcome, after checking it is one of the allowed two."""
    try:
        running = await _start(meta_dir)
    except StartupError as refused:
        line = str(refused)
        assert "\n" not in line, line
        assert victim.name in line, f"the error does not name {victim.name}: {line}"
        return "refused"
    try:
        await _wait(lambda: _active(running), "the controller to activate or fail")
        failure = running.supervisor.failure
        if failure is not None:
            text = f"{failure.reason} {failure.fields}"
            assert victim.name in text, f"the fatal error does not name {victim.name}: {text}"
            return "stopped"
        # Running: with every acknowledged ACL, and only those (nothing of the damaged bytes).
        assert _acls(running) == pristine.committed
        controller = running.layer.controller
        assert controller is not None and controller.committed.offset >= pristine.offset
        return "recovered"
    finally:
        if running.supervisor.failure is None:
            await running.node.stop(timeout_ms=2000)
        else:
            await running.node.abort()


CASES = [
    *((file, damage, position) for file in FILES for damage in KINDS for position in (0, 1)),
    *((file, "digit", 0) for file in FILES if file in TEXT_FILES),
]


@pytest.mark.parametrize(("file", "damage", "position"), CASES)
async def test_a_controller_with_a_damaged_file_refuses_or_recovers_everything_committed(
    tmp_path: Path, file: str, damage: str, position: int
) -> None:
    pristine = await _pristine()
    meta_dir = tmp_path / "meta"
    shutil.copytree(pristine.meta_dir, meta_dir)
    if file in ("recovery-point", "leader-epoch", "index", "timeindex"):
        # Crashed after its last flush: no clean-shutdown marker, so the recovery point and the epoch
        # checkpoint decide what is scanned and trusted (after a clean stop they hardly matter).
        (meta_dir / METADATA_LOG_DIR_NAME / CLEAN_SHUTDOWN_FILE).unlink()
    victim = _victim(meta_dir, file)
    _damage(victim, damage, f"{file}/{damage}/{position}")
    outcome = await _start_damaged(meta_dir, victim, pristine)
    assert outcome in EXPECTED[file], f"{file}/{damage}: {outcome}"


# What each kind of file may do when damaged (the test above asserts the outcome is one of these):
EXPECTED: dict[str, set[str]] = {
    "meta.properties": {"refused", "recovered"},  # checksummed; a trailing comment still reads the same
    "snapshot": {"refused", "stopped"},  # verified when opened (CRC, footer)
    "index": {"recovered"},  # derived data: checked against the segment, rebuilt
    "timeindex": {"recovered"},
    "recovery-point": {"refused", "recovered"},  # unreadable → full scan; raised above the end → refused
    "leader-epoch": {"refused", "stopped", "recovered"},  # unreadable → rebuilt; wrong → refused
    "quorum-state": {"refused", "recovered"},  # checksummed
    "image-store": {"recovered"},  # a cache: verified or discarded and rebuilt from the log
}
