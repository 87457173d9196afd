"""A controller's image store is a cache of its snapshot + log (issue #14): a store edited by hand or
ahead of the log is discarded at start (one line) and the image rebuilt; the controller still leads."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest

from kraft.clock import SystemClock
from kraft.cluster.quorum import QuorumFactory, wait_until
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import wrap
from kraft.metadata.store import IMAGE_STORE_FILE, SqliteImageStore
from kraft.v1 import metadata_pb2 as mpb

pytestmark = pytest.mark.integration


def _evil_image() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(wrap(mpb.TopicRecord(name="EVIL-orders", topic_id="topic-evil")), 999_999_999, 1)
    return delta.apply()


async def _save(path: object, image: MetadataImage) -> None:
    store = await SqliteImageStore.open(path, clock=SystemClock())  # type: ignore[arg-type]
    try:
        await store.load()
        await store.save(image)
    finally:
        await store.close()


def test_an_edited_or_ahead_image_store_is_discarded_and_the_controller_still_leads(
    quorum_factory: QuorumFactory,
) -> None:
    quorum = quorum_factory(size=1, test_append=False)
    quorum.start()
    node = quorum.nodes[1]
    quorum.wait_for_leader(timeout_s=30)
    wait_until(lambda: "event=became_active" in node.log_path.read_text(), 30, "the controller to activate")
    assert quorum.terminate(1) == 0
    store = node.metadata_dir / IMAGE_STORE_FILE

    def run_after(damage: str) -> str:
        node.start()
        quorum.wait_for_leader(timeout_s=30)

        def activated() -> str | None:
            run = node.log_path.read_text(errors="replace").split("--- start node 1")[-1]
            return run if "event=became_active" in run else None

        run = wait_until(activated, 30, f"the controller to activate after {damage}")
        assert quorum.terminate(1) == 0
        return run

    # 1. Edited by hand (a topic slipped in): the checksum no longer matches.
    # Closed at once (``with connect()`` only commits): the controller deletes and re-creates this file.
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        db.execute("INSERT INTO topics VALUES ('topic-evil', 'EVIL-orders', 0)")
    run = run_after("an edited store")
    assert "event=image_store_discarded" in run and "checksum mismatch" in run
    assert "topics=0" in run  # image_loaded: nothing of the edited store was used

    # 2. A consistent store whose offset the log never reached (e.g. copied from another node).
    asyncio.run(_save(store, _evil_image()))
    run = run_after("a store ahead of the log")
    assert "event=image_store_discarded" in run and "ahead of the local log" in run
    assert "EVIL" not in run
    # The store now holds what the log says, at an offset the log has.
    stored = SqliteImageStore.stored_offset(store)
    assert stored is not None and stored < 999_999_999
