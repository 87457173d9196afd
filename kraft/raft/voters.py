"""The voter set (KIP-853): who votes and counts toward the high watermark, and its history in the log.

A voter is a *replica key* — a node id and the ``directory.id`` of the metadata log directory it was
added with — plus the endpoints it listens on.  A node whose directory id is not its voter's (its disk
was wiped and reformatted, so it may have lost what it acknowledged) is an observer until it is added
again: it cannot vote, be voted for, or count toward the high watermark.

Static quorums (``controller.quorum.voters``, kraft.version 0) know no directory ids: their voters carry
``""`` and match a replica with any directory id, exactly as before KIP-853.

The voter set in force is the **last** one in the log, committed or not (KIP-853, Raft dissertation
§4.1): a node uses a new configuration as soon as it is in its log.  Truncating the log reverts to the
set before the truncated entry, so :class:`VoterSetHistory` keeps every set by the offset of the record
that introduced it (Kafka's ``VoterSetHistory``).  Consecutive sets differ by at most one voter — one
change at a time — which makes any two consecutive majorities overlap (:meth:`VoterSet.overlaps_majority`).

Pure values, no IO: part of the core's import closure.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kraft.raft.quorum import majority

NO_DIRECTORY = ""
"""The directory id of a static voter (kraft.version 0): matches any replica with its node id."""


class VoterSetError(ValueError):
    """A voter set or a change to it that breaks the rules (duplicates, more than one change, ...)."""


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One listener of a voter (Kafka's ``Endpoints``: listener name, host, port)."""

    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True, order=True)
class Voter:
    node_id: int
    directory_id: str = NO_DIRECTORY
    endpoints: tuple[Endpoint, ...] = ()

    @property
    def key(self) -> tuple[int, str]:
        return self.node_id, self.directory_id

    def matches(self, node_id: int, directory_id: str) -> bool:
        """Whether the replica (``node_id``, ``directory_id``) is this voter."""
        return node_id == self.node_id and (self.directory_id in (NO_DIRECTORY, directory_id))


@dataclass(frozen=True, slots=True)
class VoterSet:
    """An immutable set of voters with distinct node ids, sorted by id."""

    voters: tuple[Voter, ...]
    _by_id: dict[int, Voter] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.voters, key=lambda voter: voter.node_id))
        by_id = {voter.node_id: voter for voter in ordered}
        if len(by_id) != len(ordered):
            raise VoterSetError(f"duplicate voter ids in {[voter.node_id for voter in ordered]}")
        if not ordered:
            raise VoterSetError("a voter set needs at least one voter")
        if any(voter.node_id < 0 for voter in ordered):
            raise VoterSetError("voter ids must not be negative")
        object.__setattr__(self, "voters", ordered)
        object.__setattr__(self, "_by_id", by_id)

    @classmethod
    def unknown(cls) -> VoterSet:
        """The set of a node formatted with ``--no-initial-controllers`` before its log holds one: no
        voters (the node is an observer that finds the quorum through its bootstrap servers)."""
        empty = object.__new__(cls)
        object.__setattr__(empty, "voters", ())
        object.__setattr__(empty, "_by_id", {})
        return empty

    @classmethod
    def static(cls, ids: Iterable[int]) -> VoterSet:
        """Voters without directory ids (``controller.quorum.voters``, kraft.version 0)."""
        return cls(tuple(Voter(node_id) for node_id in ids))

    def __iter__(self) -> Iterator[Voter]:
        return iter(self.voters)

    def __len__(self) -> int:
        return len(self.voters)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self._by_id)

    @property
    def majority(self) -> int:
        return majority(len(self.voters))

    def get(self, node_id: int) -> Voter | None:
        return self._by_id.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def is_voter(self, node_id: int, directory_id: str) -> bool:
        voter = self._by_id.get(node_id)
        return voter is not None and voter.matches(node_id, directory_id)

    def with_voter(self, voter: Voter) -> VoterSet:
        if voter.node_id in self._by_id:
            raise VoterSetError(f"node {voter.node_id} is already a voter")
        return VoterSet((*self.voters, voter))

    def without_voter(self, node_id: int, directory_id: str) -> VoterSet:
        voter = self._by_id.get(node_id)
        if voter is None or voter.directory_id != directory_id:
            raise VoterSetError(f"({node_id}, {directory_id or '-'}) is not a voter")
        return VoterSet(tuple(v for v in self.voters if v.node_id != node_id))

    def with_endpoints(self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...]) -> VoterSet:
        voter = self._by_id.get(node_id)
        if voter is None or voter.directory_id != directory_id:
            raise VoterSetError(f"({node_id}, {directory_id or '-'}) is not a voter")
        updated = Voter(node_id, directory_id, endpoints)
        return VoterSet(tuple(updated if v.node_id == node_id else v for v in self.voters))

    def overlaps_majority(self, other: VoterSet) -> bool:
        """Whether every majority of this set shares a voter with every majority of ``other`` — true
        when the two differ by at most one voter (Kafka's ``hasOverlappingMajority``)."""
        mine = {voter.key for voter in self.voters}
        theirs = {voter.key for voter in other.voters}
        return len(mine ^ theirs) <= 1


