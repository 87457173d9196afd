"""Nemeses — faults with a ``start`` and a ``heal`` — and a seeded scheduler that runs them.

Network nemeses act only through the Toxiproxy API over a :class:`~chaos.topology.Topology` (one proxy
per directed link); process nemeses act through :class:`ProcessControl`, which the cluster harness
implements (kill -9 and restart, SIGSTOP and SIGCONT).  Every random choice draws from the scheduler's
seeded RNG, so a seed replays the same sequence of faults (their timing still depends on the machine).

Cutting a link: ``blackhole`` adds a ``timeout`` toxic with ``timeout=0`` on both streams — existing
connections hang silently until gRPC deadlines or keepalives notice, like a dropped-packet partition —
and healing removes it, which closes those connections so clients reconnect.  ``refuse`` disables the
proxy instead (connection refused, open connections closed): a fast-failing partition.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from chaos import grudges
from chaos.topology import LinkProxy, Topology

CUT_TOXIC = "nemesis_cut"
FLAKY_TOXIC = "nemesis_flaky"


class ProxyApi(Protocol):
    """The part of the Toxiproxy API nemeses use (``chaos.proxy.client.ToxiproxyClient`` has it)."""

    def add_toxic(
        self,
        proxy: str,
        name: str,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        attributes: dict[str, int] | None = None,
    ) -> object: ...

    def remove_toxic(self, proxy: str, name: str) -> None: ...

    def set_enabled(self, name: str, enabled: bool) -> None: ...


class ProcessControl(Protocol):
    """How process nemeses reach node processes; the cluster harness implements it."""

    def kill(self, node: str) -> None:
        """SIGKILL the node's process (no shutdown hooks, unflushed data lost)."""
        ...

    def restart(self, node: str) -> None:
        """Start a killed node again with the same config and data."""
        ...

    def pause(self, node: str) -> None:
        """SIGSTOP the node's process."""
        ...

    def resume(self, node: str) -> None:
        """SIGCONT a paused node."""
        ...

    def leader(self) -> str | None:
        """The active controller's node name, if one is known right now."""
        ...


class Nemesis(abc.ABC):
    """A fault.  ``start`` returns a one-line description of what it did; ``heal`` undoes exactly that.

    ``min_hold_s``: the scheduler holds this fault at least that long (the run's end permitting), for
    faults that only matter once they outlast a timeout — e.g. a broker isolated past its session, so
    that it is fenced and replaced while it still believes it leads.
    """

    min_hold_s: float = 0.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.active = False

    @abc.abstractmethod
    def _start(self, rng: random.Random) -> str: ...

    @abc.abstractmethod
    def _heal(self) -> str: ...

    def start(self, rng: random.Random) -> str:
        if self.active:
            raise RuntimeError(f"nemesis {self.name} is already active")
        description = self._start(rng)
        self.active = True
        return description

    def heal(self) -> str:
        if not self.active:
            return "nothing to heal"
        try:
            return self._heal()
        finally:
            self.active = False


class CutMode(enum.Enum):
    BLACKHOLE = "blackhole"
    REFUSE = "refuse"


class PartitionNemesis(Nemesis):
    """Cuts the directed links a *shape* function picks (see :mod:`chaos.grudges`)."""

    def __init__(
        self,
        name: str,
        proxies: ProxyApi,
        topology: Topology,
        shape: Callable[[random.Random], grudges.Cuts],
        mode: CutMode = CutMode.BLACKHOLE,
    ) -> None:
        super().__init__(name)
        self._proxies = proxies
        self._topology = topology
        self._shape = shape
        self._mode = mode
        self._cut: list[LinkProxy] = []

    def _start(self, rng: random.Random) -> str:
        cuts = self._shape(rng)
        # Pairs without a proxy (e.g. controller -> broker, which never dial) carry no traffic to cut.
        for source, target in sorted(cuts):
            link = self._topology.links.get((source, target))
            if link is None:
                continue
            if self._mode is CutMode.REFUSE:
                self._proxies.set_enabled(link.name, False)
            else:
                for stream in ("upstream", "downstream"):
                    self._proxies.add_toxic(
                        link.name, f"{CUT_TOXIC}_{stream}", "timeout", stream, 1.0, {"timeout": 0}
                    )
            self._cut.append(link)
        return f"{self._mode.value} {grudges.describe(cuts)}"

    def _heal(self) -> str:
        healed = len(self._cut)
        for link in self._cut:
            if self._mode is CutMode.REFUSE:
                self._proxies.set_enabled(link.name, True)
            else:
                for stream in ("upstream", "downstream"):
                    self._proxies.remove_toxic(link.name, f"{CUT_TOXIC}_{stream}")
        self._cut = []
        return f"restored {healed} links"


