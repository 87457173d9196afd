"""Test-session setup shared by every suite."""

from kraft.runtime import configure_grpc_io

# The gRPC I/O layer kraft's processes run on (kraft.runtime), chosen before any test module imports grpc,
# so in-process tests exercise what ships; `KRAFT_GRPC_IO=event-engine make test` runs the other one.
configure_grpc_io()
