"""The kraft broker: registration and heartbeats, metadata fetch and delta application to partition
logs, and the client-facing BrokerService (see docs/internals/broker.md)."""