@dataclass(frozen=True, slots=True)
class FlakySpec:
    """A toxic to put on both streams of some links: e.g. latency+jitter, reset_peer, slicer."""

    kind: str
    attributes: dict[str, int]
    toxicity: float = 1.0
    streams: tuple[str, ...] = ("upstream", "downstream")


class FlakyLinkNemesis(Nemesis):
    """Makes a random ``fraction`` (at least one) of the given links flaky with ``spec``."""

    def __init__(
        self, name: str, proxies: ProxyApi, links: Sequence[LinkProxy], spec: FlakySpec, fraction: float = 0.5
    ) -> None:
        super().__init__(name)
        if not links:
            raise ValueError(f"nemesis {name}: no links to make flaky")
        self._proxies = proxies
        self._links = list(links)
        self._spec = spec
        self._fraction = fraction
        self._applied: list[tuple[str, str]] = []

    def _start(self, rng: random.Random) -> str:
        count = max(1, round(len(self._links) * self._fraction))
        chosen = rng.sample(self._links, count)
        for link in chosen:
            for stream in self._spec.streams:
                toxic = f"{FLAKY_TOXIC}_{stream}"
                self._proxies.add_toxic(
                    link.name,
                    toxic,
                    self._spec.kind,
                    stream,
                    self._spec.toxicity,
                    dict(self._spec.attributes),
                )
                self._applied.append((link.name, toxic))
        attrs = ",".join(f"{k}={v}" for k, v in sorted(self._spec.attributes.items()))
        names = ", ".join(sorted(link.name for link in chosen))
        return f"{self._spec.kind}({attrs}, toxicity={self._spec.toxicity:g}) on {names}"

    def _heal(self) -> str:
        for proxy, toxic in self._applied:
            self._proxies.remove_toxic(proxy, toxic)
        removed = len(self._applied)
        self._applied = []
        return f"removed {removed} toxics"


class Targets(enum.Enum):
    """Which nodes a process nemesis hits (Jepsen's db-nemesis targets)."""

    ONE = "one"
    LEADER = "leader"
    MINORITY = "minority"
    ALL_BUT_ONE = "all-but-one"  # e.g. two of three brokers: below min.insync.replicas=2


