"""kraft.reaper: what it is handed is released only once nobody else holds it, then in pieces that each
free at most ``CHUNK`` objects, until everything is freed. Deterministic: pieces are counted, the event
loop's turns driven by hand; liveness is read through weak references."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from loop_fakes import CostClock

from kraft.clock import Deadline
from kraft.reaper import (
    GROUPS_HELD_AHEAD,
    MIN_ITEMS,
    Bundle,
    Reaper,
    reaper_of,
    release_later,
    release_removed_topics,
    release_replaced_topics,
)

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


def test_a_long_list_it_alone_holds_is_shortened_in_place_without_slices() -> None:
    """A list the reaper alone holds (a snapshot's records) loses a chunk of items per piece in place,
    from its end: no slice lists are made first (young containers whose items every young collection
    would visit; cutting made a piece that freed nothing per slice)."""
    shared = (1, 2, 3)
    items = [Item(shared) for _ in range(5 * CHUNK + 7)]
    refs = [weakref.ref(i) for i in items]
    reaper = Reaper(chunk=CHUNK)
    reaper.adopt([items])
    del items
    freed: list[int] = []
    while True:
        before = _alive(refs)
        done = reaper.release_some(max_pieces=1)
        freed.append(before - _alive(refs))
        if done:
            break
    assert _alive(refs) == 0
    assert freed[:6] == [CHUNK] * 5 + [7] and not any(freed[6:])  # (then the emptied list itself)


def test_a_list_someone_else_holds_is_left_as_it_is() -> None:
    items = [Item((1,)) for _ in range(3 * CHUNK)]
    reaper = Reaper(chunk=CHUNK)
    reaper.adopt([items])
    reaper.release_some()
    assert len(items) == 3 * CHUNK  # still held here: never changed


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


def _topics(counts: list[int]) -> tuple[list[Topic], list[weakref.ref[Item]]]:
    topics: list[Topic] = []
    refs: list[weakref.ref[Item]] = []
    for count in counts:
        topic, topic_refs = _topic(count)
        topics.append(topic)
        refs.extend(topic_refs)
    return topics, refs


def test_a_group_waits_until_it_alone_holds_its_items_and_the_others_go_on() -> None:
    (first, second, third), refs = _topics([100, 100, 100])
    reaper = Reaper(chunk=CHUNK)
    pinned = second  # someone else (an image) still holds the second group's topic
    reaper.adopt_groups([(first,), (second,), (third,)])
    del first, second, third
    assert reaper.release_some()
    assert reaper.waiting == 1 and _alive(refs) == 100  # the second waits for its holder, the others went
    assert reaper.release_some() and reaper.waiting == 1 and _alive(refs) == 100
    del pinned
    assert reaper.release_some()
    assert reaper.idle and _alive(refs) == 0


def test_groups_handed_first_go_ahead_and_a_turn_stops_after_a_few_held_ones() -> None:
    topics, refs = _topics([10] * (GROUPS_HELD_AHEAD + 5))
    holders = [(topic,) for topic in topics]  # what holds each topic (as a map's part holds its topics)
    reaper = Reaper(chunk=CHUNK)
    reaper.adopt_groups([Bundle((topic,)) for topic in topics])
    reaper.adopt_groups([Bundle((holder,)) for holder in holders], first=True)
    del topics, holders
    # First the holders' groups (free: only their bundles hold them), dropped; only then the topics.
    assert reaper.release_some() and _alive(refs) == 10 * (GROUPS_HELD_AHEAD + 5)
    assert reaper.waiting == GROUPS_HELD_AHEAD + 5
    assert reaper.release_some() and reaper.idle and _alive(refs) == 0
    held = [Bundle((Item((1,)),)) for _ in range(GROUPS_HELD_AHEAD + 3)]
    keep = [group[0] for group in held]  # every group's item still held here
    reaper.adopt_groups(held)
    del held
    reaper.release_some()
    assert reaper.waiting == GROUPS_HELD_AHEAD + 3  # it looked at GROUPS_HELD_AHEAD, then stopped
    del keep
    assert reaper.release_some() and reaper.idle


async def test_a_replaced_images_small_topics_go_in_groups_of_about_a_chunk() -> None:
    """Issue #17: a snapshot replaces the whole image; its many small topics, freed together where the
    image's last holder lets go, would be one long deallocation — so they are grouped (about CHUNK
    partitions a group) and each group freed in one piece, once the image is gone."""
    counts = [1] * 700 + [10] * 120 + [70] * 20 + [600] * 3 + [MIN_ITEMS + 1]
    topics, refs = _topics(counts)
    image = {f"T{i}": topic for i, topic in enumerate(topics)}  # the replaced image's holding
    del topics
    reaper = reaper_of(asyncio.get_running_loop())
    waiting = reaper.waiting
    release_replaced_topics(image.values())
    # The big topic alone, each of the 23 topics of more than BIG partitions a group of its own, and the
    # 820 small ones (weight: partitions + 1 each) in groups of about CHUNK.
    small_weight = 700 * 2 + 120 * 11
    assert waiting + 1 + 23 < reaper.waiting <= waiting + 1 + 23 + small_weight // CHUNK + 1
    assert reaper.release_some() and _alive(refs) == sum(counts)  # nothing goes while the image holds it
    del image
    freed_per_piece: list[int] = []
    while True:
        before = _alive(refs)
        done = reaper.release_some(max_pieces=1)
        freed_per_piece.append(before - _alive(refs))
        if done and reaper.idle:
            break
    assert _alive(refs) == 0
    # A group closes once it holds CHUNK partitions: at most CHUNK - 1 plus its last topic's, and a
    # topic of more than BIG (64) partitions is taken apart on its own.
    assert max(freed_per_piece) <= CHUNK + 64
    assert sum(1 for n in freed_per_piece if n) >= sum(counts) // (CHUNK + 64)