class VoterSetHistory:
    """Every voter set in the log by the offset of the record that introduced it, over a base set (the
    bootstrap or snapshot set, or the static configuration) that holds before the first entry.

    ``static`` is true while the base is the static configuration and the log holds no voter record:
    kraft.version 0, where the membership rules of the old static quorum apply."""

    def __init__(self, base: VoterSet, *, static: bool = False) -> None:
        self._base = base
        self._static = static
        self._offsets: list[int] = []
        self._sets: list[VoterSet] = []

    @property
    def static(self) -> bool:
        return self._static and not self._sets

    @property
    def kraft_version(self) -> int:
        return 0 if self.static else 1

    @property
    def latest(self) -> VoterSet:
        """The voter set in force: the last one in the log, committed or not."""
        return self._sets[-1] if self._sets else self._base

    @property
    def latest_offset(self) -> int:
        """Offset of the record that introduced :attr:`latest` (-1: the base set)."""
        return self._offsets[-1] if self._offsets else -1

    @property
    def base(self) -> VoterSet:
        return self._base

    def entries(self) -> list[tuple[int, VoterSet]]:
        return list(zip(self._offsets, self._sets, strict=True))

    def add_at(self, offset: int, voters: VoterSet) -> None:
        """Record the voter set introduced at ``offset`` (past every entry; at most one voter changed)."""
        if self._offsets and offset <= self._offsets[-1]:
            raise VoterSetError(f"voter set at {offset} does not follow the one at {self._offsets[-1]}")
        if not voters.voters:
            raise VoterSetError(f"the voter set at {offset} is empty")
        # The first set an unformatted joiner learns (its base is unknown) may be any size.
        if self.latest.voters and not self.latest.overlaps_majority(voters):
            raise VoterSetError(
                f"voter set at {offset} changes more than one voter: {self.latest.ids} -> {voters.ids}"
            )
        self._offsets.append(offset)
        self._sets.append(voters)

    def voters_at(self, offset: int) -> VoterSet:
        """The voter set in force once the record at ``offset`` is in the log."""
        index = bisect.bisect_right(self._offsets, offset)
        return self._sets[index - 1] if index else self._base

    def truncate_to(self, end_offset: int) -> None:
        """The log was cut at ``end_offset``: sets introduced at or after it no longer exist."""
        index = bisect.bisect_left(self._offsets, end_offset)
        del self._offsets[index:]
        del self._sets[index:]

    def compact_before(self, start_offset: int) -> None:
        """The log below ``start_offset`` is gone (a snapshot holds it): the set in force there becomes
        the base."""
        index = bisect.bisect_left(self._offsets, start_offset)
        if index:
            self._base = self._sets[index - 1]
            self._static = False
            del self._offsets[:index]
            del self._sets[:index]

    def replace_base(self, base: VoterSet) -> None:
        """The set before the first entry is now known to be ``base`` (a loaded snapshot's)."""
        self._base = base
        self._static = False

    def reset(self, base: VoterSet, *, static: bool = False) -> None:
        """The whole log was replaced (a snapshot installed): ``base`` is the snapshot's set."""
        self._base = base
        self._static = static
        self._offsets.clear()
        self._sets.clear()

    def copy(self) -> VoterSetHistory:
        other = VoterSetHistory(self._base, static=self._static)
        other._offsets = list(self._offsets)
        other._sets = list(self._sets)
        return other
