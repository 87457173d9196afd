"""Releasing big object graphs in slices: the reaper.

Why: when the last reference to a big immutable structure goes — the image holding a deleted
100,000-partition topic, a broker's 100,000 local deletes once applied — CPython frees the whole graph
at once, in the deallocator of the one object whose count reached zero: ~5-7 ms of CPU (100,000
partition registrations, their tuples), run by whoever happened to drop the reference (an image swap,
the image store's save, a finished coroutine frame). That is one event-loop stretch above
``controller.max.event.time.ms`` (issue #17), and nothing can yield inside a deallocator.

How: the code that makes such a structure garbage-to-be hands it to :func:`release_later` *before* the
last reference goes. The reaper keeps one reference of its own and checks on its event loop's turns
whether it is the only holder left (``sys.getrefcount``); until then nothing happens (other holders —
older images, the image store's last save, the speculative image — drop theirs whenever they do, and the
object merely survives). Once the reaper is the sole holder it takes the graph apart piece by piece, each
piece freeing at most :data:`CHUNK` objects:

- a list longer than :data:`CHUNK` (the reaper's alone, so nobody sees it change) is shortened in
  place, :data:`CHUNK` items per piece, freeing them (and their own small subgraphs);
- a tuple (or list subclass) longer than :data:`CHUNK` is cut into slices of :data:`CHUNK` (each slice
  holds its items), then dropped — which frees nothing but the container, its items live on in the
  slices — and each slice is dropped in a later piece, freeing its items;
- a dict longer than :data:`CHUNK` (the reaper's alone, so nobody sees it change) is drained with
  ``popitem`` :data:`CHUNK` entries per piece;
- any other object (a ``TopicImage``, a dataclass holding big lists) is replaced by what it refers to
  (``gc.get_referents``) and dropped; an object something else still refers to is just let go — it is
  not garbage, and whoever holds it frees it later.

Pieces run until the turn's budget is spent (:data:`SLICE_MS`, at least one piece), then the reaper
yields with ``call_soon``; while it only waits for other holders it looks every :data:`POLL_S`.
Nothing is ever released early: the reaper only decides *where* a release that would happen anyway is
cut, so it cannot change what a program computes — at worst memory lingers one poll longer.

Many small structures that go together (the small topics of an image a snapshot replaced, the parts of
its topic maps) are handed over in groups (:meth:`Reaper.adopt_groups`): a group waits until it alone
holds its items, then goes in one piece (a :class:`Bundle`, about :data:`CHUNK` objects) or item by item.

Only code on an asyncio event loop uses it (:func:`release_later` without a running loop does nothing:
the structure is then freed the ordinary way). One :class:`Reaper` per loop.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Iterable
from itertools import compress
from typing import Any

from kraft.clock import Clock, Deadline, SystemClock

CHUNK = 512
"""Objects freed by one piece at most (~30-40 µs of deallocation for partition registrations)."""

SLICE_MS = 1
"""A reaper turn's budget: background work, kept well under the 5 ms work unit."""

POLL_S = 0.1
"""How often a reaper that only waits for other holders looks again."""

MIN_ITEMS = 4096
"""Below this many items a structure frees in ~0.2 ms: not worth handing over (callers check)."""


def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


# What _refs sees for an object referred to by exactly one variable of its caller (the caller's
# variable, the parameter, getrefcount's argument): measured, not assumed, so an interpreter that counts
# differently (borrowed references) does not make the reaper free something still in use.
def _one_variable() -> int:
    obj = object()
    return _refs(obj)


_SOLE = _one_variable()


def _most_refs(group: tuple[Any, ...]) -> int:
    return max(map(sys.getrefcount, group))


def _held_only_by(referents: list[Any]) -> list[Any]:
    """Of an object's ``gc.get_referents``, those that it alone (besides that list) refers to."""
    counts = list(map(sys.getrefcount, referents))  # (first: compress would hold each item meanwhile)
    return list(compress(referents, map(_ONLY_IN_REFERENTS.__ge__, counts)))


