"""Who a caller is (principals from TLS client certificates) and what it may do (ACLs).

This package imports nothing of kraft beyond leaves, so every listener — Raft, ControllerService,
BrokerService — can ask the same questions the same way.
"""
