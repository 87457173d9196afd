"""An insertion-ordered mutable map whose every operation is bounded: no C call proportional to its size.

Why (issue #17): a ``dict`` rebuilds its whole table when it passes 2/3 full — one C call that rehashes
every key (~85 ns per ``str`` key on a big heap: the hash is read from each key object, a cache miss
apiece).  A snapshot load's delta holds one entry per topic: at 87,381 and 174,762 topics that is one
7.4 / 17.7 ms operation inside a 5 ms work unit (docs/internals/raft-performance.md, "Dict resizes and
other single C operations").  A dict cannot be presized from Python for keys not yet known.

How: up to :data:`SPLIT_AT` keys one dict holds everything (small maps cost what a dict costs); past it
the keys are spread over :data:`SHARDS` dicts by ``hash(key)``, so a table rebuild copies one shard
(~1/256 of the keys).  Lookups stay one hash and one dict lookup: ``shards[hash(key) & mask]``.

Insertion order (what a dict gives, and what the image's topic maps and the tests rely on) is kept apart,
in a list of keys cut in chunks of :data:`ORDER_CHUNK` (so the list's own growth never copies more than a
chunk).  A removal leaves the key's entry in the order, stale, and counts it (``_stale``: a key removed
twice has two); iteration skips a key's stale entries — always its first ones, as a re-inserted key goes
last, a replaced value keeps its place, as in a dict.  While nothing was removed iteration is the order
list itself, in C.  Stale entries are dropped by :meth:`ShardedMap.compact_steps` (or once they outnumber
the live keys, in one go: a map that mostly deletes should be rebuilt instead).

Unlike a dict, iterating while the map changes is not detected; don't.
"""

from __future__ import annotations

from collections.abc import (
    Generator,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    MutableMapping,
    ValuesView,
)
from itertools import chain
from typing import Any, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

SPLIT_AT = 2_048
"""Keys above which the map is spread over :data:`SHARDS` dicts (the split itself: ~0.6 ms of CPU at
4,096 keys, so at 2,048: ~0.3 ms)."""
SHARDS = 256
"""Dicts a split map has: at a million keys each holds ~4,000 (a rebuild of one: ~0.3 ms)."""
ORDER_CHUNK = 4_096
"""Keys per chunk of the insertion order."""
COMPACT_STEP = 4_096
"""Order slots :meth:`ShardedMap.compact_steps` looks at between two pauses."""


_MISSING: Any = object()


