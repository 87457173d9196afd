"""Heap freezing paced by applied records: keeps full GC collections from walking the whole image.

An image holds one GC-tracked object per partition (a NamedTuple is never untracked), so every full
collection walked the whole image: 100-400 ms pauses, many of them during bulk writes, enough to delay
heartbeats past their deadline and Raft fetches past ``fetch.timeout``.  After every
``FREEZE_AFTER_RECORDS`` applied records (at most every ``FREEZE_MIN_INTERVAL_MS``) the heap is frozen;
every ``THAW_EVERY_FREEZES``-th time it is thawed instead.  A snapshot load freezes at each of its
pauses and at its end after collecting the young generations only (:meth:`HeapFreezer.loading`,
:meth:`HeapFreezer.loaded`): never a full collection over the fresh image (issue #17).
"""

from __future__ import annotations

import gc

from kraft.clock import Clock

FREEZE_AFTER_RECORDS = 20_000
FREEZE_MIN_INTERVAL_MS = 2_000
THAW_EVERY_FREEZES = 30


def freeze_heap() -> None:
    """Move everything alive into the GC's permanent generation.

    Frozen objects are still freed by reference counting (images hold no cycles); collections then walk
    only what is newer.  A full collection first, so no cyclic garbage is frozen; it walks only objects
    created since the previous freeze.
    """
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
    """Give frozen objects back to the collector: an object frozen while alive that later ends up in a
    reference cycle (a finished task holding its exception) is only reclaimed once thawed."""
    gc.unfreeze()


class HeapFreezer:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._applied_since_freeze = 0
        self._last_freeze_ms: int | None = None
        self._freezes = 0

    def load_starting(self) -> None:
        """A snapshot load begins: freeze at once, collecting nothing.  Raft hands the snapshot's records
        over in one fresh list (a million references at a million partitions): the first young
        collection during the load would walk it, and the first middle one again (each ~13 ms per
        million records, both in the load's first stretch), since a list is never untracked.  Frozen it
        is never walked (``gc.freeze()`` moves the generations' lists: O(1)); what else the young
        generations hold now — a few hundred objects — is frozen with it (cyclic garbage among them is
        kept until the next thaw; the benchmark's full collection after thawing finds none)."""
        gc.freeze()

    def loading(self) -> None:
        """A snapshot load pauses between its steps: freeze what it built so far (``gc.freeze()`` moves
        the generations' lists, O(1)), so the automatic full collections the heap's growth sets off
        during the load walk only what is newer, not the image built so far (each would walk it all:
        tens to hundreds of ms at a million partitions).  The young generations are collected first
        (bounded, ~1 ms) so the short-lived cycles of whatever else runs meanwhile are not frozen."""
        freeze_young()

    def loaded(self) -> None:
        """A snapshot load published its image: freeze it without a full collection (``gc.collect()``
        walks every unfrozen object — a freshly loaded image of a million partitions, 130-640 ms in one
        go).  Counts as the periodic freeze."""
        freeze_young()
        self._applied_since_freeze = 0
        self._last_freeze_ms = self._clock.monotonic_ms()

    def applied(self, records: int) -> None:
        self._applied_since_freeze += records
        if self._applied_since_freeze < FREEZE_AFTER_RECORDS:
            return
        now_ms = self._clock.monotonic_ms()
        if self._last_freeze_ms is not None and now_ms - self._last_freeze_ms < FREEZE_MIN_INTERVAL_MS:
            return
        self._applied_since_freeze = 0
        self._last_freeze_ms = now_ms
        self._freezes += 1
        if self._freezes % THAW_EVERY_FREEZES == 0:
            thaw_heap()  # bounded leak of frozen cycles; the next full collection walks everything once
        else:
            freeze_heap()
