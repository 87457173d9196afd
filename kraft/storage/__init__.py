"""kraft storage: Kafka-format record batches, segmented logs, snapshots and durable state files.

See ``docs/internals/storage.md`` for the API and invariants.
"""
