"""Metadata: record types, MetadataImage/MetadataDelta, the controller state machines, the active
controller, ControllerService and the aiosqlite image store (see docs/internals/metadata.md)."""
