"""bench.admin_ab's swap: each quorum gets the other tree half-way, and the summary separates what is the
tree's (``summary``, over both quorums) from what is the quorum's (``summary_by_quorum``).  No quorum runs
here: the rows are of the windows' shape."""

from __future__ import annotations

from typing import Any

from bench.admin_ab import _SUMMARY_KEYS, summarize, swapped


def _row(tree: str, quorum: str, p50_ms: float) -> dict[str, Any]:
    return {**dict.fromkeys(_SUMMARY_KEYS, 0.0), "p50_ms": p50_ms, "tree": tree, "quorum": quorum}


def test_the_swap_gives_each_quorum_the_other_tree() -> None:
    assert swapped({"1": "A", "2": "B"}) == {"1": "B", "2": "A"}
    assert swapped(swapped({"1": "A", "2": "B"})) == {"1": "A", "2": "B"}


def test_a_quorum_bias_shows_per_quorum_and_cancels_per_tree() -> None:
    # Quorum 2 is 1 ms slower whatever it runs; the trees are the same code.  Before the swap (pairs 0, 1)
    # tree B ran on quorum 2 and lost both pairs; after it (pairs 2, 3) tree A did.
    rows = {
        "A": [_row("A", "1", 4.0), _row("A", "1", 4.2), _row("A", "2", 5.0), _row("A", "2", 5.2)],
        "B": [_row("B", "2", 5.1), _row("B", "2", 5.1), _row("B", "1", 4.1), _row("B", "1", 4.1)],
    }
    result = summarize(rows, idle=False)
    assert result["summary"]["A"]["p50_ms"] == 4.6 and result["summary"]["B"]["p50_ms"] == 4.6
    assert result["summary_by_quorum"]["1"]["p50_ms"] == 4.1
    assert result["summary_by_quorum"]["2"]["p50_ms"] == 5.1
    assert result["summary_by_tree_and_quorum"]["A@2"] == {"p50_ms": 5.1, "p99_ms": 0.0}
    assert result["b_better_pairs"] == 2
    assert result["b_better_pairs_by_assignment"] == {"A@1": 0, "A@2": 2}
