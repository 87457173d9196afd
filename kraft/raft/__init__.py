"""Raft for the metadata quorum: IO-free core, asyncio driver, gRPC transport (see docs/internals/raft.md)."""
