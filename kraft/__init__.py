"""kraft: a KRaft-style Raft metadata quorum (controllers, brokers, CLI, chaos tests)."""

__version__ = "0.1.0"
