"""bench.store_save_pacing (session 18's ``--store-nice``): the SQLite thread runs at the nice asked for
(and at the process's without one), and each round reports the ticker thread's run-queue time beside its
lateness (a tiny image; nothing timed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench import store_save_pacing
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def watch_store_nice(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The store threads' nice at each save's start."""
    seen: list[int] = []
    save = SqliteImageStore.save

    async def watched(self: SqliteImageStore, image: MetadataImage) -> None:
        seen.extend(os.getpriority(os.PRIO_PROCESS, tid) for tid in store_save_pacing._store_thread_ids())
        await save(self, image)

    monkeypatch.setattr(SqliteImageStore, "save", watched)
    return seen


async def test_the_store_thread_runs_at_the_nice_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = watch_store_nice(monkeypatch)
    nicer = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)  # nicer than the process: no privilege needed
    rows = await store_save_pacing.run(1, 20, "chunks", 1, tmp_path, store_nice=nicer)
    assert seen and set(seen) == {nicer}
    assert rows[0]["store_nice"] == nicer
    assert rows[0]["thread_runqueue_ms"] >= 0.0


async def test_without_a_nice_the_store_thread_keeps_the_process_nice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = watch_store_nice(monkeypatch)
    rows = await store_save_pacing.run(1, 20, "chunks", 1, tmp_path)
    assert seen and set(seen) == {os.getpriority(os.PRIO_PROCESS, 0)}
    assert rows[0]["store_nice"] == 0
