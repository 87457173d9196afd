"""Heap freezing paced by applied records: keeps full GC collections from walking the whole image.

An image holds one GC-tracked object per partition (a NamedTuple is never untracked), so every full
collection walked the whole image: 100-400 ms pauses, many of them during bulk writes, enough to delay
heartbeats past their deadline and Raft fetches past ``fetch.timeout``.  After every
``FREEZE_AFTER_RECORDS`` applied records (at most every ``FREEZE_MIN_INTERVAL_MS``) the heap is frozen
after collecting the young generations only (bounded by what they hold, never by the heap; issue #17).
Partitions a CreateTopics prepares ahead of its appends count as applied (:meth:`HeapFreezer.built`).
Between two freezes the automatic full collections walk what was made since the first: with the interval
at 2 s a bulk creation's leader ran 13 of them, 508 ms in all, one 94 ms inside a single preparing event;
at 250 ms, 9 for 269 ms and none over 30 ms inside an event (``bench.controller`` ``gc_node_N``, session
11).  A thaw still falls due every ``THAW_EVERY_FREEZES`` freezes, so at least 600,000 records apart.

A frozen object that later ends up in a garbage cycle (a finished task holding its exception) is only
reclaimed once thawed, and a thaw costs one full collection over the whole heap, the stretch all this
avoids.  So every ``THAW_EVERY_FREEZES``-th freeze makes a thaw *due*, and :meth:`HeapFreezer.run`
carries it out — ``gc.unfreeze()`` and one ``gc.collect()`` — at the first check that finds no more than
``IDLE_RECORDS`` records applied since the previous one (no bulk write in flight); only a thaw still
due ``THAW_OVERDUE_FREEZES`` freezes later is done at a freeze regardless (the frozen garbage stays
bounded on a controller that is never idle).

A snapshot load (:meth:`HeapFreezer.load`) freezes at its start, at each of its pauses and at its end,
collecting nothing, with the automatic collections paused meanwhile: never a full collection over the
fresh image, and no young collection walking it either.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from kraft.clock import Clock
from kraft.metadata.timers import Timers

FREEZE_AFTER_RECORDS = 20_000
FREEZE_MIN_INTERVAL_MS = 250
THAW_EVERY_FREEZES = 30
IDLE_CHECK_MS = 1_000
"""How often :meth:`HeapFreezer.run` looks whether a due thaw can run."""
IDLE_RECORDS = 100
"""Records applied since the previous check up to which the controller counts as idle (idle NoOps and
the odd broker change, not a bulk write)."""
THAW_OVERDUE_FREEZES = 30
"""Freezes after a thaw fell due at which it runs at the freeze, idle or not."""


def freeze_heap() -> None:
    """A full collection, then freeze: no cyclic garbage is frozen, but the collection walks every
    unfrozen object.  Only where that is affordable: benchmarks, a node's start-up."""
    gc.collect()
    gc.freeze()


def freeze_young() -> None:
    """Collect the young generations only, then freeze: bounded by what they hold (a few thousand
    objects, ~1 ms), never by the heap.  Cyclic garbage that already reached the old generation is
    frozen with the rest (kept until the next thaw); measured after a snapshot load
    (``bench/snapshot_reap.py``, a full collection after thawing): none."""
    gc.collect(1)
    gc.freeze()


def thaw_heap() -> None:
    """Give frozen objects back to the collector and collect everything once: an object frozen while
    alive that later ends up in a reference cycle is only reclaimed so.  One full walk of the heap
    (100-600 ms at a million partitions): only at an idle moment, or when long overdue."""
    gc.unfreeze()
    gc.collect()


class HeapFreezer:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._applied_since_freeze = 0
        self._applied_since_check = 0
        self._last_freeze_ms: int | None = None
        self._freezes = 0
        self.thaw_due_since: int | None = None
        """The freeze count when a thaw fell due (None: none is)."""
        self.thaws = 0

    @contextmanager
    def load(self) -> Iterator[None]:
        """Around a snapshot load: the heap frozen at its start, the collector's automatic collections
        paused until it ends (however it ends).

        Raft hands the snapshot's records over in one fresh list (a million references at a million
        partitions): the load's first young collection would walk it and its first middle one again
        (~13-23 ms each per million records, both in the load's first stretch; a list is never
        untracked).  Frozen (``gc.freeze()``: O(1)) it is never walked.  And the automatic young
        collections during the load (every 700 allocations) walk what the load just built, whose
        references reach all over a heap of gigabytes: in cache misses, 4-10 ms a collection on a busy
        host, set off anywhere in a stretch.  Paused, nothing walks the load's objects: each pause
        freezes them (:meth:`loading`).  Reference counting still frees everything that is not a
        cycle; a cycle that becomes garbage during the load — another task's — is frozen with the rest
        and reclaimed at the next thaw (the benchmark's full collection after thawing finds none)."""
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            yield
        finally:
            if enabled:
                gc.enable()

    def loading(self) -> None:
        """A snapshot load pauses between its steps: freeze what it built so far (``gc.freeze()`` moves
        the generations' lists, O(1)), so no collection walks it once the load ends (a full one would
        walk it all: tens to hundreds of ms at a million partitions; a young one, its references)."""
        gc.freeze()

    def loaded(self) -> None:
        """A snapshot load published its image: freeze its last step's objects, collecting nothing (a
        full collection walks every unfrozen object — a freshly loaded image of a million partitions,
        130-640 ms in one go).  Counts as the periodic freeze."""
        gc.freeze()
        self._applied_since_freeze = 0
        self._last_freeze_ms = self._clock.monotonic_ms()

    def built(self, partitions: int) -> None:
        """A CreateTopics' preparing events built records and placements for this many partitions ahead
        of any append (a 100-topic request prepares 100,000 before the first is written): counted as
        applied, so the automatic full collections do not walk them all."""
        self.applied(partitions)

    def applied(self, records: int) -> None:
        self._applied_since_freeze += records
        self._applied_since_check += records
        if self._applied_since_freeze < FREEZE_AFTER_RECORDS:
            return
        now_ms = self._clock.monotonic_ms()
        if self._last_freeze_ms is not None and now_ms - self._last_freeze_ms < FREEZE_MIN_INTERVAL_MS:
            return
        self._applied_since_freeze = 0
        self._last_freeze_ms = now_ms
        self._freezes += 1
        if self._freezes % THAW_EVERY_FREEZES == 0 and self.thaw_due_since is None:
            self.thaw_due_since = self._freezes
        if self.thaw_due_since is not None and self._freezes - self.thaw_due_since >= THAW_OVERDUE_FREEZES:
            self._thaw()  # never idle for that long: bounded frozen garbage wins over the stretch
            return
        freeze_young()

    def idle_check(self) -> None:
        """One look of :meth:`run`: a due thaw runs if the controller was idle since the last look."""
        idle = self._applied_since_check <= IDLE_RECORDS
        self._applied_since_check = 0
        if idle and self.thaw_due_since is not None:
            self._thaw()

    def _thaw(self) -> None:
        self.thaw_due_since = None
        self.thaws += 1
        thaw_heap()

    async def run(self, timers: Timers) -> None:
        """Look every :data:`IDLE_CHECK_MS` whether a due thaw can run (:meth:`idle_check`)."""
        while True:
            await timers.sleep_ms(IDLE_CHECK_MS)
            self.idle_check()
