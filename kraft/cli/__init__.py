"""The `kraft` command line (typer): one sub-app module per command group, registered in main.py."""

import os

from kraft.runtime import configure_grpc_io

# Before any command module imports grpc: gRPC reads its I/O-layer choice once, at import (kraft.runtime).
configure_grpc_io()
# gRPC's C core prints its own log lines on stderr (e.g. "E1124 … add_port.cc:83] Failed to add port …"
# before kraft's one `error: cannot listen on …` line for the same failure).  kraft reports every failure
# itself, so the CLI keeps the core quiet unless the operator asks (GRPC_VERBOSITY=debug, as its
# messages suggest).  Read once, when grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
