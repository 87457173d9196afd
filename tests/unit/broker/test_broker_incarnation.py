"""The incarnation file's provenance chain (kraft.broker.incarnation): what each process inherits from
the ones before it on the same log dirs, and what it forgets once the controller accepted it."""

from __future__ import annotations

import uuid
from pathlib import Path

from kraft.broker.incarnation import (
    INCARNATION_FILE,
    MAX_PREDECESSORS,
    accept_incarnation,
    read_incarnations,
    take_over_incarnation,
)


def _ids(n: int) -> list[str]:
    return [str(uuid.UUID(int=i + 1)) for i in range(n)]


def test_the_chain_grows_across_crashes_before_registration_and_resets_once_accepted(tmp_path: Path) -> None:
    i1, i2, i3, i4 = _ids(4)
    assert take_over_incarnation(tmp_path, i1) == ()
    accept_incarnation(tmp_path, i1)  # the controller holds i1
    assert take_over_incarnation(tmp_path, i2) == (i1,)
    # i2 crashed before its registration reached the controller: i3 inherits i1 too
    assert take_over_incarnation(tmp_path, i3) == (i2, i1)
    assert read_incarnations(tmp_path) == (i3, i2, i1)
    accept_incarnation(tmp_path, i3)
    assert (tmp_path / INCARNATION_FILE).read_text(encoding="ascii") == f"{i3}\n"
    assert take_over_incarnation(tmp_path, i4) == (i3,)


def test_a_missing_or_damaged_file_gives_no_predecessors(tmp_path: Path) -> None:
    i1, i2, i3 = _ids(3)
    assert read_incarnations(tmp_path / "absent") == ()
    take_over_incarnation(tmp_path, i1)
    take_over_incarnation(tmp_path, i2)
    path = tmp_path / INCARNATION_FILE
    # one bad line spoils the whole chain: no proof, so the session rule (and an unclean re-registration)
    path.write_text(f"{i2}\nnot-a-uuid\n", encoding="ascii")
    assert take_over_incarnation(tmp_path, i3) == ()
    assert path.read_text(encoding="ascii") == f"{i3}\n"
    path.write_bytes(b"\xff\xfe")
    assert read_incarnations(tmp_path) == ()


def test_the_chain_is_bounded_dropping_the_oldest(tmp_path: Path) -> None:
    ids = _ids(MAX_PREDECESSORS + 5)
    for i, incarnation in enumerate(ids):
        predecessors = take_over_incarnation(tmp_path, incarnation)
        assert predecessors == tuple(reversed(ids[:i]))[:MAX_PREDECESSORS]
    assert len(read_incarnations(tmp_path)) == MAX_PREDECESSORS
    lines = (tmp_path / INCARNATION_FILE).read_text(encoding="ascii").split()
    assert lines == list(reversed(ids))[: MAX_PREDECESSORS + 1]


def test_a_single_id_file_of_an_older_version_is_read(tmp_path: Path) -> None:
    [old] = _ids(1)
    (tmp_path / INCARNATION_FILE).write_text(f"{old}\n", encoding="ascii")
    assert take_over_incarnation(tmp_path, str(uuid.uuid4())) == (old,)
