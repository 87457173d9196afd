"""quorum-state, meta.properties and Kafka UUIDs: atomic writes, validation, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kraft.storage.errors import InconsistentClusterIdError, StorageStateError
from kraft.storage.ids import ZERO_UUID, is_valid_uuid, parse_uuid, random_uuid
from kraft.storage.meta_properties import (
    META_PROPERTIES_FILE,
    MetaProperties,
    check_meta_properties,
    format_log_dir,
    read_meta_properties,
)
from kraft.storage.quorum_state import QUORUM_STATE_FILE, QuorumState, QuorumStateStore


def test_random_uuids_are_22_char_base64url_and_parse() -> None:
    for _ in range(200):
        text = random_uuid()
        assert len(text) == 22 and not text.startswith("-") and text != ZERO_UUID
        assert len(parse_uuid(text)) == 16


@given(st.text(max_size=30))
def test_parse_uuid_rejects_anything_but_a_canonical_uuid(text: str) -> None:
    if is_valid_uuid(text):
        assert len(text) == 22
    else:
        with pytest.raises(ValueError, match="invalid UUID"):
            parse_uuid(text)


def test_parse_uuid_rejects_non_canonical_last_character() -> None:
    assert is_valid_uuid("AAAAAAAAAAAAAAAAAAAAAQ")
    assert not is_valid_uuid("AAAAAAAAAAAAAAAAAAAAAR")  # low bits set: not what 16 bytes encode to


def test_quorum_state_round_trips_as_kafka_json(tmp_path: Path) -> None:
    store = QuorumStateStore(tmp_path)
    assert store.read() is None
    state = QuorumState(leader_epoch=5, leader_id=None, voted_id=2, voted_directory_id=random_uuid())
    store.write(state)
    body = json.loads((tmp_path / QUORUM_STATE_FILE).read_text())
    assert body["leaderId"] == -1 and body["votedId"] == 2 and body["leaderEpoch"] == 5
    assert body["data_version"] == 1
    assert store.read() == state
    store.write(QuorumState(leader_epoch=6, leader_id=1))
    assert store.read() == QuorumState(leader_epoch=6, leader_id=1)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{not json",
        "[]",
        '{"leaderEpoch": "x", "data_version": 1}',
        '{"leaderEpoch": 1, "data_version": 9}',
        '{"leaderEpoch": -3, "data_version": 1}',
    ],
)
def test_corrupt_quorum_state_is_a_clear_error_and_left_alone(tmp_path: Path, content: str) -> None:
    (tmp_path / QUORUM_STATE_FILE).write_text(content)
    with pytest.raises(StorageStateError, match=r"corrupt .*quorum-state"):
        QuorumStateStore(tmp_path).read()
    assert (tmp_path / QUORUM_STATE_FILE).read_text() == content


def test_format_writes_meta_properties_once(tmp_path: Path) -> None:
    cluster = random_uuid()
    props = format_log_dir(tmp_path / "logs", cluster_id=cluster, node_id=3)
    text = (tmp_path / "logs" / META_PROPERTIES_FILE).read_text()
    assert f"cluster.id={cluster}" in text and "node.id=3" in text and "version=1" in text
    assert read_meta_properties(tmp_path / "logs") == props
    with pytest.raises(StorageStateError, match="already formatted"):
        format_log_dir(tmp_path / "logs", cluster_id=random_uuid(), node_id=3)
    assert (tmp_path / "logs" / META_PROPERTIES_FILE).read_text() == text
    assert format_log_dir(tmp_path / "logs", cluster_id=cluster, node_id=3, ignore_formatted=True) == props


def test_unformatted_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageStateError, match=r"not formatted.*kraft storage format"):
        check_meta_properties(tmp_path, cluster_id=random_uuid(), node_id=1)


def test_cluster_or_node_mismatch_is_refused_and_nothing_is_overwritten(tmp_path: Path) -> None:
    format_log_dir(tmp_path, cluster_id=random_uuid(), node_id=1)
    before = (tmp_path / META_PROPERTIES_FILE).read_text()
    with pytest.raises(InconsistentClusterIdError, match="belongs to cluster"):
        check_meta_properties(tmp_path, cluster_id=random_uuid(), node_id=1)
    with pytest.raises(StorageStateError, match="belongs to node 1, not node 2"):
        check_meta_properties(tmp_path, node_id=2)
    with pytest.raises(InconsistentClusterIdError):
        format_log_dir(tmp_path, cluster_id=random_uuid(), node_id=1, ignore_formatted=True)
    assert (tmp_path / META_PROPERTIES_FILE).read_text() == before


@pytest.mark.parametrize(
    "content",
    [
        "cluster.id=abc\nnode.id=1\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAQ\nversion=1\n",
        "node.id=1\n",
        "garbage line\n",
    ],
)
def test_corrupt_meta_properties_is_a_clear_error(tmp_path: Path, content: str) -> None:
    (tmp_path / META_PROPERTIES_FILE).write_text(content)
    with pytest.raises(StorageStateError, match="corrupt"):
        read_meta_properties(tmp_path)


def test_invalid_cluster_id_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(StorageStateError, match="not a valid Kafka UUID"):
        format_log_dir(tmp_path / "d", cluster_id="not-a-uuid", node_id=1)
    assert not (tmp_path / "d").exists()


def test_meta_properties_validates_its_fields() -> None:
    with pytest.raises(ValueError, match=r"node\.id"):
        MetaProperties(cluster_id=random_uuid(), node_id=-1, directory_id=random_uuid())
