"""Test-session setup shared by every suite."""

from hypothesis import settings

from kraft.runtime import configure_grpc_io

# The gRPC I/O layer kraft's processes run on (kraft.runtime), chosen before any test module imports grpc,
# so in-process tests run on the same one as the processes they start; `KRAFT_GRPC_IO=iomgr make test`
# runs the whole suite on gRPC's iomgr.
configure_grpc_io()

# Hypothesis's per-example deadline (200 ms) is a speed check, and speed targets live in the benchmarks:
# on a loaded 2-core CI host it fails examples that are correct (DeadlineExceeded / Flaky).
settings.register_profile("kraft", deadline=None)
settings.load_profile("kraft")
