"""Hypothesis strategies for replication tests: pairs of logs that share a prefix and then diverge.

A log is modelled as the list of the leader epochs of its records (offset = index, log start 0). Any two
generated logs obey Log Matching — the invariant epoch-stamped replication keeps: an epoch's records were
written by its one leader at fixed offsets, so two logs that both hold some record of epoch ``e`` agree
on everything up to it. Concretely: after the common prefix (ending in epoch ``c``) the two suffixes use
disjoint epochs, except that one of them (never both) may continue ``c``.

Every divergence shape comes out of this: follower longer / leader longer / either empty, different
epochs at the same offset, follower epochs the leader never had (higher or lower than the leader's),
the leader continuing the common epoch, empty logs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from kraft.replication.epochs import with_leader_epoch


def entries_of(log: list[int]) -> tuple[tuple[int, int], ...]:
    """The epoch entries (epoch, start offset) of a log given as epochs per offset."""
    entries: list[tuple[int, int]] = []
    for offset, epoch in enumerate(log):
        if not entries or entries[-1][0] != epoch:
            entries.append((epoch, offset))
    return tuple(entries)


@dataclass(frozen=True)
class World:
    common: list[int]
    leader_log: list[int]
    follower_log: list[int]
    leader_epoch: int  # the leader's current epoch: larger than every epoch of either log
    follower_high_watermark: int

    @property
    def divergence(self) -> int:
        """The first offset where the logs differ (or where the shorter one ends)."""
        return len(self.common)

    @property
    def leader_entries(self) -> tuple[tuple[int, int], ...]:
        # The leader records its epoch at its log end when elected (Partition.makeLeader).
        return with_leader_epoch(entries_of(self.leader_log), self.leader_epoch, len(self.leader_log))

    @property
    def follower_entries(self) -> tuple[tuple[int, int], ...]:
        return entries_of(self.follower_log)


def _run(epochs: list[int], counts: list[int]) -> list[int]:
    log: list[int] = []
    for epoch, count in zip(epochs, counts, strict=True):
        log += [epoch] * count
    return log


@st.composite
def worlds(draw: st.DrawFn, *, consistent_high_watermark: bool = True) -> World:
    """Two diverging logs and the follower's high watermark.

    With ``consistent_high_watermark`` the follower's high watermark is at most the common prefix (what
    clean elections guarantee: committed records are on every later leader); without, it may lie
    anywhere in the follower's log (a world where committed data was lost or an unclean election ran).
    """
    prefix_epochs = sorted(draw(st.sets(st.integers(0, 6), max_size=3)))
    common = _run(prefix_epochs, [draw(st.integers(1, 3)) for _ in prefix_epochs])
    last_common = common[-1] if common else -1
    # Epochs after the prefix: each goes to the leader, the follower, or nobody; disjoint by construction.
    later = sorted(draw(st.sets(st.integers(last_common + 1, last_common + 12), max_size=6)))
    owners = [draw(st.sampled_from(("leader", "follower", "none"))) for _ in later]
    leader_epochs = [e for e, owner in zip(later, owners, strict=True) if owner == "leader"]
    follower_epochs = [e for e, owner in zip(later, owners, strict=True) if owner == "follower"]
    # At most one side continues the last common epoch.
    continues = draw(st.sampled_from(("leader", "follower", "none"))) if common else "none"
    if continues == "leader":
        leader_epochs.insert(0, last_common)
    elif continues == "follower":
        follower_epochs.insert(0, last_common)
    leader_suffix = _run(leader_epochs, [draw(st.integers(1, 3)) for _ in leader_epochs])
    follower_suffix = _run(follower_epochs, [draw(st.integers(1, 3)) for _ in follower_epochs])
    leader_log = common + leader_suffix
    follower_log = common + follower_suffix
    top = max([*leader_log, *follower_log, -1])
    leader_epoch = top + draw(st.integers(1, 3))
    bound = len(common) if consistent_high_watermark else len(follower_log)
    high_watermark = draw(st.integers(0, bound))
    return World(common, leader_log, follower_log, leader_epoch, high_watermark)
