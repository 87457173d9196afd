"""One checked chaos run: cluster up, workload + monitor + nemeses for a while, heal, recover, check.

Phases (each bounded):
1. start the proxied cluster and wait until it is healthy;
2. for ``duration_s``: the topic workload, the monitor and the nemesis scheduler run side by side;
3. everything is healed; wait up to ``recovery_bound_s`` for a leader and every broker unfenced;
4. read the final topic set from the active controller and every controller's high watermark;
5. stop the cluster, read each controller's metadata log from disk, run the checkers;
6. write ``report.json`` and ``report.html`` (plots) next to ``history.sqlite``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos.checkers import (
    ImageHashes,
    NodeLog,
    Status,
    TopicModel,
    TopicObservation,
    Verdict,
    check_committed_logs_identical,
    check_fenced_broker_never_acked,
    check_images_match,
    check_linearizable,
    check_liveness_after_heal,
    check_no_failed_visible,
    check_no_lost_acknowledged,
    check_single_leader_per_epoch,
)
from chaos.checkers.data_plane import (
    IsrSample,
    PartitionRead,
    ReplicaLog,
    check_acknowledged_at_their_offsets,
    check_acks_all_refused_under_min_isr,
    check_consumed_in_final_log,
    check_refused_never_written,
    check_replicas_identical_below_hwm,
    under_min_isr_intervals,
)
from chaos.checkers.verdict import failed, passed, unknown
from chaos.collect import broker_registration_offsets, image_digests_at, iter_metadata_log, node_log
from chaos.data_plane import (
    DATA_MIN_INSYNC_REPLICAS,
    DATA_PLANE_OVERRIDES,
    DataConsumers,
    DataPlaneWorkload,
    IsrProbe,
    create_data_topic,
    read_final,
    read_replica_logs,
)
from chaos.harness import ChaosCluster
from chaos.history import HISTORY_FILE, HistoryStore, Operation
from chaos.monitor import ClusterMonitor
from chaos.nemesis import NemesisEvent, NemesisScheduler
from chaos.produce import ProduceWorkload, create_produce_topic, fencing_intervals
from chaos.report import RunReport, write_report
from chaos.scenarios import DATA_PLANE_MIN_BROKERS, DATA_PLANE_SCENARIOS, DYNAMIC_SCENARIOS, SCENARIOS
from chaos.workload import TopicWorkload, WorkloadOptions, describe_all_topics
from kraft.client.quorum import describe_quorum_at
from kraft.cluster.manager import ClusterError
from kraft.errors import KraftError
from kraft.storage.meta_properties import read_meta_properties

Progress = Callable[[str], None]
FINAL_READ_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class RunOptions:
    scenario: str
    seed: int
    duration_s: float
    report_dir: Path
    controllers: int = 3
    brokers: int = 0
    profile: str = "fast"
    recovery_bound_s: float = 30.0
    # None = the pace for the duration (see ``pace_for``), so a CLI run with the same duration replays
    # exactly the fault schedule a test used.
    quiet_s: tuple[float, float] | None = None
    fault_s: tuple[float, float] | None = None
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    # Forward connections dialed on another node's link through the dialer's own (chaos.dialers).
    route_dialers: bool = True

    def pace(self) -> Pace:
        derived = pace_for(self.duration_s)
        return Pace(self.quiet_s or derived.quiet_s, self.fault_s or derived.fault_s)

    def reproduce_command(self) -> str:
        """The ``kraft chaos run`` command line that replays this run's seed (faults and workload)."""
        parts = [
            "kraft chaos run",
            f"--scenario {self.scenario}",
            f"--seed {self.seed}",
            f"--duration {self.duration_s:g}",
        ]
        defaults = RunOptions(self.scenario, self.seed, self.duration_s, self.report_dir)
        if self.controllers != defaults.controllers:
            parts.append(f"--controllers {self.controllers}")
        # The CLI runs one broker by default, unlike RunOptions.
        if self.brokers != CLI_DEFAULT_BROKERS:
            parts.append(f"--brokers {self.brokers}")
        if self.workload.clients != defaults.workload.clients:
            parts.append(f"--clients {self.workload.clients}")
        if self.recovery_bound_s != defaults.recovery_bound_s:
            parts.append(f"--recovery {self.recovery_bound_s:g}")
        if self.pace() != defaults.pace() or self.profile != defaults.profile:
            # Not expressible on the command line: say so rather than print a command that differs.
            parts.append(f"# plus quiet_s={self.pace().quiet_s} fault_s={self.pace().fault_s}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Pace:
    """Nemesis schedule windows: seconds of quiet before each fault, seconds each fault is held."""

    quiet_s: tuple[float, float]
    fault_s: tuple[float, float]


CLI_DEFAULT_BROKERS = 1
SHORT_RUN_S = 12.0
# Short runs (the test suite's) pack several faults into a few seconds; faults still outlast the fast
# profile's election timeout (0.5 s) and often its broker session (3 s), so fencing is exercised.
SHORT_PACE = Pace(quiet_s=(0.3, 0.8), fault_s=(2.0, 3.5))
LONG_PACE = Pace(quiet_s=(1.0, 2.5), fault_s=(2.0, 4.0))


def pace_for(duration_s: float) -> Pace:
    return SHORT_PACE if duration_s <= SHORT_RUN_S else LONG_PACE


@dataclass(slots=True)
class _Collected:
    operations: list[Operation] = field(default_factory=list)
    events: list[NemesisEvent] = field(default_factory=list)
    healed_ns: int = 0
    final: TopicObservation | None = None
    logs: list[NodeLog] = field(default_factory=list)
    broker_ids: list[int] = field(default_factory=list)
    images: list[ImageHashes] = field(default_factory=list)
    broker_of: dict[int, int] = field(default_factory=dict)  # producer process -> broker id
    # broker id -> offsets of its committed registration records (None: no committed log was read)
    registrations: dict[int, list[int]] | None = None
    data_plane: bool = False
    data_final: dict[int, PartitionRead] | None = None  # the data-plane topic read from its final leaders
    replica_logs: list[ReplicaLog] = field(default_factory=list)
    data_broker_of: dict[int, int] = field(default_factory=dict)  # acks=all producer process -> broker
    isr_samples: list[IsrSample] = field(default_factory=list)  # each broker's own view of the data topic
    dynamic: bool = False
    # a dynamic run: voter name -> directory id after the recovery (None: no leader described them), and
    # each controller's own directory id (meta.properties)
    final_voters: dict[str, str] | None = None
    directory_ids: dict[str, str] = field(default_factory=dict)


def _restore_voters(cluster: ChaosCluster, timeout_s: float) -> dict[str, str] | None:
    """After the heal, as an operator would: remove every voter key that is not its controller's
    directory id any more (a wiped disk's), then add back (one at a time) every controller that is not a
    voter, until all are or ``timeout_s`` passes; the voter set then in force (None when no leader
    described it)."""
    deadline = time.monotonic() + timeout_s
    voters: dict[str, str] | None = None
    while True:
        try:
            voters = cluster.voters()
        except KraftError:
            voters = None
        missing = sorted(set(cluster.controller_names) - set(voters or {}))
        stale = sorted(
            (node, directory)
            for node, directory in (voters or {}).items()
            if directory != cluster.directory_id(node)
        )
        if voters is not None and not missing and not stale:
            return voters
        if time.monotonic() >= deadline:
            return voters
        for node, directory in stale:
            with contextlib.suppress(KraftError, ClusterError):
                cluster.remove_voter(node, directory, max(1.0, min(10.0, deadline - time.monotonic())))
        for node in missing if voters is not None else []:
            with contextlib.suppress(KraftError, ClusterError):
                cluster.add_voter(node, max(1.0, min(10.0, deadline - time.monotonic())))
        time.sleep(0.3)


async def _final_topics(cluster: ChaosCluster, deadline: float) -> TopicObservation | None:
    """The topic set according to the active controller, asked directly (not through a proxy)."""
    while time.monotonic() < deadline:
        for node in cluster.controllers:
            answer = await describe_all_topics(cluster.cluster_id, node.target)
            if answer is not None:
                return TopicObservation(f"{node.name} (final)", time.monotonic_ns(), answer[1])
        await asyncio.sleep(0.3)
    return None


def _settled_high_watermark(cluster: ChaosCluster, timeout_s: float) -> int | None:
    """The leader's HWM once every voter's log reaches it (else the last one seen by the deadline)."""
    deadline = time.monotonic() + timeout_s
    seen: int | None = None
    while time.monotonic() < deadline:
        for node in cluster.controllers:
            reply = describe_quorum_at(node.target, 1.0)
            if reply is None or reply.leader_id != node.node_id or reply.high_watermark < 0:
                continue
            seen = int(reply.high_watermark)
            if all(voter.log_end_offset >= seen for voter in reply.current_voters):
                return seen
        time.sleep(0.2)  # poll cadence of this bounded wait
    return seen


def _images(cluster: ChaosCluster, monitor: ClusterMonitor, high_watermark: int) -> list[ImageHashes]:
    """Broker image digests seen during the run, and each controller's log replayed to the same offsets."""
    brokers = [ImageHashes(name, True, by_offset) for name, by_offset in monitor.broker_images.items()]
    offsets = {offset for image in brokers for offset in image.by_offset}
    controllers = [
        ImageHashes(
            node.name, False, image_digests_at(cluster.metadata_log_dir(node), offsets, high_watermark)
        )
        for node in cluster.controllers
    ]
    return [*controllers, *brokers]


def _registrations(cluster: ChaosCluster, high_watermark: int) -> dict[int, list[int]] | None:
    """Each broker's registration records in the committed log (from a controller whose log holds it all).

    Every controller agrees below the HWM (``committed-logs-identical`` checks it), so any complete log
    will do; None when none is complete.
    """
    for node in cluster.controllers:
        directory = cluster.metadata_log_dir(node)
        offsets = [entry.offset for entry in iter_metadata_log(directory)]
        if offsets[:high_watermark] == list(range(high_watermark)):  # every committed offset, from 0
            return broker_registration_offsets(directory, high_watermark)
    return None


async def _exercise(
    options: RunOptions, cluster: ChaosCluster, store: HistoryStore, progress: Progress, collected: _Collected
) -> ClusterMonitor:
    monitor = ClusterMonitor(
        cluster.cluster_id, cluster.controllers, cluster.brokers, disk_of=cluster.directory_id
    )
    pace = options.pace()
    scheduler = NemesisScheduler(
        SCENARIOS[options.scenario](cluster), options.seed, pace.quiet_s, pace.fault_s
    )
    targets = {c.node_id: cluster.client_target(c) for c in cluster.controllers}
    broker_ids = [b.node_id for b in cluster.brokers]
    producers: ProduceWorkload | None = None
    data: DataPlaneWorkload | None = None
    consumers: DataConsumers | None = None
    probe: IsrProbe | None = None
    if options.scenario in DATA_PLANE_SCENARIOS:
        await create_data_topic(cluster.cluster_id, [c.target for c in cluster.controllers])
        proxied = {b.node_id: cluster.client_target(b) for b in cluster.brokers}
        data = DataPlaneWorkload(store, cluster.cluster_id, proxied)
        consumers = DataConsumers(store, cluster.cluster_id, proxied)
        probe = IsrProbe(cluster.cluster_id, {b.node_id: b.target for b in cluster.brokers})
    if broker_ids:
        await create_produce_topic(cluster.cluster_id, [c.target for c in cluster.controllers], broker_ids)
        producers = ProduceWorkload(
            store, cluster.cluster_id, {b.node_id: cluster.client_target(b) for b in cluster.brokers}
        )
    first = await asyncio.to_thread(monitor.poll_once)
    workload = TopicWorkload(
        store, cluster.cluster_id, targets, options.seed, options.workload, first.leader_id
    )
    stop = asyncio.Event()
    watching = asyncio.create_task(monitor.run(stop))
    probing = asyncio.create_task(probe.run(stop)) if probe is not None else None
    try:
        progress(f"running workload and nemeses for {options.duration_s:g} s")
        await asyncio.gather(
            workload.run(options.duration_s),
            producers.run(options.duration_s) if producers is not None else asyncio.sleep(0),
            data.run(options.duration_s) if data is not None else asyncio.sleep(0),
            consumers.run(options.duration_s) if consumers is not None else asyncio.sleep(0),
            scheduler.run(
                options.duration_s, lambda e: progress(f"  {e.action} {e.nemesis}: {e.description}")
            ),
        )
    finally:
        stop.set()
        await watching
        if probing is not None:
            await probing
    collected.events = list(scheduler.events)
    if data is not None and probe is not None:
        collected.data_broker_of = dict(data.broker_of)
        collected.isr_samples = list(probe.samples)
    collected.broker_of = dict(producers.broker_of) if producers is not None else {}
    collected.healed_ns = scheduler.last_heal_ns or time.monotonic_ns()
    progress(f"healed; waiting up to {options.recovery_bound_s:g} s for recovery")
    if cluster.router is not None and cluster.router.rerouted:
        routes = sorted({f"{dialed} -> {used}" for dialed, _, used in cluster.router.rerouted})
        progress(
            f"{len(cluster.router.rerouted)} connections dialed on another node's link were sent through "
            f"the dialer's own link: {', '.join(routes)}"
        )
    brokers = [b.node_id for b in cluster.brokers]
    collected.broker_ids = brokers
    await monitor.wait_for(
        lambda s: s.leader_id is not None and all(s.fenced.get(b) is False for b in brokers),
        options.recovery_bound_s,
    )
    if collected.dynamic:
        progress("restoring every controller to the voter set")
        collected.final_voters = await asyncio.to_thread(_restore_voters, cluster, options.recovery_bound_s)
        collected.directory_ids = {
            c.name: read_meta_properties(cluster.metadata_log_dir(c)).directory_id
            for c in cluster.controllers
        }
    return monitor


async def run_scenario(options: RunOptions, progress: Progress) -> RunReport:
    if options.scenario in DATA_PLANE_SCENARIOS and options.brokers < DATA_PLANE_MIN_BROKERS:
        raise ValueError(
            f"scenario {options.scenario} needs at least {DATA_PLANE_MIN_BROKERS} brokers "
            f"(replication factor 3), got {options.brokers}"
        )
    report_dir = options.report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    store = await HistoryStore.create(report_dir / HISTORY_FILE)
    await store.set_meta("scenario", options.scenario)
    await store.set_meta("seed", options.seed)
    await store.set_meta("reproduce", options.reproduce_command())
    dynamic = options.scenario in DYNAMIC_SCENARIOS
    collected = _Collected(data_plane=options.scenario in DATA_PLANE_SCENARIOS, dynamic=dynamic)
    cluster = ChaosCluster(
        report_dir / "work",
        controllers=options.controllers,
        brokers=options.brokers,
        profile=options.profile,
        proxy_seed=options.seed,
        route_dialers=options.route_dialers,
        dynamic=dynamic,
        overrides=DATA_PLANE_OVERRIDES if options.scenario in DATA_PLANE_SCENARIOS else None,
    )
    monitor: ClusterMonitor | None = None
    high_watermark: int | None = None
    try:
        progress(
            f"[{options.scenario}] starting {options.controllers} controllers, {options.brokers} brokers "
            "with every link proxied"
        )
        await asyncio.to_thread(cluster.start)
        monitor = await _exercise(options, cluster, store, progress, collected)
        collected.final = await _final_topics(cluster, time.monotonic() + FINAL_READ_TIMEOUT_S)
        if collected.data_plane:
            progress("reading the replicated topic from its final leaders")
            direct = {b.node_id: b.target for b in cluster.brokers}
            collected.data_final = await read_final(cluster.cluster_id, direct, FINAL_READ_TIMEOUT_S)
        high_watermark = await asyncio.to_thread(_settled_high_watermark, cluster, SETTLE_TIMEOUT_S)
    finally:
        progress("stopping the cluster")
        await asyncio.to_thread(cluster.stop)
        await store.close()
    collected.operations = store.history.operations()
    if cluster.cluster is not None and high_watermark is not None:
        collected.logs = [
            node_log(node.node_id, cluster.metadata_log_dir(node), high_watermark)
            for node in cluster.controllers
        ]
        if monitor is not None:
            collected.images = _images(cluster, monitor, high_watermark)
        collected.registrations = _registrations(cluster, high_watermark)
    if cluster.cluster is not None and collected.data_plane:
        data_dirs = {b.node_id: cluster.metadata_log_dir(b) for b in cluster.brokers}
        collected.replica_logs = await asyncio.to_thread(read_replica_logs, data_dirs)
    verdicts = run_checkers(options, collected, monitor)
    report = RunReport(
        scenario=options.scenario,
        seed=options.seed,
        duration_s=options.duration_s,
        started_unix=started,
        verdicts=verdicts,
        operations=collected.operations,
        nemesis_events=collected.events,
        leaders=monitor.leaders if monitor else [],
        samples=monitor.samples if monitor else [],
        healed_ns=collected.healed_ns,
        reproduce=options.reproduce_command(),
    )
    write_report(report, report_dir)
    return report


def run_checkers(options: RunOptions, collected: _Collected, monitor: ClusterMonitor | None) -> list[Verdict]:
    ops = collected.operations
    # Answers served from one controller's image (reads, "already exists") are not claimed linearizable.
    model = TopicModel(check_rejections=False, check_reads=False)
    topic_ops = [op for op in ops if op.f in ("create", "delete", "read")]
    verdicts = [check_linearizable(topic_ops, model)]
    if collected.final is not None:
        verdicts.append(check_no_lost_acknowledged(ops, collected.final))
        verdicts.append(check_no_failed_visible(ops, [collected.final]))
    else:
        verdicts.append(unknown("no-lost-acknowledged", "no controller answered the final topic read"))
    verdicts.append(check_committed_logs_identical(collected.logs))
    if collected.broker_ids:
        verdicts.append(check_images_match(collected.images))
    if collected.data_plane:
        if collected.data_final is None:
            for checker in (
                "acks-all-at-their-offsets",
                "replicas-identical-below-hwm",
                "consumed-records-in-final-log",
            ):
                verdicts.append(
                    unknown(checker, "no partition reached a leader with a whole ISR after the heal")
                )
        else:
            verdicts.append(check_acknowledged_at_their_offsets(ops, collected.data_final))
            verdicts.append(check_replicas_identical_below_hwm(collected.replica_logs, collected.data_final))
            verdicts.append(check_consumed_in_final_log(ops, collected.data_final))
        intervals = under_min_isr_intervals(collected.isr_samples, DATA_MIN_INSYNC_REPLICAS)
        verdicts.append(
            check_acks_all_refused_under_min_isr(
                ops, intervals, collected.data_broker_of, DATA_MIN_INSYNC_REPLICAS
            )
        )
        verdicts.append(check_refused_never_written(ops, collected.replica_logs))
    if collected.dynamic:
        verdicts.append(check_voters_restored(collected.final_voters, collected.directory_ids))
    if monitor is not None:
        verdicts.append(check_single_leader_per_epoch(monitor.leaders))
        if collected.broker_of and collected.registrations is None:
            verdicts.append(
                unknown(
                    "fenced-broker-never-acks",
                    "no complete committed log to tell one fence from the next (see fencing_intervals)",
                )
            )
        elif collected.broker_of:
            fencing = fencing_intervals(monitor.samples, collected.registrations)
            verdicts.append(check_fenced_broker_never_acked(ops, fencing, collected.broker_of))
        verdicts.append(
            check_liveness_after_heal(
                monitor.samples, collected.healed_ns, collected.broker_ids, options.recovery_bound_s
            )
        )
    return verdicts


def check_voters_restored(voters: dict[str, str] | None, directory_ids: dict[str, str]) -> Verdict:
    """A dynamic run ends with every controller a voter again under the directory id of its own
    metadata directory (voter changes stay possible after the faults, and no stale voter key lingers)."""
    name = "voters-restored"
    if voters is None:
        return unknown(name, "no leader described the voter set after the recovery")
    wrong = sorted(
        f"{node}: voter {voters.get(node, 'missing')}, directory {directory}"
        for node, directory in directory_ids.items()
        if voters.get(node) != directory
    )
    extra = sorted(set(voters) - set(directory_ids))
    if wrong or extra:
        return failed(name, "the voter set is not every controller", [*wrong, *extra], voters=voters)
    return passed(name, f"{len(voters)} voters, each with its own directory id", voters=voters)


def failed_verdicts(report: RunReport) -> list[Verdict]:
    return [v for v in report.verdicts if v.status is Status.FAIL]
