"""Heap freezing paced by applied records: keeps full GC collections from walking the whole image.

An image holds one GC-tracked object per partition (a NamedTuple is never untracked), so every full
collection walked the whole image: 100-400 ms pauses, many of them during bulk writes, enough to delay
heartbeats past their deadline and Raft fetches past ``fetch.timeout``.  After every
``FREEZE_AFTER_RECORDS`` applied records (at most every ``FREEZE_MIN_INTERVAL_MS``) the heap is frozen;
every ``THAW_EVERY_FREEZES``-th time it is thawed instead.
"""

from __future__ import annotations

import gc

from kraft.clock import Clock

GC_THRESHOLDS = (50_000, 10, 10)
"""``gc.set_threshold`` of a controller process, chosen by bench/results/gc_thresholds.json (500,000
partitions, a fence/unfence workload of ~190,000 records, the heap frozen as below; same runs, 2-core
host at load 3-4): against the default (700, 10, 10) the time in GC went 1,420 → 241 ms and the workload
10.3 → 8.5-8.8 s; pauses over 10 ms went from 32 (27 gen-1 collections of ~20 ms, 5 full ones) to the
freezer's 4 full collections.  The longest pause stays ~65-70 ms either way: it is the freezer's own
``gc.collect()``.  Gen 1 and 2 keep their default ratios, so full collections still come after 100
young ones (5M net allocations) besides the freezer's."""
FREEZE_AFTER_RECORDS = 20_000
FREEZE_MIN_INTERVAL_MS = 2_000
THAW_EVERY_FREEZES = 30


def tune_gc() -> None:
    """Process-wide: set :data:`GC_THRESHOLDS` (the composition root calls it for a controller node)."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_heap() -> None:
    """Move everything alive into the GC's permanent generation.

    Frozen objects are still freed by reference counting (images hold no cycles); collections then walk
    only what is newer.  A full collection first, so no cyclic garbage is frozen; it walks only objects
    created since the previous freeze.
    """
    gc.collect()
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
