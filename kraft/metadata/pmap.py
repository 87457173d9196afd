"""An insertion-ordered persistent map: the next version of a map of n keys with k keys changed costs
O(k log n + n / CHUNK), and shares everything else with the previous version.

The image's ``topics_by_id`` and ``topic_ids_by_name`` were dicts copied whole by every
``MetadataDelta.apply`` (~0.18 ms at 6,000 topics, ~2-6 ms at 100,000, plus freeing the previous copies
on the committed image's install; issue #17).  A plain HAMT (``immutables.Map``) fixes the copy but
iterates in hash order — which depends on the process's string-hash seed and puts a new topic anywhere —
while the controller's scans, the rejoin index and the tests rely on dict order: first insertion first,
a new key last, a replaced value in place.  So this map keeps:

- ``_values``: an :class:`immutables.Map` (C HAMT, structure-sharing) from key to value, for lookups;
- ``_pos``: another, from key to its slot number;
- ``_chunks``: the ``(key, value)`` pairs in slot order, in tuples of :data:`CHUNK` slots; a removed
  key leaves ``None`` in its slot.  A change copies the chunks it touches and the (short) tuple of
  chunks; iteration is ``filter(None, chain.from_iterable(chunks))``, all in C.

Once the holes outnumber the live keys (and a chunk's worth), the next change re-packs the slots: O(n),
amortized O(1) per removal.  Immutable; equal (``==``) to any Mapping of the same items, like a dict.
"""

from __future__ import annotations

import gc
from collections.abc import Generator, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from itertools import chain
from operator import itemgetter
from typing import Any, TypeVar, overload

import immutables

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

CHUNK_BITS = 7
CHUNK = 1 << CHUNK_BITS
"""Slots per chunk: a change copies one chunk (~128 references) per touched key's slot."""
_MASK = CHUNK - 1
COMPARE_STEP = 2_048
"""Slots :meth:`PersistentMap.changes_since_steps` compares between two pauses (~0.5 ms)."""
_Chunk = tuple[tuple[Any, Any] | None, ...]
_ABSENT: Any = object()


def _hamt_node_types() -> frozenset[type]:
    """The types of an ``immutables.Map``'s inner nodes (C types with no public name), found by walking
    a map big enough to have both kinds."""
    found: set[type] = set()
    todo: list[object] = gc.get_referents(immutables.Map({i: i for i in range(1_000)}))
    while todo:
        node = todo.pop()
        if not isinstance(node, int) and type(node) not in found:
            found.add(type(node))
        todo.extend(child for child in gc.get_referents(node) if not isinstance(child, int))
    return frozenset(found)


_HAMT_NODE_TYPES = _hamt_node_types()


