"""Observability: structured key=value logging, Prometheus metrics, grpc.health.v1 helpers."""
