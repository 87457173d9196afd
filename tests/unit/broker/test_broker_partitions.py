"""PartitionManager: Kafka's apply order, idempotence, crash leftovers, least-loaded log dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_fakes import MemoryLogOpener

from kraft.broker.partition_log import PartitionLog
from kraft.broker.partitions import (
    STATE_FILE,
    AllLogDirsOfflineError,
    PartitionManager,
    read_partition_state,
)
from kraft.broker.types import (
    LocalChanges,
    PartitionAssignment,
    ReplicaRole,
    TopicPartition,
    local_changes_between,
)
from kraft.storage.errors import FatalStorageError, StorageStateError

ME = 1
T0 = TopicPartition("orders", 0)
T1 = TopicPartition("orders", 1)
T2 = TopicPartition("events", 0)


def assignment(leader: int, epoch: int = 0, topic_id: str = "id-orders") -> PartitionAssignment:
    return PartitionAssignment(
        topic_id=topic_id,
        leader=leader,
        leader_epoch=epoch,
        partition_epoch=epoch,
        replicas=(1, 2),
        isr=(1, 2),
    )


def partition_dirs(*log_dirs: Path) -> set[str]:
    return {p.name for d in log_dirs for p in d.iterdir() if p.is_dir()}


def make_manager(tmp_path: Path, dirs: int = 1) -> tuple[PartitionManager, MemoryLogOpener, list[Path]]:
    log_dirs = [tmp_path / f"d{i}" for i in range(dirs)]
    opener = MemoryLogOpener()
    manager = PartitionManager(ME, log_dirs, opener)
    manager.load()
    return manager, opener, log_dirs


def test_new_leaderships_and_followerships_create_partition_dirs_with_recorded_role(tmp_path: Path) -> None:
    manager, _, dirs = make_manager(tmp_path)
    applied = manager.apply(LocalChanges(leaders={T0: assignment(ME, 3)}, followers={T1: assignment(2, 5)}))

    assert applied.became_leader == (T0,)
    assert applied.became_follower == (T1,)
    assert partition_dirs(*dirs) == {"orders-0", "orders-1"}
    state = read_partition_state(dirs[0] / "orders-0")
    assert state is not None
    assert state[0] == T0 and state[1].leader_epoch == 3 and state[2] is ReplicaRole.LEADER
    follower = manager.get(T1)
    assert follower is not None and follower.role is ReplicaRole.FOLLOWER and follower.leader_id == 2


def test_reapplying_the_same_changes_is_idempotent(tmp_path: Path) -> None:
    manager, opener, dirs = make_manager(tmp_path)
    changes = LocalChanges(leaders={T0: assignment(ME, 1)}, followers={T1: assignment(2, 1)})
    manager.apply(changes)
    before = (dirs[0] / "orders-0" / STATE_FILE).stat().st_mtime_ns
    opened = len(opener.opened)

    again = manager.apply(changes)

    assert again.is_empty()
    assert len(opener.opened) == opened  # nothing reopened
    assert (dirs[0] / "orders-0" / STATE_FILE).stat().st_mtime_ns == before  # nothing rewritten
    assert manager.apply(LocalChanges(deletes={T2: "id-events"})).is_empty()  # deleting the absent: no-op


def test_deletes_run_before_leaderships_and_the_log_is_closed(tmp_path: Path) -> None:
    manager, opener, dirs = make_manager(tmp_path)
    manager.apply(LocalChanges(leaders={T0: assignment(ME, 1)}))
    old_log = opener.logs[dirs[0] / "orders-0"]

    # The topic was deleted and re-created under the same name within one delta.
    applied = manager.apply(
        LocalChanges(deletes={T0: "id-orders"}, leaders={T0: assignment(ME, 0, topic_id="id-new")})
    )

    assert applied.deleted == (T0,) and applied.became_leader == (T0,)
    assert old_log.closed
    partition = manager.get(T0)
    assert partition is not None and partition.topic_id == "id-new"
    assert partition_dirs(*dirs) == {"orders-0"}
    # Re-applying the same delta (crash before the image store commit) keeps the new topic's log.
    assert manager.apply(
        LocalChanges(deletes={T0: "id-orders"}, leaders={T0: assignment(ME, 0, topic_id="id-new")})
    ).is_empty()
    assert manager.get(T0) is partition


def test_a_changed_topic_id_without_an_explicit_delete_replaces_the_old_log(tmp_path: Path) -> None:
    manager, opener, dirs = make_manager(tmp_path)
    manager.apply(LocalChanges(leaders={T0: assignment(ME, 1)}))
    old_log = opener.logs[dirs[0] / "orders-0"]
    manager.apply(LocalChanges(followers={T0: assignment(2, 0, topic_id="id-other")}))
    partition = manager.get(T0)
    assert partition is not None and partition.topic_id == "id-other"
    assert partition.role is ReplicaRole.FOLLOWER
    assert old_log.closed and partition.log is not old_log


def test_leader_to_follower_updates_role_and_epoch_in_place(tmp_path: Path) -> None:
    manager, opener, dirs = make_manager(tmp_path)
    manager.apply(LocalChanges(leaders={T0: assignment(ME, 1)}))
    opened = len(opener.opened)
    applied = manager.apply(LocalChanges(followers={T0: assignment(2, 2)}))
    assert applied.became_follower == (T0,)
    assert len(opener.opened) == opened  # same log, not reopened
    state = read_partition_state(dirs[0] / "orders-0")
    assert state is not None and state[2] is ReplicaRole.FOLLOWER and state[1].leader_epoch == 2


def test_restart_loads_partitions_and_finishes_interrupted_directory_operations(tmp_path: Path) -> None:
    manager, _, dirs = make_manager(tmp_path)
    manager.apply(LocalChanges(leaders={T0: assignment(ME, 4)}, followers={T1: assignment(2, 1)}))
    manager.close()
    # Leftovers of a crash in the middle of a creation and of a deletion, plus a foreign directory.
    (dirs[0] / "events-0.abc-create").mkdir()
    (dirs[0] / "orders-7.abc-delete").mkdir()
    (dirs[0] / "__cluster_metadata-0").mkdir()

    reopened = PartitionManager(ME, dirs, MemoryLogOpener())
    reopened.load()

    assert {p.tp for p in reopened.partitions()} == {T0, T1}
    leader = reopened.get(T0)
    assert leader is not None and leader.role is ReplicaRole.LEADER and leader.leader_epoch == 4
    assert partition_dirs(*dirs) == {"orders-0", "orders-1", "__cluster_metadata-0"}


def test_reconcile_makes_local_partitions_exactly_the_desired_set(tmp_path: Path) -> None:
    manager, _, dirs = make_manager(tmp_path)
    manager.apply(LocalChanges(leaders={T0: assignment(ME, 1)}, followers={T1: assignment(2, 1)}))

    applied = manager.reconcile({T1: assignment(ME, 2), T2: assignment(2, 0, topic_id="id-events")})

    assert applied.deleted == (T0,)
    assert applied.became_leader == (T1,)
    assert applied.became_follower == (T2,)
    assert partition_dirs(*dirs) == {"orders-1", "events-0"}
    assert manager.reconcile(manager.assignments()).is_empty()


def test_new_partitions_go_to_the_least_loaded_log_dir(tmp_path: Path) -> None:
    manager, _, dirs = make_manager(tmp_path, dirs=2)
    tps = [TopicPartition("t", i) for i in range(4)]
    manager.apply(LocalChanges(leaders={tp: assignment(ME) for tp in tps}))
    assert len(list(dirs[0].iterdir())) == 2 and len(list(dirs[1].iterdir())) == 2

    manager.apply(LocalChanges(deletes={tp: "id-orders" for tp in tps if (dirs[0] / tp.dir_name).exists()}))
    manager.apply(LocalChanges(leaders={TopicPartition("u", 0): assignment(ME)}))
    assert (dirs[0] / "u-0").is_dir()


def test_local_changes_between_classifies_by_leader_and_skips_unchanged() -> None:
    before = {T0: assignment(ME, 1), T1: assignment(2, 1)}
    after = {T0: assignment(ME, 1), T1: assignment(ME, 2), T2: assignment(3, 0, topic_id="x")}
    changes = local_changes_between(ME, before, after)
    assert dict(changes.deletes) == {}
    assert dict(changes.leaders) == {T1: assignment(ME, 2)}
    assert dict(changes.followers) == {T2: assignment(3, 0, topic_id="x")}
    assert set(local_changes_between(ME, after, {}).deletes) == set(after)


def test_split_puts_removals_before_and_additions_after_the_image_commit(tmp_path: Path) -> None:
    manager, _, _ = make_manager(tmp_path)
    manager.apply(LocalChanges(leaders={T0: assignment(ME, 1)}, followers={T1: assignment(2, 1)}))
    t3 = TopicPartition("orders", 3)
    changes = LocalChanges(
        deletes={T1: "id-orders"},
        leaders={T2: assignment(ME, 0, topic_id="id-events")},
        followers={T0: assignment(2, 2), t3: assignment(2, 0)},
    )
    revocations, grants = manager.split(changes)
    assert dict(revocations.deletes) == {T1: "id-orders"} and set(revocations.followers) == {T0}
    assert not revocations.leaders
    assert set(grants.leaders) == {T2} and set(grants.followers) == {t3} and not grants.deletes


def test_a_storage_error_while_creating_takes_the_log_dir_offline_not_the_broker(tmp_path: Path) -> None:
    """A FatalStorageError (a failed write/fsync, EMFILE) or a segment that cannot be opened is Kafka's
    KafkaStorageException: that log dir goes offline and new partitions go to the others; only when no
    dir is left does AllLogDirsOfflineError stop the broker."""
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    memory = MemoryLogOpener()

    def opener(path: Path) -> PartitionLog:
        if path.parent == dirs[0]:
            raise FatalStorageError(f"write to {path}/00000000000000000000.log failed (No space left)")
        return memory(path)

    manager = PartitionManager(ME, dirs, opener)
    manager.load()
    manager.apply(LocalChanges(leaders={T0: assignment(ME)}))  # placed on d0 (both empty): fails there
    assert manager.offline_dirs.keys() == {dirs[0]} and T0 in manager.offline
    manager.apply(LocalChanges(leaders={T1: assignment(ME)}))
    hosted = manager.get(T1)
    assert hosted is not None and hosted.log_dir == dirs[1]
    assert manager.offline_report() == ([str(dirs[0])], [("orders", 0)])

    def failing(path: Path) -> PartitionLog:
        raise StorageStateError(f"cannot open segment {path}/00000000000000000000.log: Too many open files")

    alone = PartitionManager(ME, [tmp_path / "only"], failing)
    alone.load()
    with pytest.raises(AllLogDirsOfflineError, match=r"every log dir is offline .*Too many open files"):
        alone.apply(LocalChanges(leaders={T2: assignment(ME)}))
