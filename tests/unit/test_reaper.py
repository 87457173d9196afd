"""kraft.reaper: what it is handed is released only once nobody else holds it, then in pieces that each
free at most ``CHUNK`` objects, until everything is freed. Deterministic: pieces are counted, the event
loop's turns driven by hand; liveness is read through weak references."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from loop_fakes import CostClock

from kraft.clock import Deadline
from kraft.reaper import MIN_ITEMS, Reaper, reaper_of, release_later, release_removed_topics

CHUNK = 512


class Item:
    """A partition registration's stand-in that can be watched (weakly)."""

    __slots__ = ("__weakref__", "replicas")

    def __init__(self, replicas: tuple[int, ...]) -> None:
        self.replicas = replicas


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: tuple[Item, ...]


def _topic(count: int) -> tuple[Topic, list[weakref.ref[Item]]]:
    shared = (1, 2, 3)  # shared by all, as interned replica lists are
    items = tuple(Item(shared) for _ in range(count))
    return Topic("big", items), [weakref.ref(i) for i in items]


def _alive(refs: list[weakref.ref[Item]]) -> int:
    return sum(1 for r in refs if r() is not None)


def test_nothing_is_released_while_someone_else_holds_it() -> None:
    topic, refs = _topic(3000)
    reaper = Reaper(chunk=CHUNK)
    reaper.adopt([topic])
    reaper.adopt([topic])  # handed twice (two deltas removed it): held once
    assert reaper.release_some() and reaper.waiting == 1 and reaper.pieces == 0
    assert _alive(refs) == 3000
    del topic  # the last other holder goes
    assert reaper.release_some()
    assert reaper.idle and _alive(refs) == 0 and reaper.pieces > 3000 // CHUNK


def test_every_piece_frees_at_most_a_chunk_and_everything_goes() -> None:
    topic, refs = _topic(10_000)
    reaper = Reaper(chunk=CHUNK)
    reaper.adopt([topic])
    del topic
    freed_per_piece: list[int] = []
    for _ in range(1000):
        before = _alive(refs)
        done = reaper.release_some(max_pieces=1)
        freed_per_piece.append(before - _alive(refs))
        if done:
            break
    assert reaper.idle and _alive(refs) == 0
    assert max(freed_per_piece) <= CHUNK
    assert sum(1 for n in freed_per_piece if n) >= 10_000 // CHUNK  # in ~20 pieces, not one


def test_chunked_sequences_and_dicts_are_taken_apart_too() -> None:
    shared = (1, 2, 3)
    chunks = tuple(tuple(Item(shared) for _ in range(1000)) for _ in range(8))  # a chunked sequence
    refs = [weakref.ref(i) for chunk in chunks for i in chunk]
    by_name = {f"p{n}": Item(shared) for n in range(3000)}  # a broker's deletes
    refs += [weakref.ref(i) for i in by_name.values()]
    reaper = Reaper(chunk=CHUNK)
    reaper.adopt([chunks, by_name])
    del chunks, by_name
    most = 0
    while True:
        before = _alive(refs)
        done = reaper.release_some(max_pieces=1)
        most = max(most, before - _alive(refs))
        if done:
            break
    assert _alive(refs) == 0 and most <= CHUNK


def test_a_turn_runs_pieces_until_its_budget_is_spent() -> None:
    clock = CostClock()
    topic, refs = _topic(20_000)
    reaper = Reaper(clock=clock, chunk=CHUNK)
    reaper.adopt([topic])
    del topic
    turns = 0
    while not reaper.release_some(Deadline(clock, 3)):
        turns += 1
    assert _alive(refs) == 0
    assert turns >= (2 * 20_000 // CHUNK) // 3  # about 3 pieces a turn (each look costs 1 ms)


async def test_on_a_loop_it_releases_in_turns_once_the_other_holders_are_gone() -> None:
    loop = asyncio.get_running_loop()
    reaper = reaper_of(loop)
    assert reaper_of(loop) is reaper
    topic, refs = _topic(MIN_ITEMS + 100)
    small, small_refs = _topic(10)
    release_removed_topics([topic, small])  # only the big one is worth handing over
    assert reaper.waiting == 1
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert _alive(refs) == MIN_ITEMS + 100  # still held here
    del topic, small
    assert _alive(small_refs) == 0  # freed the ordinary way
    for _ in range(1000):  # the reaper looks again every POLL_S, then releases a slice per turn
        if reaper.idle:
            break
        await asyncio.sleep(0.01)
    assert reaper.idle and _alive(refs) == 0


def test_outside_a_loop_nothing_is_kept() -> None:
    topic, refs = _topic(MIN_ITEMS)
    assert not release_later([topic])
    del topic
    assert _alive(refs) == 0
