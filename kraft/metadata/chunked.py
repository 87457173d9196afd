"""A persistent (immutable, structurally shared) sequence in fixed-size chunks.

A big topic's partitions live in one of these (:class:`~kraft.metadata.image.TopicImage`; up to one
chunk they stay a plain tuple, see :func:`compact`): the next image changes a few partitions of a topic
of a million, and a flat tuple would have to be copied whole for that (5-9 ms per slice of a big sliced
topic creation at 1,000,000 partitions, on every controller and broker).  Here the items sit in
immutable tuples of :data:`CHUNK` items, and :meth:`ChunkedSequence.updated` copies only the chunks it
touches plus the index of chunks (one pointer per chunk, ~1,000 at a million items): changing k items
costs O(k + touched chunks x CHUNK + n / CHUNK) and every older version stays valid and unchanged,
sharing all untouched chunks with the new one.

Reads stay close to a tuple's: iteration chains the chunk tuples in C (as fast as a tuple), ``len`` is
a stored count, and an index is two tuple lookups (a Python-level ``__getitem__``, ~0.15 µs more than
a tuple's).  Memory is a tuple's plus one small tuple per chunk (~0.1 % at 1,024 items per chunk).

Invariant: every chunk but the last holds exactly :data:`CHUNK` items and the last holds 1..CHUNK (no
chunk when empty), so an item's chunk is ``index >> SHIFT`` and a too-large index fails in a lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice
from typing import Any, Generic, TypeVar, overload

SHIFT = 10
CHUNK = 1 << SHIFT
"""Items per chunk.  Near the square root of the largest topics (max.partitions defaults to 1,000,000)
balances the two copies of an update: the touched chunk (CHUNK items) and the chunk index (n / CHUNK)."""
_MASK = CHUNK - 1

T = TypeVar("T")


class ChunkedSequence(Sequence[T], Generic[T]):
    """An immutable sequence; :meth:`updated` returns a new version sharing every untouched chunk.

    Equal to another ChunkedSequence or a tuple with equal items (and hashes like that tuple), so it
    replaces a tuple in images and their comparisons.  A slice is a tuple (a copy of that range)."""

    __slots__ = ("_chunks", "_len")

    _chunks: tuple[tuple[T, ...], ...]
    _len: int

    def __init__(self, items: Iterable[T] = ()) -> None:
        flat = items if isinstance(items, tuple) else tuple(items)
        n = len(flat)
        if n <= CHUNK:
            self._chunks = (flat,) if n else ()
        else:
            self._chunks = tuple([flat[start : start + CHUNK] for start in range(0, n, CHUNK)])
        self._len = n

    @classmethod
    def _of(cls, chunks: tuple[tuple[T, ...], ...], length: int) -> ChunkedSequence[T]:
        seq: ChunkedSequence[T] = cls.__new__(cls)
        seq._chunks = chunks
        seq._len = length
        return seq

    @classmethod
    def of_chunks(cls, chunks: tuple[tuple[T, ...], ...], length: int) -> ChunkedSequence[T]:
        """The sequence made of ``chunks`` as they are (no copy): every chunk but the last must hold
        exactly :data:`CHUNK` items and the last 1..CHUNK (the class invariant), ``length`` in all."""
        if chunks and (len(chunks[-1]) + (len(chunks) - 1) * CHUNK != length or not chunks[-1]):
            raise ValueError(f"{len(chunks)} chunks do not hold {length} items")
        if any(len(chunk) != CHUNK for chunk in chunks[:-1]) or (not chunks and length):
            raise ValueError("every chunk but the last must be full")
        return cls._of(chunks, length)

    # ---- reads ----

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        # The hot path (a non-negative int) is two tuple lookups; a too-large index raises IndexError
        # from one of them (every chunk but the last is full).
        try:
            if index >= 0:  # type: ignore[operator]
                return self._chunks[index >> SHIFT][index & _MASK]  # type: ignore[operator]
            index += self._len  # type: ignore[operator]
            if index >= 0:
                return self._chunks[index >> SHIFT][index & _MASK]
        except TypeError:
            if isinstance(index, slice):
                return self._slice(index)
            raise
        raise IndexError("ChunkedSequence index out of range")

    def _slice(self, index: slice) -> tuple[T, ...]:
        start, stop, step = index.indices(self._len)
        if step == 1:
            return tuple(islice(self.iter_from(start), max(0, stop - start)))
        return tuple(self)[index]

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self._chunks)

    def iter_from(self, start: int) -> Iterator[T]:
        """The items from ``start`` (0 <= start) on, without stepping over the ones before it."""
        if start <= 0:
            return chain.from_iterable(self._chunks)
        chunks = self._chunks
        first = start >> SHIFT
        if first >= len(chunks):
            return iter(())
        return chain(
            islice(chunks[first], start & _MASK, None), chain.from_iterable(islice(chunks, first + 1, None))
        )

    def __reversed__(self) -> Iterator[T]:
        return chain.from_iterable(map(reversed, reversed(self._chunks)))

    def __contains__(self, value: object) -> bool:
        return any(value in chunk for chunk in self._chunks)

    def chunks(self) -> tuple[tuple[T, ...], ...]:
        """The chunks themselves: two versions share a chunk (``is``) where neither changed it, so a
        reader comparing versions can skip those :data:`CHUNK` items at once."""
        return self._chunks

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ChunkedSequence):
            if self._len != other._len:
                return False
            # Same length, same chunk boundaries: compare chunk by chunk, shared chunks for free.
            return all(a is b or a == b for a, b in zip(self._chunks, other._chunks, strict=True))
        if isinstance(other, tuple):
            return self._len == len(other) and all(
                chunk == other[i * CHUNK : (i + 1) * CHUNK] for i, chunk in enumerate(self._chunks)
            )
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(tuple(self))  # equal to an equal tuple's, as equality with tuples requires

    def __repr__(self) -> str:
        return f"ChunkedSequence({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChunkedSequence, (tuple(self),))

    # ---- the next version ----

    def updated(self, changes: Mapping[int, T], length: int | None = None) -> ChunkedSequence[T]:
        """A new version with ``changes[i]`` at each position ``i``, ``length`` long (default: long
        enough for every change).  Positions past the current end are appended: every one of
        ``len(self) .. length - 1`` must be in ``changes`` (no holes); there is no shrinking.  ``self``
        is left as it was; the result shares each chunk that no change falls into."""
        old_len = self._len
        if length is None:
            length = max(old_len, max(changes, default=-1) + 1)
        appended = length - old_len
        if appended < 0:
            raise ValueError(f"cannot shrink a sequence of {old_len} to {length}")
        if not changes and not appended:
            return self
        chunks = list(self._chunks)
        # Updates of existing positions: copy each touched chunk once, then write into the copy.
        buffers: dict[int, list[T]] = {}
        updates = len(changes) - appended
        if updates:
            seen = 0
            for i, item in changes.items():
                if i >= old_len:
                    continue
                if i < 0:
                    raise IndexError(f"position {i} out of range")
                c = i >> SHIFT
                buffer = buffers.get(c)
                if buffer is None:
                    buffer = buffers[c] = list(chunks[c])
                buffer[i & _MASK] = item
                seen += 1
            if seen != updates:
                raise IndexError(f"changes past the new length {length} or missing appended positions")
        # Appends, in position order (a replayed slice's partitions usually arrive in order already).
        if appended:
            if not updates and list(changes) == list(range(old_len, length)):
                tail: list[T] = list(changes.values())
            else:
                try:
                    tail = [changes[i] for i in range(old_len, length)]
                except KeyError as missing:
                    raise ValueError(
                        f"appended position {missing} missing (positions must be dense)"
                    ) from None
            last = len(chunks) - 1
            if old_len & _MASK:  # the last chunk has room: fill it first
                buffer = buffers.get(last)
                if buffer is None:
                    buffer = buffers[last] = list(chunks[last])
                room = CHUNK - len(buffer)
                buffer.extend(tail[:room])
                tail = tail[room:]
            for c, buffer in buffers.items():
                chunks[c] = tuple(buffer)
            chunks.extend(tuple(tail[start : start + CHUNK]) for start in range(0, len(tail), CHUNK))
        else:
            for c, buffer in buffers.items():
                chunks[c] = tuple(buffer)
        return ChunkedSequence._of(tuple(chunks), length)


Compact = tuple[T, ...] | ChunkedSequence[T]
"""A sequence as :func:`compact` keeps it: a plain tuple up to :data:`CHUNK` items (one chunk: an update
copies it whole either way, and a tuple's lookups are C-speed and it needs no index), a
:class:`ChunkedSequence` above."""


def compact(items: Iterable[T]) -> Compact[T]:
    """``items`` as a tuple when they fit in one chunk, else as a ChunkedSequence (shared, not copied,
    when ``items`` already is one of either)."""
    if isinstance(items, ChunkedSequence):
        if items._len > CHUNK:
            return items
        return items._chunks[0] if items._chunks else ()
    flat = items if isinstance(items, tuple) else tuple(items)
    return ChunkedSequence(flat) if len(flat) > CHUNK else flat


def with_changes(seq: Compact[T], changes: Mapping[int, T], length: int | None = None) -> Compact[T]:
    """:meth:`ChunkedSequence.updated` for a compact sequence, the result compact too: a tuple grows
    into a ChunkedSequence when it outgrows one chunk (that one conversion copies it)."""
    if isinstance(seq, ChunkedSequence):
        return seq.updated(changes, length)
    # a tuple that fits one chunk is that chunk (no copy); a longer one (not compact) is chunked first
    base = ChunkedSequence._of((seq,) if seq else (), len(seq)) if len(seq) <= CHUNK else ChunkedSequence(seq)
    return compact(base.updated(changes, length))


def chunks_of(seq: Compact[T]) -> tuple[tuple[T, ...], ...]:
    """The chunks of a compact sequence (a tuple is its own only chunk): two versions' chunks at the
    same position are the same object where no change fell into them."""
    if isinstance(seq, ChunkedSequence):
        return seq._chunks
    return (seq,) if seq else ()