def choose_targets(
    targets: Targets, candidates: Sequence[str], rng: random.Random, leader: str | None
) -> list[str]:
    if targets is Targets.LEADER and leader is not None and leader in candidates:
        return [leader]
    if targets is Targets.MINORITY:
        count = max(1, (len(candidates) - 1) // 2)
        return sorted(rng.sample(list(candidates), count))
    if targets is Targets.ALL_BUT_ONE:
        return sorted(rng.sample(list(candidates), max(1, len(candidates) - 1)))
    return [rng.choice(list(candidates))]


class ProcessNemesis(Nemesis):
    """A fault on whole processes: ``start`` hits the chosen nodes, ``heal`` undoes it on the same ones.

    A subclass states only the fault: the :class:`ProcessControl` calls that apply and undo it, and the
    verbs that describe each in the history.
    """

    _applied_verb: ClassVar[str]
    _undone_verb: ClassVar[str]

    def __init__(
        self, name: str, control: ProcessControl, candidates: Sequence[str], targets: Targets = Targets.ONE
    ) -> None:
        super().__init__(name)
        self._control = control
        self._candidates = list(candidates)
        self._targets = targets
        self._hit: list[str] = []

    @abc.abstractmethod
    def _apply(self, node: str) -> None: ...

    @abc.abstractmethod
    def _undo(self, node: str) -> None: ...

    def _start(self, rng: random.Random) -> str:
        leader = self._control.leader() if self._targets is Targets.LEADER else None
        self._hit = choose_targets(self._targets, self._candidates, rng, leader)
        for node in self._hit:
            self._apply(node)
        return f"{self._applied_verb} {', '.join(self._hit)}"

    def _heal(self) -> str:
        for node in self._hit:
            self._undo(node)
        healed, self._hit = self._hit, []
        return f"{self._undone_verb} {', '.join(healed)}"


class KillNemesis(ProcessNemesis):
    """kill -9 the chosen nodes; heal restarts them."""

    _applied_verb = "killed"
    _undone_verb = "restarted"

    def _apply(self, node: str) -> None:
        self._control.kill(node)

    def _undo(self, node: str) -> None:
        self._control.restart(node)


class PauseNemesis(ProcessNemesis):
    """SIGSTOP the chosen nodes (held past their timeouts by the scheduler); heal sends SIGCONT."""

    _applied_verb = "paused"
    _undone_verb = "resumed"

    def _apply(self, node: str) -> None:
        self._control.pause(node)

    def _undo(self, node: str) -> None:
        self._control.resume(node)


class MembershipControl(Protocol):
    """How the membership nemesis changes a dynamic quorum's voters; the cluster harness implements it."""

    @property
    def controller_names(self) -> list[str]: ...

    def voters(self) -> dict[str, str]:
        """Voter name → directory id of the voter set in force (raises when no leader answers)."""
        ...

    def remove_voter(self, node: str, directory_id: str, timeout_s: float) -> int | None: ...

    def add_voter(self, node: str, timeout_s: float) -> int | None: ...

    def directory_id(self, node: str) -> str:
        """The directory id in ``node``'s meta.properties now (a new one after :meth:`wipe`)."""
        ...

    def wipe(self, node: str) -> str:
        """Kill ``node``, lose its metadata disk, format a new one to join (a new directory id) and
        restart it: an observer until it is added again; returns the new directory id."""
        ...


class MembershipNemesis(Nemesis):
    """Voter changes (KIP-853), optionally under another fault.

    ``start``: start ``under`` (a partition, say), then, for a voter the seeded RNG picks (the leader
    included), RemoveRaftVoter — or, with ``wipe``, replace its disk by a newly formatted one (a new
    directory id: the old voter key stays in the set and no process can vote for it any more).
    ``heal``: restore, still under the fault — remove every voter key that is not its controller's
    directory id now, then AddRaftVoter for every controller that is not a voter — then heal the fault
    and restore again whatever is left.  A change that the fault stops (no leader reachable, the new set
    cannot commit, the joiner cannot catch up) fails within ``change_timeout_s`` and is recorded as
    such: the checkers judge the run, not each change.
    """

    def __init__(
        self,
        name: str,
        control: MembershipControl,
        under: Nemesis | None = None,
        change_timeout_s: float = 8.0,
        *,
        wipe: bool = False,
    ) -> None:
        super().__init__(name)
        self._control = control
        self._under = under
        self._timeout_s = change_timeout_s
        self._wipe = wipe

    def _start(self, rng: random.Random) -> str:
        done = [self._under.start(rng)] if self._under is not None else []
        try:
            voters = self._control.voters()
        except Exception as exc:  # a run goes on whatever the quorum answers
            return "; ".join([*done, f"no voter set to change ({_short(exc)})"])
        victim = rng.choice(sorted(voters))
        if self._wipe:
            try:
                directory = self._control.wipe(victim)
                done.append(f"wiped {victim}'s disk: back as directory {directory} (voter {voters[victim]})")
            except Exception as exc:
                done.append(f"wipe {victim} failed: {_short(exc)}")
            return "; ".join(done)
        try:
            offset = self._control.remove_voter(victim, voters[victim], self._timeout_s)
            done.append(f"removed {victim} (VotersRecord at {offset})")
        except Exception as exc:
            done.append(f"remove {victim} failed: {_short(exc)}")
        return "; ".join(done)

    def _restore(self) -> list[str]:
        """Replace stale voter keys (a wiped disk's), then add every controller that is no voter."""
        try:
            voters = self._control.voters()
        except Exception as exc:
            return [f"voters unknown ({_short(exc)})"]
        done: list[str] = []
        for node, directory in sorted(voters.items()):
            try:
                if self._control.directory_id(node) == directory:
                    continue
                offset = self._control.remove_voter(node, directory, self._timeout_s)
                done.append(f"removed stale {node} {directory} (VotersRecord at {offset})")
                del voters[node]
            except Exception as exc:
                done.append(f"remove stale {node} {directory} failed: {_short(exc)}")
        for node in sorted(set(self._control.controller_names) - set(voters)):
            try:
                offset = self._control.add_voter(node, self._timeout_s)
                done.append(f"added {node} (VotersRecord at {offset})")
            except Exception as exc:
                done.append(f"add {node} failed: {_short(exc)}")
        return done

    def _heal(self) -> str:
        done = self._restore()
        if self._under is not None:
            done.append(self._under.heal())
            done += self._restore()
        return "; ".join(done) or "every controller is a voter"


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    time_ns: int
    nemesis: str
    action: str  # "start" or "heal"
    description: str


class NemesisScheduler:
    """Alternates quiet periods and faults, one nemesis at a time, for a fixed duration.

    Each round: stay quiet for U(quiet_s), start a nemesis chosen by the seeded RNG, keep it for
    U(fault_s), heal it.  Whatever is active when the run ends (or is cancelled) is healed.
    """

    def __init__(
        self,
        nemeses: Sequence[Nemesis],
        seed: int,
        quiet_s: tuple[float, float] = (1.0, 3.0),
        fault_s: tuple[float, float] = (2.0, 5.0),
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if not nemeses:
            raise ValueError("the scheduler needs at least one nemesis")
        self._nemeses = list(nemeses)
        self.rng = random.Random(seed)
        self._quiet_s = quiet_s
        self._fault_s = fault_s
        self._clock_ns = clock_ns
        self.events: list[NemesisEvent] = []

    @property
    def last_heal_ns(self) -> int | None:
        heals = [e.time_ns for e in self.events if e.action == "heal"]
        return max(heals) if heals else None

    def _record(self, nemesis: Nemesis, action: str, description: str) -> None:
        self.events.append(NemesisEvent(self._clock_ns(), nemesis.name, action, description))

    async def _heal(self, nemesis: Nemesis) -> None:
        description = await asyncio.to_thread(nemesis.heal)
        self._record(nemesis, "heal", description)

    async def run(self, duration_s: float, on_event: Callable[[NemesisEvent], None] | None = None) -> None:
        deadline = time.monotonic() + duration_s
        active: Nemesis | None = None
        try:
            while True:
                quiet = self.rng.uniform(*self._quiet_s)
                if time.monotonic() + quiet >= deadline:
                    break
                await asyncio.sleep(quiet)
                active = self.rng.choice(self._nemeses)
                description = await asyncio.to_thread(active.start, self.rng)
                self._record(active, "start", description)
                if on_event is not None:
                    on_event(self.events[-1])
                drawn = max(self.rng.uniform(*self._fault_s), active.min_hold_s)
                hold = min(drawn, max(deadline - time.monotonic(), 0.0))
                await asyncio.sleep(hold)
                current, active = active, None
                await self._heal(current)
                if on_event is not None:
                    on_event(self.events[-1])
        finally:
            if active is not None and active.active:
                # Shielded so a cancelled run still leaves the cluster healed.
                await asyncio.shield(self._heal(active))
