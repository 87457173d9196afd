"""The image's persistent topic maps (kraft.metadata.pmap) against a dict model: same items, same
(dict) order, and every older version unchanged after later changes."""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.pmap import CHUNK, PersistentMap
from kraft.v1 import metadata_pb2 as pb

KEYS = st.integers(min_value=0, max_value=3 * CHUNK)  # enough keys for several chunks and re-packs
# one change: (keys removed, (key, value) pairs set)
CHANGES = st.tuples(st.lists(KEYS, max_size=80), st.lists(st.tuples(KEYS, st.integers()), max_size=80))


def _model_step(model: dict[int, int], removed: list[int], updated: list[tuple[int, int]]) -> dict[int, int]:
    after = dict(model)
    for key in removed:
        after.pop(key, None)
    for key, value in updated:
        after[key] = value
    return after


def _same(pmap: PersistentMap[int, int], model: dict[int, int]) -> None:
    assert list(pmap.items()) == list(model.items())  # dict order too: insertion, a new key last
    assert list(pmap) == list(model) and list(pmap.values()) == list(model.values())
    assert len(pmap) == len(model) and pmap == model and model == pmap
    for key in range(3 * CHUNK + 1):
        assert (key in pmap) == (key in model)
        assert pmap.get(key) == model.get(key) and pmap.get(key, -1) == model.get(key, -1)
        if key in model:
            assert pmap[key] == model[key]


@settings(max_examples=60, deadline=None)
@given(initial=st.lists(st.tuples(KEYS, st.integers()), max_size=300), changes=st.lists(CHANGES, max_size=12))
def test_versions_equal_a_dict_model_and_older_versions_stay(
    initial: list[tuple[int, int]], changes: list[tuple[list[int], list[tuple[int, int]]]]
) -> None:
    versions = [(PersistentMap(initial), dict(initial))]
    _same(*versions[0])
    for removed, updated in changes:
        pmap, model = versions[-1]
        versions.append((pmap.with_changes(removed, updated), _model_step(model, removed, updated)))
        _same(*versions[-1])
    for pmap, model in versions:  # no later change reached an older version
        _same(pmap, model)
    last, model = versions[-1]
    _same(pickle.loads(pickle.dumps(last)), model)


def test_a_removal_heavy_history_repacks_and_keeps_order() -> None:
    pmap: PersistentMap[int, int] = PersistentMap((k, k) for k in range(4 * CHUNK))
    model = dict(pmap.items())
    for start in range(0, 4 * CHUNK - 8, 8):  # remove most keys a few at a time, add one back each time
        removed, updated = list(range(start, start + 7)), [(start + 1, -start)]
        pmap, model = pmap.with_changes(removed, updated), _model_step(model, removed, updated)
        _same(pmap, model)
    assert pmap._size < 4 * CHUNK  # re-packed at least once: the holes do not pile up