def _parts_to_take_apart(referents: list[Any]) -> list[Any]:
    """Of an object's referents, what is worth a piece of its own: what the object alone holds, but no
    scalar (a string or number goes with the object that held it; an object holding more than a few
    dozen of them is a container, taken apart by the container rules)."""
    return [part for part in _held_only_by(referents) if not isinstance(part, _SCALARS)]


class _Holder:
    __slots__ = ("a", "b")

    a: object
    b: object


def _only_in_referents() -> int:
    holder = _Holder()
    holder.a, holder.b = object(), "shared"
    shared = holder.b  # (held twice: must not count as held by the holder alone)
    refs = gc.get_referents(holder)
    counts = list(map(sys.getrefcount, refs))  # as _held_only_by counts
    del shared
    return counts[[ref is holder.a for ref in refs].index(True)]


# What sys.getrefcount sees, in _held_only_by, for a referent held by its object alone (measured).
_ONLY_IN_REFERENTS = _only_in_referents()

# What _most_refs sees for items a group tuple alone refers to (measured, as _SOLE).
_IN_GROUP = _most_refs((object(), object()))


GROUPS_HELD_AHEAD = 16
"""Groups still held elsewhere that a turn looks past before it stops looking (one pinned group must
not hold up the others; all of them held — the usual wait for an image's last holder — costs ~16 looks)."""

BIG = 64
"""A container longer than this is taken apart on its own, not freed with the one holding it."""

_LEAVES = (tuple, list, dict, set, frozenset, str, bytes, int, float)
_SCALARS = (str, bytes, int, float, bool, type(None))


def _is_big(obj: object) -> bool:
    return isinstance(obj, tuple | list | dict | set | frozenset) and len(obj) > BIG


def _any_big(items: tuple[Any, ...] | list[Any]) -> bool:
    """Some item of ``items`` is (or holds) a big container — at C speed for the common cases: all
    scalars, or all containers (partition registrations are tuples)."""
    kinds = set(map(type, items))
    if all(issubclass(kind, _SCALARS) for kind in kinds):
        return False
    if all(issubclass(kind, tuple | list | dict | set | frozenset) for kind in kinds):
        return max(map(len, items)) > BIG
    return any(_holds_big(item) for item in items)


def _holds_big(item: object) -> bool:
    """``item`` is a big container, or an object (not a tuple: a registration is one) that holds one."""
    if isinstance(item, _SCALARS) or (isinstance(item, tuple) and len(item) <= BIG):
        return False
    return _is_big(item) or (
        not isinstance(item, _LEAVES) and any(_is_big(part) for part in gc.get_referents(item))
    )


class Bundle(tuple[Any, ...]):
    """A group (:meth:`Reaper.adopt_groups`) of small structures that free at most about
    :data:`CHUNK` objects together: released in one piece, without looking into them."""

    __slots__ = ()


