"""The metadata fetcher: long-polls MetadataFetch on the active controller and feeds the publisher.

Loop: ask for committed records from ``applied offset + 1``; replay them into a
:class:`~kraft.metadata.delta.MetadataDelta` built on the current image; publish when the delta is not
inside a metadata transaction (a transaction that spans responses keeps its delta open until its End
record arrives, so a half-applied transaction is never visible).  When the controller answers with a
``snapshot_id`` (the broker is below its log start), the snapshot is downloaded chunk by chunk, replayed
into an empty image, published as a whole, and fetching continues at its end offset.

A record that cannot be decoded, or that does not fit the image (a change for an unknown topic, …), stops
the fetcher with the error — the broker's supervisor then stops the process with one ``event=fatal`` line
(``reason=task_failed``): applying around a committed record would silently diverge from the controllers
(issue #14).  Nothing of such a response is published.

With ``voters`` (the broker passes its :class:`~kraft.client.controller.ControllerClient`), each fetch names
the version of the voter set this broker holds (``known_voters``); an active controller of a dynamic quorum
answers with its voter set when it has a newer one, and the fetcher hands it over: it becomes the client's
rotation (KIP-853: a broker knows every voter, not only its bootstrap servers, as Kafka's brokers learn
it from the log they replicate).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kraft.broker import heap
from kraft.broker.publisher import MetadataPublisher
from kraft.client.controller import ControllerClient, ControllerUnavailable
from kraft.clock import CHECK_EVERY, DEFAULT_WORK_UNIT_MS, Clock, Deadline, run_paced
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.change_decode import ReplayRecord, decode_replay_values
from kraft.metadata.delta import MetadataDelta, unreplayable
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import decode_value
from kraft.observability.logging import get_logger
from kraft.observability.metrics import BrokerMetrics
from kraft.v1 import controller_pb2 as cpb


@dataclass(frozen=True, slots=True)
class FetcherTimings:
    max_wait_ms: int
    request_timeout_s: float
    retry_backoff_s: float = 0.1
    max_backoff_s: float = 1.0


class VoterSetSink(Protocol):
    """Who takes the voter sets controllers send (:class:`~kraft.client.controller.ControllerClient`)."""

    @property
    def voter_set_version(self) -> tuple[int, int]: ...

    @property
    def voter_set(self) -> dict[int, str]: ...

    def learn_voter_set(self, voters: cpb.QuorumVoters) -> bool: ...


class SnapshotChanged(Exception):
    """The controller switched to another snapshot while this one was being downloaded."""


class MetadataFetcher:
    def __init__(
        self,
        broker_id: int,
        cluster_id: str,
        client: ControllerClient,
        publisher: MetadataPublisher,
        timings: FetcherTimings,
        on_applied: Callable[[int], None],
        *,
        clock: Clock,
        on_drained: Callable[[int], None] = lambda generation: None,
        generation: Callable[[], int] = lambda: 0,
        metrics: BrokerMetrics | None = None,
        rng: random.Random | None = None,
        voters: VoterSetSink | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._cluster_id = cluster_id
        self._client = client
        self._publisher = publisher
        self._timings = timings
        self._clock = clock
        self._on_applied = on_applied
        self._on_drained = on_drained
        self._generation = generation
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._voters = voters
        self._pending: MetadataDelta | None = None
        self._fetch_offset = publisher.offset + 1
        self.high_watermark = -1
        self.snapshots_loaded = 0
        self.last_snapshot_replay_s = 0.0  # download + decode + replay of the last snapshot (bench, logs)
        self._log = get_logger("broker.fetcher", node=broker_id)

    @property
    def fetch_offset(self) -> int:
        return self._fetch_offset

    def resume_from_publisher(self) -> None:
        """Fetch next from the publisher's image (e.g. after it loaded the image store)."""
        if self._pending is None:
            self._fetch_offset = self._publisher.offset + 1

    async def run(self) -> None:
        """Fetch and publish until cancelled."""
        self.resume_from_publisher()
        attempt = 0
        while True:
            ok = await self.fetch_once()
            if ok:
                attempt = 0
                continue
            base = self._timings.retry_backoff_s * (2.0 ** min(attempt, 10))
            await asyncio.sleep(min(base, self._timings.max_backoff_s) * (0.5 + self._rng.random() / 2))
            attempt += 1

    async def fetch_once(self) -> bool:
        """One MetadataFetch round trip (plus a snapshot download if asked); False on a retryable error.

        ``on_drained(generation)`` reports that everything committed when this fetch was answered has
        been applied; ``generation`` is the caller's counter read when the fetch was sent.
        """
        request = cpb.MetadataFetchRequest(
            cluster_id=self._cluster_id,
            broker_id=self._broker_id,
            fetch_offset=self._fetch_offset,
            max_wait_ms=self._timings.max_wait_ms,
        )
        if self._voters is not None:
            epoch, offset = self._voters.voter_set_version
            request.known_voters.SetInParent()  # present even at (0, 0): "send me a newer one"
            request.known_voters.leader_epoch, request.known_voters.offset = epoch, offset
        generation = self._generation()
        response = await self._call(request)
        if response is None:
            return False
        self._note_high_watermark(response.high_watermark)
        drained = not response.records or response.records[-1].offset + 1 >= response.high_watermark
        if response.HasField("snapshot_id") and not response.records:
            try:
                image = await self._download_snapshot(response.snapshot_id)
            except SnapshotChanged as err:
                self._log.warning("snapshot_restarted", reason=str(err))
                return False
            if image is None:
                return False
            self._pending = None
            await self._publisher.load_snapshot(image)
            heap.settle()  # the new image (and the states it made) out of later full collections
            self.snapshots_loaded += 1
            self._fetch_offset = response.snapshot_id.end_offset
            self._on_applied(self._publisher.offset)
            return True
        if not response.records:
            if self._pending is None:
                self._on_drained(generation)
            return True
        delta = self._pending or MetadataDelta(self._publisher.image)
        undecodable = await self._replay(response.records, delta)
        error = unreplayable("metadata", response.records[-1].offset, undecodable, list(delta.replay_errors))
        if error is not None:
            if self._metrics is not None:
                self._metrics.metadata_apply_errors.inc(len(undecodable) + len(delta.replay_errors))
            self._log.error("metadata_replay_failed", error=error.message)
            raise error
        self._fetch_offset = response.records[-1].offset + 1
        if delta.in_transaction:
            self._pending = delta
            return True
        self._pending = None
        await self._publisher.publish(delta, response.records[-1].append_time_ms)
        self._on_applied(self._publisher.offset)
        if drained:
            self._on_drained(generation)
        return True

    async def _replay(
        self, records: Sequence[cpb.CommittedRecord], delta: MetadataDelta
    ) -> list[tuple[int, str]]:
        """Replay ``records`` into ``delta`` (offset and epoch: the last record's); the (offset, error) of
        each that did not decode (left out, the rest replayed: the caller fails on any).

        Decoded in pieces of ``CHECK_EVERY`` records (the budget looked at after each, as before) by
        ``decode_replay_values``, as a follower controller's replay does: the common
        PartitionChangeRecord (a controlled shutdown's) and new PartitionRecord (a CreateTopics') read
        without upb, the rest through it — the same records and errors as ``decode_value`` record by
        record (a piece holding a bad value is redone that way, for the offsets).  A response holds up
        to 10,000 records: replayed in slices of at most the work-unit time budget, so this broker's
        heartbeats and replica fetches run between."""
        undecodable: list[tuple[int, str]] = []
        values = [record.value for record in records]
        deadline = Deadline(self._clock, DEFAULT_WORK_UNIT_MS)
        for start in range(0, len(values), CHECK_EVERY):
            piece = values[start : start + CHECK_EVERY]
            decoded: list[ReplayRecord]
            try:
                decoded = list(decode_replay_values(piece))
            except KraftError:
                decoded = []
                for index, value in enumerate(piece, start):
                    try:
                        decoded.append(decode_value(value))
                    except KraftError as exc:
                        undecodable.append((records[index].offset, exc.message))
            # A ClearElrRecord may clear thousands of partitions: replayed in steps, the budget looked at
            # after each (and after each piece).
            for _ in delta.replay_decoded_steps(decoded):
                if deadline.expired():
                    await asyncio.sleep(0)
                    deadline = Deadline(self._clock, DEFAULT_WORK_UNIT_MS)
            if deadline.expired():
                await asyncio.sleep(0)
                deadline = Deadline(self._clock, DEFAULT_WORK_UNIT_MS)
        # What replaying record by record leaves (only apply() reads them: no record looks at either).
        last = records[-1]
        if last.offset >= 0:
            delta.offset = last.offset
        if last.leader_epoch >= 0:
            delta.epoch = last.leader_epoch
        return undecodable

    async def _download_snapshot(self, snapshot: cpb.SnapshotRef) -> MetadataImage | None:
        """Every record of ``snapshot`` replayed into an empty image (None on a retryable error).

        The next chunk is requested before the current one is replayed, so the controller serializes
        and sends chunk n+1 while this process decodes chunk n.
        """
        self._log.info("snapshot_download", end_offset=snapshot.end_offset, epoch=snapshot.epoch)
        started_ms = self._clock.monotonic_ms()
        records = 0
        delta = MetadataDelta(MetadataImage.empty())
        last_offset = snapshot.end_offset - 1
        pending = asyncio.create_task(self._call(self._snapshot_request(snapshot, 0)))
        try:
            position = 0
            while True:
                response = await pending
                if response is None:
                    return None
                if response.snapshot_id != snapshot:
                    raise SnapshotChanged(
                        f"asked for snapshot {snapshot.end_offset}-{snapshot.epoch}, "
                        f"got {response.snapshot_id.end_offset}-{response.snapshot_id.epoch}"
                    )
                if not response.snapshot_done:
                    if response.next_snapshot_position <= position:
                        raise SnapshotChanged(f"snapshot position did not advance from {position}")
                    position = response.next_snapshot_position
                    pending = asyncio.create_task(self._call(self._snapshot_request(snapshot, position)))
                delta.replay_values(response.snapshot_records, last_offset, snapshot.epoch)
                records += len(response.snapshot_records)
                # What the chunks built so far is frozen: the full collections the heap's growth sets
                # off during the download walk only what is newer, not the image so far (kraft.broker.heap).
                heap.settle()
                await asyncio.sleep(0)  # one chunk at a time: heartbeats and serving run in between
                if response.snapshot_done:
                    error = unreplayable(
                        f"snapshot {snapshot.end_offset}-{snapshot.epoch}",
                        last_offset,
                        [],
                        delta.replay_errors,
                    )
                    if error is not None:
                        self._log.error("metadata_replay_failed", error=error.message)
                        raise error
                    # Built in steps, the loop turning between them (a million partitions: ~50-80 ms in
                    # one go, 100,000 small topics ~0.7 s); nothing sees it before it is returned.
                    image = await run_paced(delta.apply_steps(), self._clock, DEFAULT_WORK_UNIT_MS)
                    self.last_snapshot_replay_s = (self._clock.monotonic_ms() - started_ms) / 1000
                    took_s = round(self.last_snapshot_replay_s, 3)
                    self._log.info("snapshot_replayed", records=records, took_s=took_s)
                    return image
        finally:
            if not pending.done():
                pending.cancel()

    def _snapshot_request(self, snapshot: cpb.SnapshotRef, position: int) -> cpb.MetadataFetchRequest:
        return cpb.MetadataFetchRequest(
            cluster_id=self._cluster_id,
            broker_id=self._broker_id,
            fetch_offset=self._fetch_offset,
            max_wait_ms=0,
            snapshot_id=snapshot,
            snapshot_position=position,
        )

    async def _call(self, request: cpb.MetadataFetchRequest) -> cpb.MetadataFetchResponse | None:
        # An attempt must outlast the long poll; the call leaves room for one more request after a full
        # attempt timed out (to ask another voter who is active), then gives up to this loop's backoff.
        attempt_s = request.max_wait_ms / 1000.0 + self._timings.request_timeout_s
        try:
            response = await self._client.call(
                lambda stub: stub.MetadataFetch,
                request,
                attempt_s + self._timings.request_timeout_s,
                attempt_timeout_s=attempt_s,
            )
        except ControllerUnavailable as err:
            self._log.debug("metadata_fetch_unavailable", reason=str(err))
            return None
        code = ErrorCode.from_wire(response.error_code)
        if code is not ErrorCode.NONE:
            self._log.warning("metadata_fetch_error", code=code.name, message=response.error_message)
            return None
        voters = self._voters
        if voters is not None and response.HasField("voters") and voters.learn_voter_set(response.voters):
            version = response.voters.version
            self._log.info(
                "controller_voters_learned",
                voters=",".join(f"{node_id}@{target}" for node_id, target in voters.voter_set.items()),
                leader_epoch=version.leader_epoch,
                offset=version.offset,
            )
        return response

    def _note_high_watermark(self, high_watermark: int) -> None:
        self.high_watermark = max(self.high_watermark, high_watermark)
        if self._metrics is not None and high_watermark >= 0:
            self._metrics.metadata_lag_records.set(max(0, high_watermark - 1 - self._publisher.offset))
