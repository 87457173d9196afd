"""The membership nemesis (remove a voter and add it back, or wipe a voter's disk and replace its stale
key, optionally under another fault) and the ``voters-restored`` checker of dynamic chaos runs, against
fakes."""

from __future__ import annotations

import random

from chaos.checkers import Status
from chaos.nemesis import MembershipNemesis, Nemesis
from chaos.runner import check_voters_restored
from kraft.errors import ErrorCode, KraftError

DIRS = {"controller-1": "d1", "controller-2": "d2", "controller-3": "d3"}


class FakeQuorum:
    """A voter set that changes as asked; ``blocked`` makes every change fail (no leader reachable)."""

    def __init__(self) -> None:
        self.voter_set = dict(DIRS)
        self.disks = dict(DIRS)
        """Each controller's directory id now (meta.properties)."""
        self.blocked = False
        self.calls: list[str] = []

    @property
    def controller_names(self) -> list[str]:
        return sorted(DIRS)

    def voters(self) -> dict[str, str]:
        return dict(self.voter_set)

    def remove_voter(self, node: str, directory_id: str, timeout_s: float) -> int:
        self.calls.append(f"remove {node} {directory_id}")
        if self.blocked:
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, "the change did not commit")
        if self.voter_set.get(node) != directory_id:
            raise KraftError(ErrorCode.VOTER_NOT_FOUND, f"({node}, {directory_id}) is not a voter")
        del self.voter_set[node]
        return 10

    def add_voter(self, node: str, timeout_s: float) -> int:
        self.calls.append(f"add {node}")
        if self.blocked:
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, "not caught up")
        if node in self.voter_set:
            raise KraftError(ErrorCode.DUPLICATE_VOTER, f"{node} is already a voter")
        self.voter_set[node] = self.disks[node]
        return 11

    def directory_id(self, node: str) -> str:
        return self.disks[node]

    def wipe(self, node: str) -> str:
        self.calls.append(f"wipe {node}")
        self.disks[node] = f"new-{node}"
        return self.disks[node]


class Cut(Nemesis):
    """A fault whose heal unblocks the quorum."""

    def __init__(self, quorum: FakeQuorum) -> None:
        super().__init__("cut")
        self.quorum = quorum

    def _start(self, rng: random.Random) -> str:
        return "cut"

    def _heal(self) -> str:
        self.quorum.blocked = False
        return "healed"


def test_removes_a_voter_with_its_directory_id_and_adds_it_back() -> None:
    quorum = FakeQuorum()
    nemesis = MembershipNemesis("remove-add", quorum)
    started = nemesis.start(random.Random(3))
    removed = next(name for name in DIRS if name not in quorum.voter_set)
    assert started == f"removed {removed} (VotersRecord at 10)"
    assert quorum.calls == [f"remove {removed} {DIRS[removed]}"]
    assert nemesis.heal() == f"added {removed} (VotersRecord at 11)"
    assert quorum.voter_set == DIRS


def test_a_change_the_fault_blocks_is_retried_after_the_fault_heals() -> None:
    quorum = FakeQuorum()
    nemesis = MembershipNemesis("remove-add-cut", quorum, Cut(quorum))
    nemesis.start(random.Random(1))  # the removal goes through, then the cut blocks the add
    quorum.blocked = True
    healed = nemesis.heal()
    assert "add controller-" in healed and "failed" in healed  # under the cut
    assert healed.index("healed") < healed.rindex("added controller-")  # after it
    assert quorum.voter_set == DIRS


def test_a_failed_removal_is_recorded_not_raised() -> None:
    quorum = FakeQuorum()
    quorum.blocked = True
    nemesis = MembershipNemesis("remove-add-cut", quorum, Cut(quorum))
    started = nemesis.start(random.Random(2))
    assert started.startswith("cut; remove controller-") and "failed: KraftError" in started
    assert nemesis.heal() == "healed"  # nothing was missing
    assert quorum.voter_set == DIRS


def test_voters_restored_checker() -> None:
    assert check_voters_restored(dict(DIRS), dict(DIRS)).status is Status.PASS
    missing = {k: v for k, v in DIRS.items() if k != "controller-2"}
    assert check_voters_restored(missing, dict(DIRS)).status is Status.FAIL
    stale = {**DIRS, "controller-3": "old"}  # a wiped disk's old voter key still in the set
    verdict = check_voters_restored(stale, dict(DIRS))
    assert verdict.status is Status.FAIL and "controller-3" in verdict.offending[0]
    assert check_voters_restored(None, dict(DIRS)).status is Status.UNKNOWN


def test_a_wiped_voter_is_replaced_its_stale_key_removed_then_its_new_one_added() -> None:
    quorum = FakeQuorum()
    nemesis = MembershipNemesis("replace-wiped", quorum, wipe=True)
    started = nemesis.start(random.Random(3))
    wiped = next(name for name in DIRS if quorum.disks[name] != DIRS[name])
    assert started == f"wiped {wiped}'s disk: back as directory new-{wiped} (voter {DIRS[wiped]})"
    assert quorum.voter_set == DIRS, "a wipe changes no voter: the old key stays until it is removed"
    healed = nemesis.heal()
    assert healed == (
        f"removed stale {wiped} {DIRS[wiped]} (VotersRecord at 10); added {wiped} (VotersRecord at 11)"
    )
    assert quorum.calls == [f"wipe {wiped}", f"remove {wiped} {DIRS[wiped]}", f"add {wiped}"]
    assert quorum.voter_set == quorum.disks and quorum.voter_set[wiped] == f"new-{wiped}"


def test_a_stale_key_the_fault_keeps_is_replaced_after_the_heal() -> None:
    quorum = FakeQuorum()
    nemesis = MembershipNemesis("replace-wiped-cut", quorum, Cut(quorum), wipe=True)
    nemesis.start(random.Random(5))
    quorum.blocked = True
    healed = nemesis.heal()
    assert "remove stale controller-" in healed and "failed" in healed  # under the cut: nothing added
    assert healed.index("healed") < healed.rindex("removed stale controller-") < healed.rindex("added")
    assert quorum.voter_set == quorum.disks != DIRS
