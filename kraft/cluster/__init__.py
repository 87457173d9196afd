"""Local cluster management: generate configs, format storage, run and supervise node processes.

Used by ``kraft cluster up|status|down|restart`` and reused by the chaos harness (custom addresses via
``address_of`` so links can be proxied; start/stop/kill/restart one node; wait for conditions).
"""
