"""A big topic's changed partitions in parts (``kraft.metadata.delta._PartitionParts``, issue #17): a
dict rebuilding its table at 699,051 partitions was one 27-29 ms piece of a snapshot load; parts of
``1 << PART_BITS`` ids never copy more than one part.  Driven against a dict with tiny parts."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import delta as delta_module
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta, _PartitionParts
from kraft.metadata.image import MetadataImage, PartitionRegistration
from kraft.v1 import common_pb2
from kraft.v1 import metadata_pb2 as pb


def _reg(n: int) -> PartitionRegistration:
    return PartitionRegistration((1, 2), (1,), 1, n, n)


OPS = st.lists(
    st.tuples(st.sampled_from(["set", "del", "pop"]), st.integers(min_value=-2, max_value=40), st.integers()),
    max_size=80,
)


@settings(max_examples=200)
@given(st.dictionaries(st.integers(min_value=0, max_value=40), st.integers(), max_size=12), OPS)
def test_behaves_like_a_dict_of_partitions(first: dict[int, int], ops: list[tuple[str, int, int]]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_module, "PART_BITS", 2)  # parts of 4 ids
        model = {p: _reg(v) for p, v in first.items()}
        parts = _PartitionParts(dict(model))
        for op, partition_id, value in ops:
            if op == "set" and partition_id >= 0:
                parts[partition_id] = model[partition_id] = _reg(value)
            elif op == "set":
                with pytest.raises(KeyError):
                    parts[partition_id] = _reg(value)
            elif partition_id in model:
                if op == "del":
                    del parts[partition_id]
                    del model[partition_id]
                else:
                    assert parts.pop(partition_id) == model.pop(partition_id)
            else:
                with pytest.raises(KeyError):
                    del parts[partition_id]
                assert parts.pop(partition_id, None) is None
            assert len(parts) == len(model)
            assert dict(parts.items()) == model and Counter(parts.values()) == Counter(model.values())
            assert sorted(parts) == sorted(model) and parts == model
            for probe in range(-2, 42):
                assert (probe in parts) == (probe in model)
                assert parts.get(probe) == model.get(probe)
                if probe in model:
                    assert parts[probe] == model[probe]
                    assert parts.part(probe)[probe] == model[probe]


def test_ids_inserted_in_order_iterate_in_order_and_a_dense_first_part_is_not_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delta_module, "PART_BITS", 3)
    first = {p: _reg(p) for p in range(8)}
    parts = _PartitionParts(first)
    assert parts._parts[0] is first
    for p in range(8, 30):
        parts[p] = _reg(p)
    assert list(parts.items()) == [(p, _reg(p)) for p in range(30)]
    assert list(parts) == list(range(30)) and list(parts.values()) == [_reg(p) for p in range(30)]
    assert [len(part) for part in parts._parts] == [8, 8, 8, 6]  # no part holds more than 8


def _topic_records(count: int) -> list[pb.MetadataRecord]:
    out = [
        records.wrap(
            pb.RegisterBrokerRecord(
                broker_id=b,
                broker_epoch=b,
                incarnation_id=f"inc-{b}",
                endpoints=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + b)],
                fenced=False,
            )
        )
        for b in (1, 2, 3)
    ]
    out.append(records.wrap(pb.TopicRecord(name="huge", topic_id="H")))
    for p in range(count):
        replicas = [1 + p % 3, 1 + (p + 1) % 3]
        out.append(
            records.wrap(
                pb.PartitionRecord(
                    partition_id=p,
                    topic_id="H",
                    replicas=replicas,
                    isr=replicas,
                    leader=replicas[0],
                    eligible_leader_replicas=[3] if p % 97 == 0 else [],
                )
            )
        )
    return out


def test_a_snapshots_huge_topic_is_parted_and_gives_the_same_image_and_local_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic of 5,000 partitions with parts of 1,024 (the shipped part: 32,768) against the same
    records with parts too big to reach: equal images, ELR index and a broker's local changes."""
    snapshot = _topic_records(5_000)
    plain = MetadataDelta(MetadataImage.empty())
    plain.replay_decoded(snapshot)
    assert type(plain._topics["H"].changed) is dict
    monkeypatch.setattr(delta_module, "PART_BITS", 10)
    monkeypatch.setattr(delta_module, "_PARTED_FROM", (1 << 10) - 1)
    parted = MetadataDelta(MetadataImage.empty())
    parted.replay_decoded(snapshot)
    changed = parted._topics["H"].changed
    assert isinstance(changed, _PartitionParts)
    assert max(map(len, changed._parts)) == 1 << 10
    for broker in (1, 2, 3):
        assert parted.local_changes(broker) == plain.local_changes(broker)
    image = parted.apply()
    assert image == plain.apply()
    assert image.topics_by_id["H"].partitions[4_999] == plain.partition("H", 4_999)
