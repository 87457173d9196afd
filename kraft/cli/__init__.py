"""The `kraft` command line (typer): one sub-app module per command group, registered in main.py."""

import sys

from kraft.runtime import configure_grpc_io, configure_grpc_logging

# Before any command module imports grpc: gRPC reads its I/O-layer choice and its log level once, at
# import.  The log level is ERROR for a node (no per-handshake INFO lines an attacker can multiply) and
# NONE for every other command (kraft reports each failure itself in one line); an operator's own
# GRPC_VERBOSITY (e.g. debug, as the core's messages suggest) wins (kraft.runtime).
configure_grpc_io()
configure_grpc_logging(sys.argv)
