"""Spark transformations from decoded metadata-log rows to the report's tables.

Input: the reader's rows for ``__cluster_metadata`` (``offset``, ``leader_epoch``, ``timestamp_ms``,
``is_control``, ``record_type``, ``record_json``).  Every table is computed with DataFrame operations —
per-entity windows ordered by offset — so the report scales with the log, not with driver memory.
Durations use record timestamps (ms); ordering always uses offsets (timestamps may tie).

States shown for brokers follow ``kraft broker list``: FENCED, ACTIVE, CONTROLLED_SHUTDOWN, OFFLINE,
plus UNREGISTERED.  The log records "fenced", not why; the CLI shows a fenced broker as FENCED while it
still heartbeats (registered and catching up) and OFFLINE once its session is gone.  So a broker that
registers fenced is FENCED, and one fenced after it was unfenced is OFFLINE: the controller fences an
active broker when its session expires or when its controlled shutdown completes (the process then
exits).  The one exception, a live broker that asks to be fenced because it fell behind, cannot be told
apart in the log and is shown OFFLINE too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Bucket widths for "record types over time", smallest first; the first giving <= 60 buckets wins.
_BUCKETS_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 3_600_000, 21_600_000, 86_400_000)
MAX_BUCKETS = 60


def _json(path: str) -> Column:
    from pyspark.sql import functions as F

    return F.get_json_object(F.col("record_json"), f"$.{path}")


def choose_bucket_ms(span_ms: int) -> int:
    for width in _BUCKETS_MS:
        if span_ms // width < MAX_BUCKETS:
            return width
    return _BUCKETS_MS[-1] * (span_ms // (_BUCKETS_MS[-1] * MAX_BUCKETS) + 1)


def controller_epochs(rows: DataFrame, log_end_ms: int) -> DataFrame:
    """One row per leader epoch: leader id (from its LeaderChange record), first/last offset, records,
    tenure start/end and duration.  A tenure ends where the next epoch's first record is."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    leader_changes = rows.where(F.col("record_type") == "LeaderChange").select(
        F.col("leader_epoch").alias("epoch"),
        _json("leader_id").cast("int").alias("leader_id"),
        F.col("offset").alias("change_offset"),
    )
    first_change = leader_changes.groupBy("epoch").agg(
        F.min_by("leader_id", "change_offset").alias("leader_id")
    )
    per_epoch = rows.groupBy(F.col("leader_epoch").alias("epoch")).agg(
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        F.count(F.lit(1)).alias("records"),
        F.min_by("timestamp_ms", "offset").alias("start_ms"),
    )
    by_epoch = Window.orderBy("epoch")
    return (
        per_epoch.join(first_change, "epoch", "left")
        .withColumn("end_ms", F.coalesce(F.lead("start_ms").over(by_epoch), F.lit(log_end_ms)))
        .withColumn("tenure_ms", F.col("end_ms") - F.col("start_ms"))
        .withColumn("is_current", F.lead("epoch").over(by_epoch).isNull())
        .select(
            "epoch",
            "leader_id",
            "first_offset",
            "last_offset",
            "records",
            "start_ms",
            "end_ms",
            "tenure_ms",
            "is_current",
        )
        .orderBy("epoch")
    )


def broker_events(rows: DataFrame) -> DataFrame:
    """Every broker lifecycle record as (broker_id, offset, timestamp_ms, event, state, broker_epoch)."""
    from pyspark.sql import functions as F

    record_type = F.col("record_type")
    broker_id = (
        F.when(record_type.isin("FenceBrokerRecord", "UnfenceBrokerRecord"), _json("id"))
        .otherwise(_json("broker_id"))
        .cast("int")
    )
    broker_epoch = (
        F.when(record_type.isin("FenceBrokerRecord", "UnfenceBrokerRecord"), _json("epoch"))
        .otherwise(_json("broker_epoch"))
        .cast("bigint")
    )
    fenced_change = _json("fenced").cast("int")
    shutdown_change = _json("in_controlled_shutdown").cast("int")
    event = (
        F.when(record_type == "RegisterBrokerRecord", F.lit("registered"))
        .when(record_type == "UnregisterBrokerRecord", F.lit("unregistered"))
        .when(record_type == "FenceBrokerRecord", F.lit("fenced"))
        .when(record_type == "UnfenceBrokerRecord", F.lit("unfenced"))
        .when((record_type == "BrokerRegistrationChangeRecord") & (fenced_change == 1), F.lit("fenced"))
        .when(
            (record_type == "BrokerRegistrationChangeRecord") & (shutdown_change == 1),
            F.lit("controlled_shutdown"),
        )
        .when((record_type == "BrokerRegistrationChangeRecord") & (fenced_change == -1), F.lit("unfenced"))
    )
    state = (
        F.when(
            F.col("event") == "registered", F.when(F.col("registered_fenced"), "FENCED").otherwise("ACTIVE")
        )
        .when(F.col("event") == "unregistered", F.lit("UNREGISTERED"))
        .when(F.col("event") == "fenced", F.lit("OFFLINE"))
        .when(F.col("event") == "unfenced", F.lit("ACTIVE"))
        .when(F.col("event") == "controlled_shutdown", F.lit("CONTROLLED_SHUTDOWN"))
    )
    return (
        rows.where(
            record_type.isin(
                "RegisterBrokerRecord",
                "UnregisterBrokerRecord",
                "FenceBrokerRecord",
                "UnfenceBrokerRecord",
                "BrokerRegistrationChangeRecord",
            )
        )
        .select(
            broker_id.alias("broker_id"),
            "offset",
            "timestamp_ms",
            event.alias("event"),
            broker_epoch.alias("broker_epoch"),
            "source",
            (_json("fenced") == "true").alias("registered_fenced"),
        )
        .where(F.col("event").isNotNull())  # e.g. a log-dir-only registration change
        .withColumn("state", state)
        .select("broker_id", "offset", "timestamp_ms", "event", "state", "broker_epoch", "source")
    )


