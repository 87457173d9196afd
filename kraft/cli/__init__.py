"""The `kraft` command line (typer): one sub-app module per command group, registered in main.py."""

from kraft.runtime import configure_grpc_io

# Before any command module imports grpc: gRPC reads its I/O-layer choice once, at import (kraft.runtime).
configure_grpc_io()