class Reaper:
    """Holds what it was handed and releases each graph in pieces once it is the graph's only holder.

    :meth:`release_some` is the deterministic core (tests drive it directly); :meth:`start_on` runs it on
    an event loop, one budgeted turn per ``call_soon``."""

    def __init__(self, clock: Clock | None = None, slice_ms: int = SLICE_MS, chunk: int = CHUNK) -> None:
        self._clock: Clock = clock or SystemClock()
        self._slice_ms = slice_ms
        self._chunk = chunk
        self._held: list[Any] = []  # handed over, maybe still held elsewhere
        self._held_ids: set[int] = set()  # (ids of live objects we hold: stable while we hold them)
        self._work: list[Any] = []  # ours alone (or pieces of such): to take apart
        self._cutting: tuple[Any, int] | None = None  # (a long tuple/list, next slice start)
        self._groups: list[tuple[Any, ...]] = []  # groups whose items someone else may hold, in order
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._scheduled: asyncio.Handle | asyncio.TimerHandle | None = None
        self.pieces = 0
        """Pieces released so far (for tests and benchmarks)."""

    def adopt_groups(self, groups: Iterable[tuple[Any, ...]], *, first: bool = False) -> None:
        """Keep each group (a tuple of small objects freeing at most ~``chunk`` objects together) until
        the group is the only holder of all its items, then release it as one piece (a :class:`Bundle`)
        or its items one by one.  For many small structures (the small topics of a replaced image): each
        adopted alone would be polled alone.  ``first``: ahead of the groups already waiting (what holds
        their items: a map's parts holding topics)."""
        new = [group for group in groups if group]
        self._groups = [*new, *self._groups] if first else [*self._groups, *new]
        self._schedule(0.0)

    def adopt(self, objects: Iterable[object]) -> None:
        """Keep ``objects`` (each once) until they can be released in pieces."""
        for obj in objects:
            if id(obj) not in self._held_ids:
                self._held_ids.add(id(obj))
                self._held.append(obj)
        self._schedule(0.0)

    @property
    def idle(self) -> bool:
        """Nothing held and nothing left to release."""
        return not (self._held or self._groups or self._work or self._cutting is not None)

    @property
    def waiting(self) -> int:
        """Objects (and groups) handed over that someone else still holds."""
        return len(self._held) + len(self._groups)

    def release_some(self, deadline: Deadline | None = None, max_pieces: int = 1 << 30) -> bool:
        """Move what only the reaper holds to its work, then release pieces until ``deadline`` expired
        (at least one piece) or ``max_pieces`` ran. True when the work is done (objects still held
        elsewhere may remain: :attr:`waiting`)."""
        self._collect_sole()
        self._collect_groups(deadline)
        pieces = 0
        while self._work or self._cutting is not None:
            self._piece()
            pieces += 1
            if pieces >= max_pieces or (deadline is not None and deadline.expired()):
                break
        self.pieces += pieces
        return not self._work and self._cutting is None

    def _collect_sole(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, []
        still: list[Any] = []
        while held:
            obj = held.pop()
            if _refs(obj) <= _SOLE:
                self._held_ids.discard(id(obj))
                self._work.append(obj)
            else:
                still.append(obj)
            del obj
        self._held = still

    def _collect_groups(self, deadline: Deadline | None) -> None:
        """Move the groups whose items only they hold to the work, in order, until ``deadline`` expired
        (at least one looked at; a group costs one reference count per item) or :data:`GROUPS_HELD_AHEAD`
        groups were found still held elsewhere (they stay where they are: the groups behind them
        usually wait for the same holder)."""
        groups = self._groups
        if not groups:
            return
        kept: list[tuple[Any, ...]] = []
        looked = 0
        while looked < len(groups):
            group = groups[looked]
            looked += 1
            if _most_refs(group) <= _IN_GROUP:
                self._work.append(group)
            else:
                kept.append(group)
                if len(kept) >= GROUPS_HELD_AHEAD:
                    break
            if deadline is not None and deadline.expired():
                break
        del group
        if looked:
            self._groups = kept + groups[looked:] if looked < len(groups) else kept

    def _piece(self) -> None:
        """Release one piece: at most ``chunk`` objects freed (plus their small subgraphs)."""
        chunk = self._chunk
        if self._cutting is not None:
            # Slice first, drop later: while the long container lives, dropping a slice frees nothing.
            whole, start = self._cutting
            end = min(start + chunk, len(whole))
            self._work.append(whole[start:end])
            self._cutting = (whole, end) if end < len(whole) else None
            return
        obj = self._work.pop()
        if _refs(obj) > _SOLE:
            return  # someone else holds it: not garbage, theirs to free
        if type(obj) is Bundle:
            return  # small structures that free about a chunk together: dropped as one piece
        if type(obj) is list and len(obj) > chunk:
            # The reaper's alone (as a dict below): shortened in place, freeing a chunk of items, with no
            # slice made.  Slices are young containers whose items the next young collections visit —
            # 2,000 slices of a snapshot's million records, walked by gen-0 collections at a cache miss
            # per item (4-10 ms a collection on a busy host).
            del obj[-chunk:]
            self._work.append(obj)
        elif isinstance(obj, tuple | list) and len(obj) > chunk:
            self._cutting = (obj, 0)
        elif isinstance(obj, dict) and len(obj) > chunk:
            drained = [obj.popitem() for _ in range(chunk)]  # freed when this piece returns
            del drained
            self._work.append(obj)
        elif isinstance(obj, tuple | list) and _any_big(obj):
            self._work.extend(obj)  # a short list of big parts (a chunked sequence): one part each
        elif isinstance(obj, _LEAVES):
            pass  # small, of small items: dropping it frees at most `chunk` items and their few parts
        else:
            # An object with attributes (or a C structure's node): keep the parts it refers to, let the
            # object itself go.  Only what it alone holds (anything else survives it — topics a map's
            # node points at while a group holds them — and would only be looked at and let go), and
            # no scalars (they go with it): a map of 100,000 topics is then ~50,000 pieces, not ~1M.
            self._work.extend(_parts_to_take_apart(gc.get_referents(obj)))

    # ---- on an event loop ----

    def start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)

    def _schedule(self, delay_s: float) -> None:
        loop = None if self._loop is None else self._loop()
        if loop is None or loop.is_closed():
            return
        if self._scheduled is not None and not self._scheduled.cancelled():
            if delay_s > 0 or not isinstance(self._scheduled, asyncio.TimerHandle):
                return  # a turn is due anyway
            self._scheduled.cancel()  # work arrived while waiting: look at once
        if delay_s > 0:
            self._scheduled = loop.call_later(delay_s, self._turn)
        else:
            self._scheduled = loop.call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = None
        done = self.release_some(Deadline(self._clock, self._slice_ms))
        if not done:
            self._schedule(0.0)
        elif self._held or self._groups:
            self._schedule(POLL_S)


_REAPERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Reaper] = weakref.WeakKeyDictionary()


def reaper_of(loop: asyncio.AbstractEventLoop) -> Reaper:
    """The reaper running on ``loop`` (made on first use)."""
    reaper = _REAPERS.get(loop)
    if reaper is None:
        reaper = Reaper()
        reaper.start_on(loop)
        _REAPERS[loop] = reaper
    return reaper


def release_later(objects: Iterable[object]) -> bool:
    """Hand ``objects`` to the running loop's reaper (False, and nothing kept, outside a loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    reaper_of(loop).adopt(objects)
    return True


def release_replaced_topics(replaced: Iterable[Any]) -> None:
    """:func:`release_removed_topics` for every topic of an image that goes as a whole (a snapshot
    replaced it): the small topics too, in groups of about :data:`CHUNK` partitions each — a million
    partitions in 1,000-partition topics, or 100,000 topics of ten, would otherwise all be freed in one
    deallocation where the image's last holder lets go."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    big: list[Any] = []
    groups: list[tuple[Any, ...]] = []
    group: list[Any] = []
    weight = 0
    for topic in replaced:
        count = len(topic.partitions)
        if count >= MIN_ITEMS:
            big.append(topic)
        elif count > BIG:
            groups.append((topic,))  # taken apart on its own (its partitions in slices of CHUNK)
        else:
            group.append(topic)
            weight += count + 1
            if weight >= CHUNK:
                groups.append(Bundle(group))
                group, weight = [], 0
    if group:
        groups.append(Bundle(group))
    reaper = reaper_of(loop)
    if big:
        reaper.adopt(big)
    if groups:
        reaper.adopt_groups(groups)


def release_replaced_maps(maps: Iterable[Any]) -> None:
    """Hand the topic maps of an image that goes as a whole to the reaper, where they hold
    :data:`MIN_ITEMS` or more topics: their slots and nodes are another long deallocation (~40-60 ms
    for an image's two maps at 100,000 topics, the topics themselves held elsewhere).  A map that can
    tell its parts (``parts()``: :class:`kraft.metadata.pmap.PersistentMap`) has each released as one
    piece, ahead of the topic groups its parts hold; the map itself then frees only its top."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    parts = [
        part
        for mapping in maps
        if len(mapping) >= MIN_ITEMS and hasattr(mapping, "parts")
        for part in mapping.parts()
    ]
    if parts:
        reaper_of(loop).adopt_groups((Bundle((part,)) for part in parts), first=True)


def release_removed_topics(removed: Iterable[Any]) -> None:
    """The hook for a delta's ``removed_topics().values()`` once its ``apply()`` built the next image:
    topics of :data:`MIN_ITEMS`+ partitions go to the reaper, so whichever holder of an older image
    drops the last reference, the topic's partitions are freed in slices."""
    big = [topic for topic in removed if len(topic.partitions) >= MIN_ITEMS]
    if big:
        release_later(big)
