"""kraft.sharded_map.ShardedMap against a dict model: after any sequence of operations the same items in
the same (insertion) order, the same answers from every operation, before and after its split into
shards, across chunks of the order, with removed keys' stale entries skipped and dropped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft import sharded_map
from kraft.sharded_map import ShardedMap


@contextmanager
def small_limits() -> Iterator[None]:
    """Split, order chunks and compaction at sizes a test reaches in a few dozen operations."""
    with mock.patch.multiple(sharded_map, SPLIT_AT=8, SHARDS=4, ORDER_CHUNK=3, COMPACT_STEP=2):
        yield


KEYS = st.one_of(st.integers(min_value=-20, max_value=40), st.sampled_from(["a", "b", "c", "t-1", "t-2"]))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers()),
        st.tuples(st.just("del"), KEYS, st.none()),
        st.tuples(st.just("pop"), KEYS, st.none()),
        st.tuples(st.just("popitem"), st.none(), st.none()),
        st.tuples(st.just("setdefault"), KEYS, st.integers()),
        st.tuples(st.just("compact"), st.none(), st.none()),
        st.tuples(st.just("clear"), st.none(), st.none()),
        st.tuples(st.just("update"), st.lists(KEYS, max_size=12), st.integers()),
    ),
    max_size=120,
)


def _check_same(sharded: ShardedMap[Any, int], model: dict[Any, int]) -> None:
    assert len(sharded) == len(model)
    assert list(sharded) == list(model)
    assert list(sharded.items()) == list(model.items())
    assert list(sharded.values()) == list(model.values())
    assert list(reversed(sharded)) == list(reversed(model))
    assert Counter(sharded.unordered_items()) == Counter(model.items())  # (each item once, any order)
    assert sharded == model and model == sharded
    for key, value in model.items():
        assert key in sharded and sharded[key] == value and sharded.get(key) == value


@settings(max_examples=300)
@given(OPS, st.sets(KEYS, max_size=10))
def test_behaves_like_a_dict(ops: list[tuple[str, Any, int | None]], probes: set[object]) -> None:
    with small_limits():
        sharded: ShardedMap[object, int] = ShardedMap()
        model: dict[object, int] = {}
        for op, key, value in ops:
            if op == "set":
                assert value is not None
                sharded[key] = value
                model[key] = value
            elif op in ("del", "pop"):
                if key in model:
                    if op == "del":
                        del sharded[key]
                        del model[key]
                    else:
                        assert sharded.pop(key) == model.pop(key)
                else:
                    with pytest.raises(KeyError):
                        del sharded[key]
                    assert sharded.pop(key, -1) == -1
            elif op == "popitem":
                if model:
                    assert sharded.popitem() == model.popitem()
                else:
                    with pytest.raises(KeyError):
                        sharded.popitem()
            elif op == "setdefault":
                assert value is not None
                assert sharded.setdefault(key, value) == model.setdefault(key, value)
            elif op == "update":
                assert value is not None
                batch = {k: value + i for i, k in enumerate(key)}
                sharded.update(batch)
                model.update(batch)
            elif op == "compact":
                for _ in sharded.compact_steps():
                    pass
            else:
                sharded.clear()
                model.clear()
            _check_same(sharded, model)
        for key in probes:
            assert (key in sharded) == (key in model)
            assert sharded.get(key, -7) == model.get(key, -7)


@pytest.mark.parametrize("count", [0, 1, 4_096, 4_097, 20_000])
def test_real_limits_keep_order_and_lookups(count: int) -> None:
    """With the shipped limits: the split past 4,096 keys and chunks of 4,096 keep insertion order; a
    removal and a re-insertion move the key last, as in a dict."""
    keys = [f"topic-{i}" for i in range(count)]
    sharded: ShardedMap[str, int] = ShardedMap((key, i) for i, key in enumerate(keys))
    model = {key: i for i, key in enumerate(keys)}
    _check_same(sharded, model)
    for key in keys[::97]:
        del sharded[key]
        del model[key]
    for key in keys[::194]:
        sharded[key] = -1
        model[key] = -1
    _check_same(sharded, model)
    while model:
        assert sharded.popitem() == model.popitem()
    _check_same(sharded, model)


def test_split_spreads_keys_over_shards() -> None:
    sharded: ShardedMap[int, int] = ShardedMap((i, i) for i in range(sharded_map.SPLIT_AT + 1))
    sizes = [len(shard) for shard in sharded._shards]
    assert len(sizes) == sharded_map.SHARDS
    assert max(sizes) < sharded_map.SPLIT_AT // 16  # no shard holds a big share


@pytest.mark.parametrize("count", [0, 5, 9, 20])
def test_of_dict_equals_inserting_one_by_one(count: int) -> None:
    """``of_dict`` (what the delta turns an outgrown dict into) holds what inserting gives, and goes on
    behaving like a dict: removals, re-insertions, more keys."""
    with small_limits():
        model = {f"k{i}": i for i in range(count)}
        made = ShardedMap.of_dict(model)
        assert made._mask == (0 if count <= sharded_map.SPLIT_AT else sharded_map.SHARDS - 1)
        _check_same(made, model)
        for key in list(model)[::2]:
            del made[key]
            del model[key]
        for i in range(count, count + 7):
            made[f"k{i}"] = i
            model[f"k{i}"] = i
        made["k1"] = -1
        model["k1"] = -1
        _check_same(made, model)
