"""A big topic's changed partitions in parts (``kraft.metadata.delta._PartitionParts``, issue #17): a
dict rebuilding its table at 699,051 partitions was one 27-29 ms piece of a snapshot load; parts of
``1 << PART_BITS`` ids never copy more than one part.  Driven against a dict with tiny parts."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import delta as delta_module
from kraft.metadata import elr_holders as elr_holders_module
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta, _PartitionParts
from kraft.metadata.elr_holders import ElrHolders
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


def _changes(count: int, seed: int) -> list[pb.MetadataRecord]:
    """PartitionChangeRecords of topic H in a shuffled order (ids spread over every part): leader moves,
    and ELRs given to some partitions and taken from others (the ELR index's bulk path); from id 4,096
    on only taken (a chunk that only loses holders)."""
    rng = random.Random(seed)
    ids = list(range(count))
    rng.shuffle(ids)
    out = []
    for p in ids:
        change = pb.PartitionChangeRecord(topic_id="H", partition_id=p, leader=1 + (p + 1) % 3)
        if p % 5 == 0 and p < 4_096:
            change.eligible_leader_replicas.CopyFrom(pb.BrokerIdList(ids=[1 + (p + 2) % 3]))
        elif p % 97 == 0:
            change.eligible_leader_replicas.CopyFrom(pb.BrokerIdList(ids=[]))
        out.append(records.wrap(change))
    return out


@pytest.mark.parametrize("seed", [3, 11])
def test_a_delta_changing_more_than_a_part_of_one_topic_is_parted_stepped_and_equal(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 13 (issue #17): a delta of many batches changing more than ``1 << PART_BITS`` partitions of
    one topic (PartitionChangeRecords, ids in any order) goes into parts like a growing topic's; the
    topic is built ``APPLY_STEP_WORK`` changes a step; the ELR index advances part by part.  Image and
    ELR index equal the batch-by-batch reference (each batch applied) and an unparted, unstepped apply."""
    base_delta = MetadataDelta(MetadataImage.empty())
    base_delta.replay_decoded(_topic_records(5_000))
    base = base_delta.apply()
    changes = _changes(4_500, seed)
    plain = MetadataDelta(base)
    plain.replay_decoded(changes)
    assert type(plain._topics["H"].changed) is dict
    expected = plain.apply()
    reference = base
    for start in range(0, len(changes), 700):
        batch = MetadataDelta(reference)
        batch.replay_decoded(changes[start : start + 700])
        reference = batch.apply()
    assert expected == reference and expected.elr_holders == reference.elr_holders

    monkeypatch.setattr(delta_module, "PART_BITS", 10)
    monkeypatch.setattr(delta_module, "APPLY_STEP_WORK", 300)
    monkeypatch.setattr(elr_holders_module, "BULK_STEP_CHANGES", 200)
    parted = MetadataDelta(base)
    parted.replay_decoded(changes)
    changed = parted._topics["H"].changed
    assert isinstance(changed, _PartitionParts)
    assert len(changed) == 4_500 and max(map(len, changed._parts)) <= 1 << 10
    assert all(p >> 10 == i for i, part in enumerate(changed._parts) for p in part)
    assert dict(changed.items()) == dict(plain._topics["H"].changed.items())
    steps = parted.apply_steps()
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            image: MetadataImage = done.value
            break
        pauses += 1
    assert pauses >= 4_500 // 300 + 4_500 // 200  # the topic and its ELR holders in steps
    assert image == expected
    assert image.elr_holders == expected.elr_holders == ElrHolders.scan(image.topics_by_id)


def test_a_grown_topic_with_many_changes_is_built_in_steps_with_its_appends_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic changed and grown in one delta (changes, then CreatePartitions' new partitions): updates
    in steps, appended partitions in one final call, equal to the one-call build."""
    base_delta = MetadataDelta(MetadataImage.empty())
    base_delta.replay_decoded(_topic_records(3_000))
    base = base_delta.apply()
    grown = _topic_records(3_400)[4 + 3_000 :]  # partitions 3,000..3,399
    batch = _changes(3_000, 5) + grown
    expected = MetadataDelta(base)
    expected.replay_decoded(batch)
    want = expected.apply()
    monkeypatch.setattr(delta_module, "PART_BITS", 10)
    monkeypatch.setattr(delta_module, "APPLY_STEP_WORK", 256)
    monkeypatch.setattr(elr_holders_module, "BULK_STEP_CHANGES", 100)
    stepped = MetadataDelta(base)
    stepped.replay_decoded(batch)
    assert isinstance(stepped._topics["H"].changed, _PartitionParts)
    steps = stepped.apply_steps()
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            got: MetadataImage = done.value
            break
        pauses += 1
    assert pauses >= 3_000 // 256 + 3_000 // 100
    assert got == want and got.elr_holders == want.elr_holders == ElrHolders.scan(got.topics_by_id)
    assert len(want.topics_by_id["H"].partitions) == 3_400
