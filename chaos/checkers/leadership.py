"""Leadership safety (one leader per epoch, monotonic epochs), broker fencing, and post-heal liveness."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chaos.checkers.verdict import Verdict, failed, passed, unknown
from chaos.history import EventType, Operation


@dataclass(frozen=True, slots=True)
class LeaderObservation:
    """``observer`` saw ``leader_id`` (None = no leader known) in ``epoch`` at ``time_ns``.

    Sources: DescribeQuorum polls of each controller (observer = the polled node) or LeaderChange records
    of a log (observer = "log:<node>", time_ns = the record's offset, which orders them just as well).
    """

    observer: str
    epoch: int
    leader_id: int | None
    time_ns: int
    disk: str = ""
    """The observer's metadata disk (its directory id) when it answered, where known: a wiped disk comes
    back knowing no epoch (a new directory id), so only one disk's epochs must never go back."""


def check_single_leader_per_epoch(observations: Sequence[LeaderObservation]) -> Verdict:
    """No two different leaders ever claimed for the same epoch, and no observer's epoch goes backwards
    while it keeps its disk (a controller whose disk was wiped starts again from epoch 0, as a new
    directory id: KIP-853's disk replacement)."""
    checker = "single-leader-per-epoch"
    leaders: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    problems: list[str] = []
    for obs in observations:
        if obs.leader_id is not None:
            leaders[obs.epoch][obs.leader_id].append(obs.observer)
    for epoch, claimed in sorted(leaders.items()):
        if len(claimed) > 1:
            who = ", ".join(
                f"leader {leader} (seen by {sorted(set(seen))})" for leader, seen in claimed.items()
            )
            problems.append(f"epoch {epoch}: {who}")
    by_observer: dict[tuple[str, str], list[LeaderObservation]] = defaultdict(list)
    for obs in observations:
        by_observer[obs.observer, obs.disk].append(obs)
    for (observer, disk), seen in sorted(by_observer.items()):
        ordered = sorted(seen, key=lambda o: o.time_ns)
        on_disk = f" (disk {disk})" if disk else ""
        for before, after in itertools.pairwise(ordered):
            if after.epoch < before.epoch:
                problems.append(
                    f"{observer}{on_disk}: epoch went back from {before.epoch} (t={before.time_ns}) "
                    f"to {after.epoch} (t={after.time_ns})"
                )
    if not observations:
        return unknown(checker, "no leader observations")
    if problems:
        return failed(checker, f"{len(problems)} leadership violations", problems, epochs=len(leaders))
    return passed(checker, f"{len(leaders)} epochs, one leader each, epochs monotonic", epochs=len(leaders))


@dataclass(frozen=True, slots=True)
class FencingInterval:
    """Broker ``broker_id`` was fenced — by one fence record, never unfenced in between — at least from
    ``fenced_ns`` (the fence had committed by then) until ``unfenced_ns`` (it was still in force then;
    None: for the rest of the run).  Times use the history's clock."""

    broker_id: int
    fenced_ns: int
    unfenced_ns: int | None


def check_fenced_broker_never_acked(
    ops: Sequence[Operation], fencing: Sequence[FencingInterval], broker_of: Mapping[int, int]
) -> Verdict:
    """No ``produce`` acknowledged by a broker that was invoked after that broker's fencing committed.

    ``broker_of`` maps a history process to the broker it sends to.  Using the invocation time (not the
    completion) means a request already in flight when the fence committed is never blamed.
    """
    checker = "fenced-broker-never-acks"
    intervals: dict[int, list[FencingInterval]] = defaultdict(list)
    for interval in fencing:
        intervals[interval.broker_id].append(interval)
    problems: list[str] = []
    acked = 0
    for op in ops:
        if op.f != "produce" or op.outcome is not EventType.OK:
            continue
        acked += 1
        broker = broker_of.get(op.process)
        if broker is None:
            continue
        for interval in intervals.get(broker, []):
            end = float("inf") if interval.unfenced_ns is None else interval.unfenced_ns
            if interval.fenced_ns < op.invoke_ns and (op.complete_ns or 0) < end:
                problems.append(f"{op.describe()}: broker {broker} fenced since t={interval.fenced_ns}")
                break
    if problems:
        return failed(
            checker, f"{len(problems)} produces acknowledged by fenced brokers", problems, acknowledged=acked
        )
    return passed(checker, f"{acked} acknowledged produces, none by a fenced broker", acknowledged=acked)


@dataclass(frozen=True, slots=True)
class ClusterSample:
    """One status poll: the active controller (None = none) and each live broker's fenced flag.

    ``time_ns`` is when the answer was back; the flags describe the controller's committed image at
    ``metadata_offset`` (-1: unknown) as it stood at some moment between ``probe_ns`` (when the request
    was sent; None: unknown, take ``time_ns``) and ``time_ns``.
    """

    time_ns: int
    leader_id: int | None
    fenced: Mapping[int, bool]
    metadata_offset: int = -1
    probe_ns: int | None = None

    @property
    def observed_from_ns(self) -> int:
        """The earliest moment the flags may describe (the request's send time)."""
        return self.time_ns if self.probe_ns is None else self.probe_ns


def check_liveness_after_heal(
    samples: Sequence[ClusterSample], healed_ns: int, live_brokers: Sequence[int], bound_s: float
) -> Verdict:
    """Within ``bound_s`` of the last heal, some sample shows a leader and every live broker unfenced."""
    checker = "liveness-after-heal"
    deadline = healed_ns + int(bound_s * 1e9)
    window = sorted((s for s in samples if healed_ns <= s.time_ns <= deadline), key=lambda s: s.time_ns)
    for sample in window:
        if sample.leader_id is not None and all(sample.fenced.get(b) is False for b in live_brokers):
            recovered_s = (sample.time_ns - healed_ns) / 1e9
            return passed(
                checker,
                f"leader {sample.leader_id} and {len(live_brokers)} brokers unfenced "
                f"{recovered_s:.2f}s after the heal",
                recovery_s=recovered_s,
            )
    if not window:
        return unknown(checker, f"no status samples within {bound_s}s after the heal")
    last = window[-1]
    problems = [] if last.leader_id is not None else ["no active controller"]
    problems += [
        f"broker {b} still fenced" if last.fenced.get(b) else f"broker {b} not registered"
        for b in live_brokers
        if last.fenced.get(b) is not False
    ]
    return failed(checker, f"not recovered within {bound_s}s of the heal", problems, samples=len(window))
