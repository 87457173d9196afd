"""Partition replication rules, pure: no IO, no clock, no event loop (issue #16).

Theory of operation
-------------------
Each module is a small deterministic rule set lifted from Kafka's ReplicaManager / Partition /
AbstractFetcherThread / ReplicationControlManager, written the way :mod:`kraft.raft`'s core is: events in
(a follower's fetch, an append, a metadata update, an AlterPartition answer, ``now_ms``), decisions out
(errors, the high watermark, the ISR change to propose, the produce requests to answer). The broker and
controller shells that call them do the IO.

- :mod:`~kraft.replication.epochs` — the leader-epoch entries of a log (epoch → start offset) and
  OffsetsForLeaderEpoch as the leader answers it (KIP-101), plus the Fetch-side divergence check.
- :mod:`~kraft.replication.truncation` — where a follower truncates, asking the leader again when the
  answer names an epoch it does not have (KIP-279); never below its high watermark.
- :mod:`~kraft.replication.leader_state` — one partition on its leader: follower progress, the ISR
  with an in-flight AlterPartition (KIP-497's "maximal ISR"), the high watermark, shrink/expand decisions.
- :mod:`~kraft.replication.acks` — produce requests waiting for ``acks=all`` with
  ``min.insync.replicas``.
- :mod:`~kraft.replication.alter_partition` — the controller's validation of an AlterPartition request.

None of this is wired into a process yet: see docs/internals/replication.md.
"""
