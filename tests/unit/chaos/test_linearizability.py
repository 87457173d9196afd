"""The WGL checker on known linearizable and non-linearizable histories."""

from __future__ import annotations

import random

import pytest
from chaos_histories import op

from chaos.checkers import RegisterModel, Status, TopicModel, check_key, check_linearizable
from chaos.history import EventType, Operation

INFO = EventType.INFO
FAIL = EventType.FAIL
REGISTER = RegisterModel()
TOPIC = TopicModel()


def test_sequential_register_history_is_linearizable() -> None:
    history = [
        op("write", 0, 1, value=1),
        op("read", 2, 3, result=1),
        op("write", 4, 5, value=2),
        op("read", 6, 7, result=2),
    ]
    result = check_key(history, REGISTER)
    assert result.linearizable is True
    assert result.linearization == tuple(o.op_id for o in history)


def test_read_concurrent_with_a_write_may_see_the_old_value() -> None:
    history = [op("write", 0, 10, value=1), op("read", 1, 5, result=None), op("read", 2, 6, result=1)]
    assert check_key(history, REGISTER).linearizable is True


def test_stale_read_after_an_acknowledged_write_is_not_linearizable() -> None:
    stale = op("read", 2, 3, result=None)
    result = check_key([op("write", 0, 1, value=1), stale], REGISTER)
    assert result.linearizable is False
    assert stale in result.stuck


def test_value_cannot_flip_back_after_both_concurrent_writes_completed() -> None:
    history = [
        op("write", 0, 10, value=1, process=1),
        op("write", 0, 10, value=2, process=2),
        op("read", 11, 12, result=1),
        op("read", 13, 14, result=2),
    ]
    assert check_key(history, REGISTER).linearizable is False


def test_concurrent_writes_allow_either_order() -> None:
    history = [
        op("write", 0, 10, value=1, process=1),
        op("write", 0, 10, value=2, process=2),
        op("read", 11, 12, result=1),
        op("read", 13, 14, result=1),
    ]
    assert check_key(history, REGISTER).linearizable is True


def test_info_write_may_take_effect_late_or_never() -> None:
    late = [op("write", 0, None, value=1), op("read", 1, 2, result=None), op("read", 30, 31, result=1)]
    assert check_key(late, REGISTER).linearizable is True
    never = [op("write", 0, None, value=1), op("read", 50, 51, result=None)]
    assert check_key(never, REGISTER).linearizable is True


def test_info_write_cannot_be_undone() -> None:
    history = [op("write", 0, None, value=1), op("read", 5, 6, result=1), op("read", 7, 8, result=None)]
    assert check_key(history, REGISTER).linearizable is False


def test_failed_write_is_ignored_and_cas_must_match() -> None:
    ok = [
        op("write", 0, 1, value=0),
        op("write", 2, 3, value=9, outcome=FAIL),
        op("cas", 4, 5, value=[0, 1]),
        op("read", 6, 7, result=1),
    ]
    assert check_key(ok, REGISTER).linearizable is True
    double_cas = [op("write", 0, 1, value=0), op("cas", 2, 3, value=[0, 1]), op("cas", 4, 5, value=[0, 2])]
    assert check_key(double_cas, REGISTER).linearizable is False


def test_two_concurrent_creates_cannot_both_succeed() -> None:
    history = [
        op("create", 0, 10, result="created", process=1),
        op("create", 1, 9, result="created", process=2),
    ]
    result = check_key(history, TOPIC)
    assert result.linearizable is False
    assert len(result.stuck) == 1


def test_topic_create_exists_and_delete_outcomes() -> None:
    history = [
        op("create", 0, 10, result="created", process=1),
        op("create", 1, 11, result="exists", process=2),
        op("read", 2, 3, result=False, process=3),  # before the create took effect
        op("delete", 12, 13, result="deleted"),
        op("delete", 14, 15, result="not_found"),
        op("read", 16, 17, result=False),
    ]
    assert check_key(history, TOPIC).linearizable is True


def test_topic_visible_after_acknowledged_delete_is_not_linearizable() -> None:
    history = [
        op("create", 0, 1, result="created"),
        op("delete", 2, 3, result="deleted"),
        op("read", 4, 5, result=True),
    ]
    assert check_key(history, TOPIC).linearizable is False


def test_info_create_explains_a_later_exists() -> None:
    history = [
        op("create", 0, None, process=1),
        op("create", 5, 6, result="exists", process=2),
        op("read", 7, 8, result=True),
    ]
    assert check_key(history, TOPIC).linearizable is True


