"""The monitor's samples: which controller's view is trusted, and what a sample says about its timing."""

from __future__ import annotations

import itertools

import pytest

from chaos import monitor as monitor_module
from chaos.checkers import ClusterSample
from chaos.monitor import ClusterMonitor
from kraft.cluster.probe import BrokerView, ClusterView, QuorumView
from kraft.cluster.spec import NodeRole, NodeSpec
from kraft.errors import ErrorCode

CONTROLLERS = [NodeSpec(i, NodeRole.CONTROLLER, "127.0.0.1", 9000 + i) for i in (1, 2, 3)]


def _poll(
    monkeypatch: pytest.MonkeyPatch, views: dict[int, tuple[int, int] | None], fenced: bool = True
) -> tuple[ClusterSample, list[str]]:
    """One poll where controller i answers DescribeQuorum with ``views[i]`` = (leader, epoch)."""
    asked: list[str] = []

    def quorum_view(target: str, timeout_s: float) -> QuorumView | None:
        view = views[int(target.rsplit(":", 1)[1]) - 9000]
        return None if view is None else QuorumView(view[0], view[1], 10, ErrorCode.NONE)

    def cluster_view(target: str, cluster_id: str, timeout_s: float) -> ClusterView | None:
        asked.append(target)
        state = "FENCED" if fenced else "ACTIVE"
        return ClusterView(metadata_offset=42, brokers={101: BrokerView(101, state, metadata_offset=42)})

    monkeypatch.setattr(monitor_module, "quorum_view", quorum_view)
    monkeypatch.setattr(monitor_module, "cluster_view", cluster_view)
    clock = itertools.count(100, 10)
    watcher = ClusterMonitor("c", CONTROLLERS, clock_ns=lambda: next(clock))
    return watcher.poll_once(), asked


def test_a_sample_records_the_offset_and_when_it_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    sample, asked = _poll(monkeypatch, {1: (2, 5), 2: (2, 5), 3: (2, 5)})
    assert asked == ["127.0.0.1:9002"]
    # three DescribeQuorum answers at 100, 110, 120; DescribeCluster sent at 130, answered by 140
    assert sample == ClusterSample(140, 2, {101: True}, metadata_offset=42, probe_ns=130)
    assert sample.observed_from_ns == 130


def test_a_claimant_behind_a_newer_epoch_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # controller 1 still claims epoch 5 (deposed, or not yet told); controller 3 already follows epoch 6
    sample, asked = _poll(monkeypatch, {1: (1, 5), 2: None, 3: (-1, 6)})
    assert asked == [] and sample.leader_id is None and sample.fenced == {}
    # the newest claimant wins when several claim
    sample, asked = _poll(monkeypatch, {1: (1, 5), 2: (2, 6), 3: (2, 6)}, fenced=False)
    assert asked == ["127.0.0.1:9002"] and sample.fenced == {101: False}


def test_each_observation_names_the_disk_that_answered_and_a_probe_across_a_wipe_names_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # controller 1's disk is replaced (a wipe) while its DescribeQuorum is under way: the answer may come
    # from either disk, so it judges neither's epochs; controllers 2 and 3 keep theirs
    disks = {"controller-1": "old", "controller-2": "two", "controller-3": "three"}
    gone: set[str] = set()

    def quorum_view(target: str, timeout_s: float) -> QuorumView | None:
        node = int(target.rsplit(":", 1)[1]) - 9000
        if node == 1:
            disks["controller-1"] = "new"
        return QuorumView(2, 5, 10, ErrorCode.NONE)

    def disk_of(name: str) -> str:
        if name in gone:
            raise OSError("no meta.properties (mid-wipe)")
        return disks[name]

    monkeypatch.setattr(monitor_module, "quorum_view", quorum_view)
    monkeypatch.setattr(monitor_module, "cluster_view", lambda *_: None)
    clock = itertools.count(100, 10)
    names = [NodeSpec(i, NodeRole.CONTROLLER, "127.0.0.1", 9000 + i) for i in (1, 2, 3)]
    assert [n.name for n in names] == list(disks)
    watcher = ClusterMonitor("c", names, clock_ns=lambda: next(clock), disk_of=disk_of)
    sample = watcher.poll_once()
    assert [(o.observer, o.disk) for o in watcher.leaders] == [
        ("controller-2", "two"),
        ("controller-3", "three"),
    ]
    assert sample.leader_id == 2  # every answer still counts toward which controller is active
    # the next poll: controller 1 answers from its new disk; a disk mid-format is skipped too
    gone.add("controller-3")
    watcher.poll_once()
    assert [(o.observer, o.disk) for o in watcher.leaders[2:]] == [
        ("controller-1", "new"),
        ("controller-2", "two"),
    ]
