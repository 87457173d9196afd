"""Partition shapes as sets of cut directed links (Jepsen's "grudges", made explicit per direction).

Pure functions: given node names (and a seeded RNG where a shape is random) return the directed pairs
(a, b) whose traffic must stop — "a can no longer reach b".  A symmetric cut lists both directions.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

Cuts = frozenset[tuple[str, str]]


def split(side_a: Iterable[str], side_b: Iterable[str]) -> Cuts:
    """No traffic between the two sides, in either direction."""
    a, b = set(side_a), set(side_b)
    return frozenset({(x, y) for x in a for y in b} | {(y, x) for x in a for y in b})


def isolate(node: str, nodes: Iterable[str]) -> Cuts:
    """``node`` can neither reach nor be reached by any other node."""
    return split([node], [n for n in nodes if n != node])


def one_way(source: str, target: str) -> Cuts:
    """``source`` cannot reach ``target``; ``target`` still reaches ``source``."""
    return frozenset({(source, target)})


def majority_split(
    controllers: Sequence[str], others: Sequence[str], rng: random.Random
) -> tuple[list[str], list[str], Cuts]:
    """Random majority/minority halves of the controllers; every other node (broker) joins a random side.

    Returns (majority side, minority side, cuts).
    """
    shuffled = list(controllers)
    rng.shuffle(shuffled)
    majority_size = len(shuffled) // 2 + 1
    majority, minority = shuffled[:majority_size], shuffled[majority_size:]
    for node in others:
        (majority if rng.random() < 0.5 else minority).append(node)
    return sorted(majority), sorted(minority), split(majority, minority)


def bridge(nodes: Sequence[str], rng: random.Random) -> tuple[str, Cuts]:
    """Two halves that cannot talk to each other, plus one *bridge* node that talks to both.

    Returns (bridge node, cuts).  Needs at least three nodes.
    """
    if len(nodes) < 3:
        raise ValueError(f"a bridge needs at least 3 nodes, got {len(nodes)}")
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    middle = shuffled[0]
    rest = shuffled[1:]
    half = len(rest) // 2
    return middle, split(rest[:half], rest[half:])


def describe(cuts: Cuts) -> str:
    """``a -/-> b`` lines, symmetric pairs folded into ``a <-/-> b``."""
    seen: set[tuple[str, str]] = set()
    parts: list[str] = []
    for a, b in sorted(cuts):
        if (a, b) in seen:
            continue
        if (b, a) in cuts:
            seen.add((b, a))
            parts.append(f"{a} <-/-> {b}")
        else:
            parts.append(f"{a} -/-> {b}")
        seen.add((a, b))
    return ", ".join(parts) if parts else "no cuts"
