"""free_port: listener ports that an outgoing connection cannot take while their node restarts."""

from __future__ import annotations

import socket

import pytest

from kraft import netutil
from kraft.netutil import free_port


def test_ports_come_from_below_the_ephemeral_range_never_twice_and_bindable() -> None:
    ephemeral = netutil._ephemeral_range()
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    if ephemeral is not None and ephemeral[0] > netutil._LOWEST_PICKED_PORT + 1000:
        assert all(netutil._LOWEST_PICKED_PORT <= port < ephemeral[0] for port in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # still free


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        other = free_port()
        picks = iter([taken, taken, other])
        monkeypatch.setattr(netutil._picker, "randrange", lambda *_args: next(picks))
        netutil._recently_picked.clear()
        if netutil._ephemeral_range() is not None:
            assert free_port() == other  # the held port was tried twice and skipped