def broker_states(events: DataFrame, log_end_ms: int) -> DataFrame:
    """Per broker, the intervals spent in each state: [start_ms, end_ms) with duration; the last one is
    open (``is_open``) and runs to the log's newest timestamp."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_broker = Window.partitionBy("broker_id").orderBy("offset")
    return (
        events.withColumn("next_ms", F.lead("timestamp_ms").over(per_broker))
        .select(
            "broker_id",
            "state",
            F.col("event").alias("entered_by"),
            F.col("offset").alias("start_offset"),
            F.col("timestamp_ms").alias("start_ms"),
            F.coalesce("next_ms", F.lit(log_end_ms)).alias("end_ms"),
            F.col("next_ms").isNull().alias("is_open"),
        )
        .withColumn("duration_ms", F.col("end_ms") - F.col("start_ms"))
    )


def partition_leader_events(rows: DataFrame) -> DataFrame:
    """Leader assignments and changes: (topic, topic_id, partition, offset, timestamp_ms, leader,
    previous_leader, change) where change is created / elected / offline / recovered / removed."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    topics = (
        rows.where(F.col("record_type") == "TopicRecord")
        .select(_json("topic_id").alias("topic_id"), _json("name").alias("topic"))
        .dropDuplicates(["topic_id"])
    )
    assignments = (
        rows.where(F.col("record_type").isin("PartitionRecord", "PartitionChangeRecord"))
        .select(
            _json("topic_id").alias("topic_id"),
            _json("partition_id").cast("int").alias("partition"),
            "offset",
            "timestamp_ms",
            _json("leader").cast("int").alias("leader"),
            (F.col("record_type") == "PartitionRecord").alias("is_creation"),
        )
        .where(F.col("leader").isNotNull())
    )  # a change that leaves the leader alone
    removals = rows.where(F.col("record_type") == "RemoveTopicRecord").select(
        _json("topic_id").alias("topic_id"),
        F.col("offset").alias("removed_offset"),
        F.col("timestamp_ms").alias("removed_ms"),
    )
    per_partition = Window.partitionBy("topic_id", "partition").orderBy("offset")
    with_previous = assignments.withColumn("previous_leader", F.lag("leader").over(per_partition))
    change = (
        F.when(F.col("is_creation"), F.lit("created"))
        .when(F.col("leader") == -1, F.lit("offline"))
        .when(F.col("previous_leader") == -1, F.lit("recovered"))
        .otherwise(F.lit("elected"))
    )
    leader_changes = with_previous.where(
        F.col("is_creation")
        | F.col("previous_leader").isNull()
        | (F.col("leader") != F.col("previous_leader"))
    ).withColumn("change", change)
    partitions = assignments.select("topic_id", "partition").distinct()
    removed = partitions.join(removals, "topic_id").select(
        "topic_id",
        "partition",
        F.col("removed_offset").alias("offset"),
        F.col("removed_ms").alias("timestamp_ms"),
        F.lit(None).cast("int").alias("leader"),
        F.lit(None).cast("int").alias("previous_leader"),
        F.lit("removed").alias("change"),
    )
    return (
        leader_changes.select(
            "topic_id", "partition", "offset", "timestamp_ms", "leader", "previous_leader", "change"
        )
        .unionByName(removed)
        .join(topics, "topic_id", "left")
        .select(
            "topic", "topic_id", "partition", "offset", "timestamp_ms", "leader", "previous_leader", "change"
        )
    )


def offline_intervals(leader_events: DataFrame, log_end_ms: int) -> DataFrame:
    """Intervals where a partition had no leader (-1): from the change that made it offline to the next
    leader change (or the log's newest timestamp, ``is_open``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_partition = Window.partitionBy("topic_id", "partition").orderBy("offset")
    return (
        leader_events.withColumn("next_ms", F.lead("timestamp_ms").over(per_partition))
        .withColumn("next_change", F.lead("change").over(per_partition))
        .where(F.col("leader") == -1)
        .select(
            "topic",
            "topic_id",
            "partition",
            F.col("offset").alias("start_offset"),
            F.col("timestamp_ms").alias("start_ms"),
            F.coalesce("next_ms", F.lit(log_end_ms)).alias("end_ms"),
            F.col("next_ms").isNull().alias("is_open"),
            F.col("next_change").alias("ended_by"),
        )
        .withColumn("duration_ms", F.col("end_ms") - F.col("start_ms"))
    )


def record_type_counts(rows: DataFrame, bucket_ms: int) -> DataFrame:
    """Records per type per time bucket (bucket_start_ms = floor(ts / bucket) * bucket)."""
    from pyspark.sql import functions as F

    bucket = (F.floor(F.col("timestamp_ms") / F.lit(bucket_ms)) * F.lit(bucket_ms)).cast("bigint")
    return (
        rows.where(F.col("source") == "log")
        .groupBy(
            bucket.alias("bucket_start_ms"), F.coalesce("record_type", F.lit("Unknown")).alias("record_type")
        )
        .agg(F.count(F.lit(1)).alias("records"))
        .orderBy("bucket_start_ms", "record_type")
    )
