"""The partitions an image assigns to a broker, listed in bounded steps (issue #17): the same entries in
the same order as the one-go walk, a pause after every ``ASSIGNMENT_STEP`` partitions looked at however
they are spread over topics, and the publisher's start-up / snapshot paths yielding between steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from broker_fakes import MemoryImageStore, MemoryLogOpener
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_fakes import CostClock, LoopTurns

from kraft.broker.image_adapter import (
    ASSIGNMENT_STEP,
    _assignment,
    local_assignments,
    local_assignments_in_steps,
)
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.broker.types import PartitionAssignment, TopicPartition
from kraft.clock import DEFAULT_WORK_UNIT_MS
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage

ME = 1
_REPLICAS = [(1, 2, 3), (2, 3, 4), (4, 1), (2,), (1,)]


def _image(topics: list[list[int]]) -> MetadataImage:
    """Topic i has the partitions whose replica lists are ``_REPLICAS[k]`` for each k in ``topics[i]``."""
    by_id: dict[str, TopicImage] = {}
    for i, kinds in enumerate(topics):
        registrations = tuple(
            PartitionRegistration(_REPLICAS[k], _REPLICAS[k], _REPLICAS[k][0], i, 0) for k in kinds
        )
        by_id[f"id-{i}"] = TopicImage(f"topic-{i}", f"id-{i}", registrations)
    return replace(
        MetadataImage.empty(),
        offset=5,
        topics_by_id=by_id,
        topic_ids_by_name={t.name: t.topic_id for t in by_id.values()},
    )


def _one_go(image: MetadataImage, broker_id: int) -> dict[TopicPartition, PartitionAssignment]:
    """The walk as it was before it was stepped (main at d4fc0c7)."""
    hosted: dict[TopicPartition, PartitionAssignment] = {}
    for topic in image.topics_by_id.values():
        for partition_id, registration in enumerate(topic.partitions):
            if broker_id in registration.replicas:
                hosted[TopicPartition(topic.name, partition_id)] = _assignment(topic.topic_id, registration)
    return hosted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.integers(0, len(_REPLICAS) - 1), max_size=8),
            st.builds(lambda n, k: [k] * n, st.integers(0, 700), st.integers(0, len(_REPLICAS) - 1)),
        ),
        max_size=12,
    )
)
def test_the_stepped_walk_lists_what_one_go_did_pausing_after_every_step_of_partitions(
    topics: list[list[int]],
) -> None:
    image = _image(topics)
    for broker_id in (1, 2, 4, 9):
        hosted: dict[TopicPartition, PartitionAssignment] = {}
        pauses = sum(1 for _ in local_assignments_in_steps(image, broker_id, hosted))
        expected = _one_go(image, broker_id)
        assert list(hosted.items()) == list(expected.items())
        assert list(local_assignments(image, broker_id).items()) == list(expected.items())
        assert pauses == sum(len(kinds) for kinds in topics) // ASSIGNMENT_STEP


async def test_the_publisher_lists_a_big_image_s_assignments_in_bounded_turns(tmp_path: Path) -> None:
    image = _image([[0] * 3000, [1] * 500, [4] * 10])  # 3,010 hosted here, 500 not
    clock = CostClock()  # every clock read costs 1 ms: the budget runs out every few steps
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener(), clock=clock)
    publisher = MetadataPublisher(
        ME, manager, MemoryImageStore(), "PLAINTEXT", lambda view: None, clock=clock
    )
    loop = LoopTurns(clock)
    hosted = await loop.during(publisher._local_assignments(image))
    assert list(hosted.items()) == list(_one_go(image, ME).items())
    assert loop.turns >= 3510 // ASSIGNMENT_STEP // DEFAULT_WORK_UNIT_MS
    assert max(loop.stretches) <= DEFAULT_WORK_UNIT_MS + 2