class PersistentMap(Mapping[K, V]):
    __slots__ = ("_chunks", "_holes", "_pos", "_size", "_values")

    _values: immutables.Map[K, V]
    _pos: immutables.Map[K, int]
    _chunks: tuple[_Chunk, ...]
    _size: int  # slots used (live keys + holes)
    _holes: int

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        positions: dict[K, int] = {}
        values: dict[K, V] = {}
        packed: list[tuple[K, V]] = []
        for key, value in pairs:  # a repeated key keeps its first slot and its last value, like dict()
            values[key] = value
            slot = positions.get(key)
            if slot is None:
                positions[key] = len(packed)
                packed.append((key, value))
            else:
                packed[slot] = (key, value)
        self._set(
            immutables.Map(values),
            immutables.Map(positions),
            tuple(tuple(packed[i : i + CHUNK]) for i in range(0, len(packed), CHUNK)),
            len(packed),
            0,
        )

    def _set(
        self,
        values: immutables.Map[K, V],
        pos: immutables.Map[K, int],
        chunks: tuple[_Chunk, ...],
        size: int,
        holes: int,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "_values", values)
        set_(self, "_pos", pos)
        set_(self, "_chunks", chunks)
        set_(self, "_size", size)
        set_(self, "_holes", holes)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"PersistentMap is immutable (cannot set {name})")

    # ---- reading ----

    def __getitem__(self, key: K) -> V:
        return self._values[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...
    def get(self, key: K, default: object = None) -> object:
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return self._size - self._holes

    def _pairs(self) -> Iterator[tuple[K, V]]:
        return filter(None, chain.from_iterable(self._chunks))

    def __iter__(self) -> Iterator[K]:
        return map(itemgetter(0), self._pairs())

    def keys(self) -> KeysView[K]:
        return _Keys(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def items(self) -> ItemsView[K, V]:
        return _Items(self)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(other) == len(self) and dict(self._pairs()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # like a dict: equal to mappings that are unhashable

    def __repr__(self) -> str:
        return f"PersistentMap({dict(self._pairs())!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (PersistentMap, (list(self._pairs()),))

    def changes_since(self, previous: Mapping[K, V]) -> tuple[list[K], list[tuple[K, V]]]:
        """What changed from ``previous`` to this map: (keys of ``previous`` not in this map, in
        ``previous``'s order; ``(key, value)`` of this map whose value is not the very object ``previous``
        holds for the key, in this map's order).

        Versions derived from one another share every chunk that no change touched (the same tuple
        object, at the same position), so only the other chunks are compared, slot by slot: O(n / CHUNK
        + CHUNK * touched chunks) instead of a lookup per key (the image store's save compared 10,000
        topics that way every 500 ms, ~5-10 ms of the event loop at a time).  Unrelated maps (or a
        ``previous`` that is not a PersistentMap) are compared in full; the result is the same."""
        steps = self.changes_since_steps(previous)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def changes_since_steps(
        self, previous: Mapping[K, V]
    ) -> Generator[None, None, tuple[list[K], list[tuple[K, V]]]]:
        """:meth:`changes_since`, pausing (yielding) after about every :data:`COMPARE_STEP` slots or keys
        compared (the result is the generator's return value): the image store's save after a snapshot
        load compares two unrelated maps of every topic, ~30-60 ms in one go at 100,000 topics.  Neither
        map changes (both are immutable)."""
        if not isinstance(previous, PersistentMap):
            gone: list[K] = []
            for seen, key in enumerate(previous, 1):
                if key not in self._values:
                    gone.append(key)
                if seen % COMPARE_STEP == 0:
                    yield
            changed: list[tuple[K, V]] = []
            for seen, (key, value) in enumerate(self._pairs(), 1):
                if previous.get(key) is not value:
                    changed.append((key, value))
                if seen % COMPARE_STEP == 0:
                    yield
            return gone, changed
        removed: list[K] = []
        updated: list[tuple[K, V]] = []
        mine, theirs = self._chunks, previous._chunks
        values, old_values = self._values, previous._values
        compared = 0
        for number in range(max(len(mine), len(theirs))):
            chunk = mine[number] if number < len(mine) else ()
            old = theirs[number] if number < len(theirs) else ()
            if chunk is old:
                continue
            for slot in range(max(len(chunk), len(old))):
                pair = chunk[slot] if slot < len(chunk) else None
                was = old[slot] if slot < len(old) else None
                if pair is was:
                    continue
                # A key gone from this map left its slot (a hole or a re-packed slot); a key whose value
                # changed holds its slot with a new pair (a pair of the same value object is no change).
                if was is not None and was[0] not in values:
                    removed.append(was[0])
                if pair is not None and old_values.get(pair[0], _ABSENT) is not pair[1]:
                    updated.append(pair)
            compared += max(len(chunk), len(old))
            if compared >= COMPARE_STEP:
                compared = 0
                yield
        return removed, updated  # slots in order: each list in its map's key order

    def parts(self) -> list[object]:
        """What this map's memory can be freed in, a bounded share each, once nothing else holds the map
        (:func:`kraft.reaper.release_replaced_maps`): its chunks of :data:`CHUNK` slots and the subtrees
        under the roots of its two HAMTs (about 1/32 of the keys each; the roots of a big map are array
        nodes).  Dropping a map of 100,000 keys in one go is ~20-30 ms; a part, under 1 ms."""
        parts: list[object] = list(self._chunks)
        for hamt in (self._values, self._pos):
            for root in gc.get_referents(hamt):
                parts.extend(child for child in gc.get_referents(root) if type(child) in _HAMT_NODE_TYPES)
        return parts

    # ---- the next version ----

    def with_changes(self, removed: Iterable[K], updated: Iterable[tuple[K, V]]) -> PersistentMap[K, V]:
        """A new map: this one without ``removed`` (absent keys ignored), then with ``updated`` set — an
        existing key keeps its place, a new one goes last (dict order).  ``self`` is left as it is."""
        chunks = list(self._chunks)
        copied: dict[int, list[tuple[Any, Any] | None]] = {}  # chunk number -> its copy being edited
        size, holes = self._size, self._holes

        def writable(number: int) -> list[tuple[Any, Any] | None]:
            chunk = copied.get(number)
            if chunk is None:
                chunk = copied[number] = list(chunks[number]) if number < len(chunks) else []
            return chunk

        with self._pos.mutate() as pos, self._values.mutate() as values:
            for key in removed:
                slot = pos.pop(key, None)
                if slot is not None:
                    del values[key]
                    writable(slot >> CHUNK_BITS)[slot & _MASK] = None
                    holes += 1
            for key, value in updated:
                values[key] = value
                slot = pos.get(key)
                if slot is None:
                    slot = pos[key] = size
                    size += 1
                    writable(slot >> CHUNK_BITS).append((key, value))
                else:
                    writable(slot >> CHUNK_BITS)[slot & _MASK] = (key, value)
            new_pos, new_values = pos.finish(), values.finish()
        for number, chunk in copied.items():
            if number < len(chunks):
                chunks[number] = tuple(chunk)
            else:
                chunks.append(tuple(chunk))
        if holes > CHUNK and holes > size - holes:  # re-pack: amortized O(1) per removal
            return PersistentMap(filter(None, chain.from_iterable(chunks)))
        result: PersistentMap[K, V] = PersistentMap.__new__(PersistentMap)
        result._set(new_values, new_pos, tuple(chunks), size, holes)
        return result


class _Keys(KeysView[K]):
    __slots__ = ("_map",)

    def __init__(self, mapping: PersistentMap[K, Any]) -> None:
        super().__init__(mapping)
        self._map = mapping

    def __iter__(self) -> Iterator[K]:
        return iter(self._map)


class _Values(ValuesView[V]):
    __slots__ = ("_map",)

    def __init__(self, mapping: PersistentMap[Any, V]) -> None:
        super().__init__(mapping)
        self._map = mapping

    def __iter__(self) -> Iterator[V]:
        return map(itemgetter(1), self._map._pairs())


class _Items(ItemsView[K, V]):
    __slots__ = ("_map",)

    def __init__(self, mapping: PersistentMap[K, V]) -> None:
        super().__init__(mapping)
        self._map = mapping

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._map._pairs()


def persistent(mapping: Mapping[K, V]) -> PersistentMap[K, V]:
    """``mapping`` as a :class:`PersistentMap` (itself when it is one: no copy)."""
    return mapping if isinstance(mapping, PersistentMap) else PersistentMap(mapping)