class ShardedMap(MutableMapping[K, V]):
    """A ``dict`` in behaviour (insertion order included); see the module docstring for why."""

    __slots__ = ("_len", "_mask", "_order", "_shards", "_stale", "_stale_total")

    _shards: list[dict[K, V]]
    _mask: int
    _order: list[list[K]]
    _len: int
    _stale: dict[K, int]
    _stale_total: int

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        # (an empty map is made per MetadataDelta, per committed batch: kept to plain assignments)
        self._shards, self._mask = [{}], 0
        self._order, self._len = [[]], 0
        self._stale, self._stale_total = {}, 0
        if items:
            pairs = items.items() if isinstance(items, Mapping) else items
            for key, value in pairs:
                self[key] = value

    @classmethod
    def of_dict(cls, entries: dict[K, V]) -> ShardedMap[K, V]:
        """A map of ``entries``, in their order, built shard by shard (no call per key: ~4x faster than
        inserting them one by one; what a dict outgrowing its size is turned into)."""
        made: ShardedMap[K, V] = cls()
        keys = list(entries)
        made._order = [keys[start : start + ORDER_CHUNK] for start in range(0, len(keys), ORDER_CHUNK)] or [
            []
        ]
        made._len = len(keys)
        if made._len > SPLIT_AT:
            mask = SHARDS - 1
            shards: list[dict[K, V]] = [{} for _ in range(SHARDS)]
            for key, value in entries.items():
                shards[hash(key) & mask][key] = value
            made._shards, made._mask = shards, mask
        else:
            made._shards = [dict(entries)]
        return made

    def __bool__(self) -> bool:
        return self._len > 0

    # ---- lookups: one hash, one dict lookup ----

    def __getitem__(self, key: K) -> V:
        return self._shards[hash(key) & self._mask][key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...
    def get(self, key: K, default: Any = None, /) -> Any:
        return self._shards[hash(key) & self._mask].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._shards[hash(key) & self._mask]

    def __len__(self) -> int:
        return self._len

    # ---- changes ----

    def __setitem__(self, key: K, value: V) -> None:
        shard = self._shards[hash(key) & self._mask]
        if key in shard:
            shard[key] = value
            return
        shard[key] = value
        last = self._order[-1]
        if len(last) >= ORDER_CHUNK:
            last = []
            self._order.append(last)
        last.append(key)
        self._len += 1
        if self._len > SPLIT_AT and not self._mask:
            self._split()

    def __delitem__(self, key: K) -> None:
        del self._shards[hash(key) & self._mask][key]
        self._len -= 1
        self._stale[key] = self._stale.get(key, 0) + 1
        self._stale_total += 1
        if self._stale_total > ORDER_CHUNK and self._stale_total > self._len:
            for _ in self.compact_steps():
                pass

    @overload
    def pop(self, key: K, /) -> V: ...
    @overload
    def pop(self, key: K, default: V | T, /) -> V | T: ...
    def pop(self, key: K, default: Any = _MISSING, /) -> Any:
        value = self._shards[hash(key) & self._mask].get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        del self[key]
        return value

    def popitem(self) -> tuple[K, V]:
        """The last inserted (key, value), removed (LIFO, as a dict's)."""
        order = self._order
        while True:
            last = order[-1]
            if not last:
                if len(order) == 1:
                    raise KeyError("popitem(): map is empty")
                order.pop()
                continue
            key = last.pop()
            shard = self._shards[hash(key) & self._mask]
            if key in shard:  # (a key's last entry is its live one, if it is live)
                self._len -= 1
                return key, shard.pop(key)
            self._drop_stale(key)

    def _drop_stale(self, key: K) -> None:
        left = self._stale[key] - 1
        if left:
            self._stale[key] = left
        else:
            del self._stale[key]
        self._stale_total -= 1

    def setdefault(self, key: K, default: V = None) -> V:  # type: ignore[assignment]
        got = self._shards[hash(key) & self._mask].get(key, _MISSING)
        if got is not _MISSING:
            return got  # type: ignore[no-any-return]
        self[key] = default
        return default

    def clear(self) -> None:
        self._shards, self._mask = [{}], 0
        self._order, self._len = [[]], 0
        self._stale, self._stale_total = {}, 0

    def _split(self) -> None:
        mask = SHARDS - 1
        shards: list[dict[K, V]] = [{} for _ in range(SHARDS)]
        for key, value in self._shards[0].items():
            shards[hash(key) & mask][key] = value
        self._shards, self._mask = shards, mask

    def compact_steps(self) -> Generator[None, None, None]:
        """Drop the order's stale entries, pausing (yielding) after every :data:`COMPACT_STEP` entries;
        the map must not change until the generator is exhausted."""
        if not self._stale_total:
            return
        new_order: list[list[K]] = [[]]
        last = new_order[-1]
        for seen, key in enumerate(self._live_keys(dict(self._stale)), 1):
            if len(last) >= ORDER_CHUNK:
                last = []
                new_order.append(last)
            last.append(key)
            if seen % COMPACT_STEP == 0:
                yield
        self._order = new_order
        self._stale, self._stale_total = {}, 0

    # ---- iteration, in insertion order ----

    def _live_keys(self, skip: dict[K, int]) -> Iterator[K]:
        """The order's live entries: each key's first ``skip[key]`` entries are stale (``skip`` is used
        up)."""
        for key in chain.from_iterable(self._order):
            stale = skip.get(key)
            if stale:
                skip[key] = stale - 1
                continue
            yield key

    def __iter__(self) -> Iterator[K]:
        if self._stale:
            return self._live_keys(dict(self._stale))
        return chain.from_iterable(self._order)

    def __reversed__(self) -> Iterator[K]:
        keys = list(self)
        keys.reverse()
        return iter(keys)

    def iter_items(self) -> Iterator[tuple[K, V]]:
        """``items()`` as a plain iterator (what the hot loops use); before the split, all in C.  After
        it each key is looked up in its shard, ~0.3-0.6 us a key on a big heap — memory, not Python: a
        per-chunk ``map`` over ``hash`` and the shards' ``__getitem__``, all in C, measured no faster
        (session 12); :meth:`unordered_items` reads the shards in a row where order does not matter."""
        if not self._mask:
            return zip(self, map(self._shards[0].__getitem__, self), strict=True)
        return self._split_items()

    def _split_items(self) -> Iterator[tuple[K, V]]:
        shards, mask = self._shards, self._mask
        for key in self:
            yield key, shards[hash(key) & mask][key]

    def iter_values(self) -> Iterator[V]:
        if not self._mask:
            return map(self._shards[0].__getitem__, self)
        return self._split_values()

    def _split_values(self) -> Iterator[V]:
        shards, mask = self._shards, self._mask
        for key in self:
            yield shards[hash(key) & mask][key]

    def unordered_items(self) -> Iterator[tuple[K, V]]:
        """The items in no particular order (shard by shard), all in C and in memory order: for a caller
        that only collects them into something unordered.  Iterating in insertion order looks every
        key up in its shard (~0.3-0.6 us a key on a big heap: a cache miss apiece), a dict's own
        iteration reads its entries in a row (~12 ns a key)."""
        return chain.from_iterable(map(dict.items, self._shards))

    def keys(self) -> KeysView[K]:
        return KeysView(self)

    def items(self) -> ItemsView[K, V]:
        return _Items(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def __repr__(self) -> str:
        return f"ShardedMap({dict(self.iter_items())!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and all(
            key in other and other[key] == value for key, value in self.iter_items()
        )

    __hash__ = None  # type: ignore[assignment]


class _Items(ItemsView[K, V]):
    __slots__ = ()
    _mapping: ShardedMap[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._mapping.iter_items()


class _Values(ValuesView[V]):
    __slots__ = ()
    _mapping: ShardedMap[Any, V]

    def __iter__(self) -> Iterator[V]:
        return self._mapping.iter_values()
