"""Clients of kraft's gRPC services, for every caller outside the server that answers them.

- :mod:`kraft.client.channel` — the one function that opens a channel (plaintext today; where channel
  credentials go when TLS arrives);
- :mod:`kraft.client.controller` — ControllerService on the active controller, following NOT_CONTROLLER
  (brokers' registration, heartbeats and metadata fetches);
- :mod:`kraft.client.admin` — the same with a tool's retry pacing (CLI, chaos harness, benchmarks, tests);
- :mod:`kraft.client.broker` — BrokerService: Metadata, Produce, Fetch, ListOffsets on partition leaders;
- :mod:`kraft.client.quorum` — RaftService's DescribeQuorum on the quorum leader (blocking).
"""
