"""CreatePartitions on the active controller (Kafka's ``ReplicationControlManager.createPartitions``).

A topic only grows: ``count`` is the new total and must be larger than the current one (INVALID_PARTITIONS
otherwise, as in Kafka).  The request's shape is bounded before any placement — ``max.request.topics``
topics and ``max.request.partitions`` new partitions in all (POLICY_VIOLATION), a count above
``MAX_PARTITIONS_PER_TOPIC`` or whose partition directory names would not fit (INVALID_PARTITIONS) — then
the new partitions are placed exactly like a new topic's (what :func:`kraft.metadata.placement.place_replicas`
places over the unfenced brokers not shutting down, from the order the logic keeps per broker map, with
the topic's replication factor, rack-aware), checked
against ``max.partitions`` / ``max.broker.partitions`` (counting the partitions reserved by topics still
being created: :mod:`kraft.metadata.partition_reservations`), and written as PartitionRecords with ids
from the current count up.  Brokers see new partitions in their metadata delta and create (lead or
follow) them.
"""

from __future__ import annotations

from collections import Counter

from kraft.errors import ErrorCode, KraftError
from kraft.metadata.controller_logic import ControllerLogic, Outcome, _Batch, error_response
from kraft.metadata.placement import place_ordered_range
from kraft.metadata.request_limits import MAX_PARTITIONS_PER_TOPIC, RequestLimits
from kraft.metadata.topic_rules import check_partition_dir_names, check_partition_limits
from kraft.v1 import controller_pb2 as cpb


def check_create_partitions(
    req: cpb.CreatePartitionsRequest, limits: RequestLimits, current_count: dict[str, int]
) -> None:
    """``max.request.topics`` topics and ``max.request.partitions`` new partitions (by the current counts in
    ``current_count``; an unknown topic or a count that does not grow adds nothing) — before any work."""
    if len(req.topics) > limits.max_topics:
        raise KraftError(
            ErrorCode.POLICY_VIOLATION,
            f"CreatePartitions names {len(req.topics)} topics; the limit is {limits.max_topics} "
            "(max.request.topics)",
        )
    total = 0
    for topic in req.topics:
        if 0 < topic.count <= MAX_PARTITIONS_PER_TOPIC:
            total += max(0, topic.count - current_count.get(topic.name, topic.count))
        if total > limits.max_partitions:
            raise KraftError(
                ErrorCode.POLICY_VIOLATION,
                f"CreatePartitions adds more than {limits.max_partitions} partitions; the limit is "
                f"{limits.max_partitions} (max.request.partitions)",
            )


def create_partitions(
    logic: ControllerLogic, req: cpb.CreatePartitionsRequest, next_offset: int
) -> Outcome[cpb.CreatePartitionsResponse]:
    response = cpb.CreatePartitionsResponse()
    image = logic.image
    try:
        logic.check_cluster_id(req.cluster_id)
        if len(req.topics) <= logic.settings.request_limits.max_topics:
            counts = {}
            for topic in req.topics:
                found = image.topic(topic.name)
                if found is not None:
                    counts[topic.name] = len(found.partitions)
        else:
            counts = {}
        check_create_partitions(req, logic.settings.request_limits, counts)
    except KraftError as exc:
        return Outcome([], error_response(response, exc.code, exc.message))
    names = Counter(t.name for t in req.topics)
    batch = _Batch(logic, next_offset, values=[])  # the new PartitionRecords encoded as built
    cluster_partitions, hosted = logic._placement_counts()
    reserved = logic.reservations
    cursor = cluster_partitions
    added: Counter[int] = Counter()
    # the usable brokers rack-alternated, kept by the logic per broker map (not sorted per request)
    ordered, racks = logic._placement_order()
    for topic in req.topics:
        result = response.topics.add(name=topic.name)
        try:
            if names[topic.name] > 1:
                raise KraftError(ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} appears more than once")
            found = image.topic(topic.name)
            if found is None:
                raise KraftError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic.name!r} does not exist")
            if logic.creating(found.topic_id):
                raise KraftError(
                    ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} is still being created; retry"
                )
            current = len(found.partitions)
            if topic.count <= current:
                raise KraftError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {topic.name!r} has {current} partitions; the new count must be larger "
                    f"(partitions can only be added), got {topic.count}",
                )
            if topic.count > MAX_PARTITIONS_PER_TOPIC:
                raise KraftError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"number of partitions must be at most {MAX_PARTITIONS_PER_TOPIC}, got {topic.count}",
                )
            check_partition_dir_names(topic.name, topic.count)
            new = topic.count - current
            factor = len(found.partitions[0].replicas) if found.partitions else 1
            # the limits by count first (costs nothing), then by broker once placed; partitions of topics
            # still being created count as if they existed (reserved)
            check_partition_limits(
                topic.name,
                new,
                cursor,
                logic.settings.max_partitions,
                {},
                lambda b: 0,
                1,
                reserved.partitions,
            )
            if factor > len(ordered):
                raise KraftError(
                    ErrorCode.INVALID_REPLICATION_FACTOR, logic.too_few_brokers(factor, len(ordered))
                )
            # what place_replicas(usable brokers, new, factor, cursor) places
            assignment = place_ordered_range(ordered, racks, 0, new, factor, cursor)
            by_broker = Counter(b for replicas in assignment for b in replicas)
            check_partition_limits(
                topic.name,
                new,
                cursor,
                logic.settings.max_partitions,
                by_broker,
                lambda b: hosted.get(b, 0) + added.get(b, 0),
                logic.settings.max_broker_partitions,
                reserved.partitions,
                reserved.replicas_on,
            )
            logic.check_some_replica_acceptable(assignment)
        except KraftError as exc:
            error_response(result, exc.code, exc.message)
            continue
        for offset, replicas in enumerate(assignment):
            result.assignments.add(partition=current + offset, broker_ids=replicas)
        cursor += new
        added.update(by_broker)
        if not req.validate_only:
            logic.add_partition_records(batch, found.topic_id, current, assignment)
    return batch.outcome(response)
