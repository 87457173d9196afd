"""kraft chaos toolkit: a Toxiproxy-compatible proxy, nemeses, recorded histories and checkers.

Sub-packages: ``chaos.proxy`` (the proxy server), ``chaos.checkers`` (pure verdict functions);
modules: ``chaos.history`` (the operation history store), ``chaos.nemesis`` (faults and schedules),
``chaos.topology`` (one proxy per directed link).
"""
