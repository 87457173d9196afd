"""The composition root: assembles whole processes (a controller, a broker) from the layers below.

Nothing under ``kraft/`` imports this package except the CLI commands that start a process; it is the
one place allowed to know every layer (Raft, storage, metadata, broker, observability) at once.
"""
