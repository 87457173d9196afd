"""bench.cold_steps measures what its docs say: ``create`` is a real CreateTopics (a topic more in the
logic's image), ``validate`` a dry run of the same (nothing written), and every measured step comes right
after its condition's preparation (a sleep, or the eviction walk), so ``after_*`` is never a warm step.
No timing is asserted: the bench's numbers are read by people, not checked here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.cold_steps import CONDITIONS, STEPS, Evictor, Steps, measure, summary


def test_create_writes_a_topic_and_validate_writes_nothing(tmp_path: Path) -> None:
    steps = Steps(5, tmp_path / "log")
    try:
        names = steps.bench.logic.image.topic_ids_by_name
        assert len(names) == 5
        assert steps.timed("validate") >= 0
        assert len(steps.bench.logic.image.topic_ids_by_name) == 5  # a dry run: the image unchanged
        offset = steps.bench.offset
        assert steps.timed("create") >= 0
        assert len(steps.bench.logic.image.topic_ids_by_name) == 6  # a real create: one topic more
        assert steps.bench.offset > offset  # its records took offsets
        assert steps.timed("log_read") >= 0 and steps.timed("spin") >= 0
    finally:
        steps.close()


def test_every_step_is_measured_right_after_its_conditions_preparation(tmp_path: Path) -> None:
    steps = Steps(2, tmp_path / "log")
    events: list[str] = []
    timed = steps.timed

    def record_step(step: str) -> int:
        events.append(step)
        return timed(step)

    steps.timed = record_step  # type: ignore[method-assign]

    def preparation(condition: str) -> Callable[[], None]:
        return lambda: events.append(f"prepare:{condition}")

    before = {condition: preparation(condition) for condition in CONDITIONS}
    try:
        samples = measure(steps, rounds=2, per_round=3, before=before)
    finally:
        steps.close()
    for condition in CONDITIONS:
        for step in STEPS:
            assert len(samples[condition][step]) == 2 * 3
    # each measured step directly follows a preparation (never two steps back to back)
    for index, event in enumerate(events):
        if not event.startswith("prepare:"):
            assert index > 0 and events[index - 1].startswith("prepare:")
    # the conditions alternate: forward in the first round, backward in the second
    prepared = [e.removeprefix("prepare:") for e in events if e.startswith("prepare:")]
    per_condition = 3 * len(STEPS)
    firsts = prepared[::per_condition]
    assert firsts == [*CONDITIONS, *reversed(CONDITIONS)]
    result = summary(samples)
    assert set(result["p50_us"]) == set(CONDITIONS)
    assert set(result["ratio_to_warm"]) == set(CONDITIONS) - {"warm"}


def test_the_evictor_walks_its_memory() -> None:
    evict = Evictor(1, keys=1_000)
    assert evict() == sum(range(1_000))