def test_verdict_is_per_key_and_names_the_offenders() -> None:
    good = [op("create", 0, 1, key="a", result="created"), op("read", 2, 3, key="a", result=True)]
    bad_read = op("read", 2, 3, key="b", result=False)
    bad = [op("create", 0, 1, key="b", result="created"), bad_read]
    verdict = check_linearizable([*good, *bad], TOPIC)
    assert verdict.status is Status.FAIL
    assert verdict.details["non_linearizable_keys"] == ["b"]
    assert any(bad_read.describe() in line for line in verdict.offending)
    assert check_linearizable(good, TOPIC).status is Status.PASS


def test_exhausted_budget_is_unknown_not_pass() -> None:
    history = [op("write", 0, None, value=i, process=i) for i in range(12)]
    history.append(op("read", 100, 101, result=-1))
    verdict = check_linearizable(history, REGISTER, max_states_per_key=50)
    assert verdict.status is Status.UNKNOWN


def _random_register_history(rng: random.Random, processes: int, ops_per_process: int) -> list[Operation]:
    """Simulate a real linearizable register: each op takes effect at a random point of its interval."""
    events: list[tuple[float, int, Operation]] = []
    value: int | None = None
    pending: list[tuple[float, str, int, float, float, bool]] = []
    for process in range(processes):
        clock = rng.uniform(0, 5)
        for _ in range(ops_per_process):
            start = clock + rng.uniform(0, 3)
            end = start + rng.uniform(0.5, 6)
            is_write = rng.random() < 0.5
            pending.append(
                (
                    rng.uniform(start, end),
                    "write" if is_write else "read",
                    process,
                    start,
                    end,
                    rng.random() < 0.1,
                )
            )
            clock = end
    pending.sort()
    for point, f, process, start, end, crashed in pending:
        written = rng.randint(0, 3)
        if f == "write":
            value = written
            o = op(
                "write",
                int(start * 1000),
                None if crashed else int(end * 1000),
                value=written,
                process=process,
            )
        else:
            o = op("read", int(start * 1000), int(end * 1000), result=value, process=process)
        events.append((point, process, o))
    return [o for _, _, o in events]


@pytest.mark.parametrize("seed", range(8))
def test_simulated_linearizable_histories_pass(seed: int) -> None:
    history = _random_register_history(random.Random(seed), processes=4, ops_per_process=12)
    assert check_key(history, REGISTER).linearizable is True


@pytest.mark.parametrize("seed", range(4))
def test_a_read_of_a_never_written_value_fails(seed: int) -> None:
    history = _random_register_history(random.Random(seed), processes=4, ops_per_process=10)
    reads = [i for i, o in enumerate(history) if o.f == "read"]
    corrupt = history[reads[len(reads) // 2]]
    history[reads[len(reads) // 2]] = op("read", corrupt.invoke_ns, corrupt.complete_ns, result=77)
    assert check_key(history, REGISTER).linearizable is False


def test_unchecked_rejections_and_reads_do_not_constrain_the_topic_model() -> None:
    stale = [
        op("create", 0, 1, result="created"),
        op("delete", 2, 3, result="deleted"),
        op("create", 4, 5, result="exists"),  # a deposed leader answering from its stale image
        op("read", 6, 7, result=True),
    ]
    assert check_key(stale, TopicModel()).linearizable is False
    assert check_key(stale, TopicModel(check_rejections=False, check_reads=False)).linearizable is True
    double = [op("create", 0, 1, result="created"), op("create", 2, 3, result="created")]
    assert check_key(double, TopicModel(check_rejections=False, check_reads=False)).linearizable is False


def test_many_equivalent_info_operations_stay_cheap() -> None:
    history = [op("create", 0, 1, result="created")]
    history += [op("delete", 10 + i, None, process=100 + i) for i in range(40)]
    history += [op("create", 10 + i, None, process=200 + i) for i in range(40)]
    history.append(op("delete", 500, 501, result="deleted", process=1))
    result = check_key(history, TopicModel())
    assert result.linearizable is True
    assert result.states_explored < 5_000
    impossible = [
        *history,
        op("create", 600, 601, result="created", process=2),
        op("create", 700, 701, result="created", process=3),
    ]
    verdict = check_key(impossible, TopicModel())
    # Two sequential successful creates need a delete in between: one of the 40 info deletes may be it.
    assert verdict.linearizable is True
    strict = [op("create", 0, 1, result="created"), op("create", 2, 3, result="created")]
    strict += [op("create", 10 + i, None, process=300 + i) for i in range(30)]
    assert check_key(strict, TopicModel()).linearizable is False