TOPIC_OPS = st.lists(
    st.tuples(st.sampled_from(["create", "remove"]), st.integers(min_value=0, max_value=40)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(TOPIC_OPS, max_size=10))
def test_images_after_random_deltas_equal_a_dict_model(batches: list[list[tuple[str, int]]]) -> None:
    image = MetadataImage.empty()
    by_id: dict[str, str] = {}  # topic id -> name, in the order a dict image had them
    by_name: dict[str, str] = {}
    history = [(image, dict(by_id), dict(by_name))]
    serial = 0
    for ops in batches:
        delta = MetadataDelta(image)
        for op, n in ops:
            name = f"t{n}"
            if op == "create" and name not in by_name:
                serial += 1
                topic_id = f"id-{serial}"
                delta.replay(records.wrap(pb.TopicRecord(name=name, topic_id=topic_id)))
                by_id[topic_id], by_name[name] = name, topic_id
            elif op == "remove" and name in by_name:
                topic_id = by_name.pop(name)
                delta.replay(records.wrap(pb.RemoveTopicRecord(topic_id=topic_id)))
                del by_id[topic_id]
        assert not delta.replay_errors
        image = delta.apply()
        history.append((image, dict(by_id), dict(by_name)))
    for old, ids, names in history:  # every image, the older ones too, still holds what it held
        assert [(t, topic.name) for t, topic in old.topics_by_id.items()] == list(ids.items())
        # content only: a name removed and created again in one delta keeps its first place, as it did
        # in the dict the delta applied (the delta keeps one entry per name)
        assert old.topic_ids_by_name == names and len(old.topic_ids_by_name) == len(names)
        assert all(old.topic(name) is old.topics_by_id[t] for name, t in names.items())
    rebuilt = MetadataImage(
        offset=image.offset,
        epoch=image.epoch,
        brokers={},
        topics_by_id=dict(image.topics_by_id),  # plain dicts are converted at the constructor
        topic_ids_by_name=dict(image.topic_ids_by_name),
        configs={},
        features={},
    )
    assert rebuilt == image and isinstance(rebuilt.topics_by_id, PersistentMap)


def _brute_changes(
    new: PersistentMap[int, object], old: Mapping[int, object]
) -> tuple[list[int], list[tuple[int, object]]]:
    """The image store's old full pass: a lookup per key of both maps."""
    return [k for k in old if k not in new], [(k, v) for k, v in new.items() if old.get(k) is not v]


@settings(max_examples=60, deadline=None)
@given(initial=st.lists(st.tuples(KEYS, st.integers()), max_size=300), changes=st.lists(CHANGES, max_size=8))
def test_changes_since_any_version_equal_a_full_comparison(
    initial: list[tuple[int, int]], changes: list[tuple[list[int], list[tuple[int, int]]]]
) -> None:
    # Values are fresh objects, so "changed" means a new object, as for the image's TopicImages.
    versions: list[PersistentMap[int, object]] = [PersistentMap((k, [v]) for k, v in initial)]
    for removed, updated in changes:
        versions.append(versions[-1].with_changes(removed, [(k, [v]) for k, v in updated]))
    unrelated = PersistentMap(versions[-1].items())  # same items, no chunk shared
    for new in [*versions, unrelated]:
        for old in [*versions, unrelated, dict(versions[0].items())]:
            assert new.changes_since(old) == _brute_changes(new, old)


def test_changes_since_skips_the_shared_chunks() -> None:
    old: PersistentMap[int, int] = PersistentMap((k, k) for k in range(10 * CHUNK))
    new = old.with_changes([3], [(5 * CHUNK, -1), (10 * CHUNK, 7)])
    assert new.changes_since(old) == ([3], [(5 * CHUNK, -1), (10 * CHUNK, 7)])
    assert old.changes_since(old) == ([], [])
    # Two chunks changed and one was added; the other eight are shared (the same objects), so skipped.
    assert sum(a is not b for a, b in zip(new._chunks, old._chunks, strict=False)) == 2
    assert len(new._chunks) == len(old._chunks) + 1


class _Value:
    __slots__ = ("__weakref__",)


def test_a_maps_parts_hold_all_it_holds_below_its_top_in_bounded_shares() -> None:
    """``parts()`` (what the reaper frees a replaced image's topic maps in): with the parts kept,
    dropping the map frees none of its keys' values; each part holds a bounded share of the entries."""
    values = [_Value() for _ in range(20_000)]
    refs = [weakref.ref(v) for v in values]
    mapping = PersistentMap((f"T{i}", v) for i, v in enumerate(values))
    del values
    parts = mapping.parts()
    chunk_parts = [p for p in parts if isinstance(p, tuple)]
    node_parts = [p for p in parts if not isinstance(p, tuple)]
    del parts
    assert len(chunk_parts) == -(-20_000 // CHUNK) and len(node_parts) >= 2 * 16
    del mapping
    assert all(r() is not None for r in refs)  # everything is still held, by the parts
    while chunk_parts:
        chunk_parts.pop()
    assert all(r() is not None for r in refs)  # (the values HAMT's nodes hold them too)
    freed = 0
    while node_parts:
        node_parts.pop()
        now = sum(1 for r in refs if r() is None)
        assert now - freed <= 20_000 // 8  # a subtree under the root: a small share of the keys
        freed = now
    assert freed == 20_000
