"""Generated protobuf/gRPC code for package kraft.v1 (``make proto``); never edit by hand."""
