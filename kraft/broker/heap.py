"""The broker's long-lived replication states kept out of the cyclic GC's full collections (issue #17).

A broker hosting 100,000 partitions holds ~1.2 M GC-tracked objects (image, partitions, logs, leader and
follower states); one full collection walks all of them: ~210 ms of one stretch of the event loop
(``bench.broker_timers`` set-up, load 3.9).  An image that changes many hosted partitions at once — the
first image after start-up, a bulk creation — creates hundreds of thousands of tracked objects in one
go, and the collector's own rule (a full collection once the objects that survived since the last one
exceed a quarter of the old generation) ran one to three full collections inside it: 320-445 ms of the
first image's 1.2-1.8 s.

:func:`big_change` runs such a change with the collector paused (reference counting still frees
everything that is not a cycle) and then moves everything alive into the permanent generation
(``gc.freeze``, O(1)): the states just made are not walked again by later collections.  No full
collection runs first (at 1.2 M objects that is itself the 210 ms stretch; the controllers' periodic
freeze collects only the young generations for the same reason), so a cycle that was garbage at that
moment stays frozen: every :data:`THAW_EVERY_FREEZES`-th call thaws instead (as
:mod:`kraft.metadata.heap_freezer` does), and the next full collection walks the heap once and frees them.

:func:`settle` freezes what is alive after collecting the young generations only (no full collection: a
fresh image of 100,000 partitions would be one long walk), where a load grows the heap by a whole image:
between the chunks of a snapshot download, after the snapshot's image is loaded, after the start-up open
(as the controllers' ``kraft.metadata.heap_freezer.freeze_young`` does for their snapshot loads).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

BIG_CHANGE = 4096
"""Partitions an image must change here for :func:`big_change` to pause and freeze (below: a few ms of
new objects, left to the collector as before)."""

THAW_EVERY_FREEZES = 30
"""Every this many freezes, thaw instead: frozen garbage cycles are bounded."""

_freezes = 0


@contextmanager
def big_change(partitions: int) -> Iterator[None]:
    """Around work that changes ``partitions`` hosted partitions' states at once: for
    :data:`BIG_CHANGE` or more, the collector paused during it and the heap frozen after it."""
    global _freezes
    if partitions < BIG_CHANGE:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _freezes += 1
        if _freezes % THAW_EVERY_FREEZES == 0:
            gc.unfreeze()
        else:
            gc.freeze()
        if enabled:
            gc.enable()


def settle() -> None:
    """Freeze what is alive after collecting the young generations (~1 ms, bounded by what they hold):
    the objects a load just made are not walked again by later full collections, and the collector's
    next full collection is not set off by them (it counts only what is not frozen).  Cyclic garbage
    that already reached the old generation is frozen with the rest, until a thaw (:func:`big_change`)."""
    gc.collect(1)
    gc.freeze()
