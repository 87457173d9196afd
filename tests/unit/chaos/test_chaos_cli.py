"""``kraft chaos proxy`` as a real process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import kraft.cli.main as cli_main
from chaos.scenarios import SCENARIOS
from kraft.netutil import free_port, wait_for_port

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT_S = 20.0


def _proxy_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kraft.cli.main", "chaos", "proxy", *args]


@pytest.fixture
def proxy_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    api_port, listen_port = free_port(), free_port()
    config = tmp_path / "proxies.json"
    config.write_text(
        json.dumps([{"name": "pre", "upstream": "127.0.0.1:1", "listen": f"127.0.0.1:{listen_port}"}])
    )
    process = subprocess.Popen(
        _proxy_command("--port", str(api_port), "--seed", "3", "--config", str(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_for_port("127.0.0.1", api_port, STARTUP_TIMEOUT_S), "proxy API did not come up"
        yield process, api_port, listen_port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_proxy_command_serves_the_api_and_stops_on_sigterm(
    proxy_process: tuple[subprocess.Popen[bytes], int, int],
) -> None:
    process, api_port, listen_port = proxy_process
    base = f"http://127.0.0.1:{api_port}"
    assert requests.get(f"{base}/version", timeout=10).json() == {"version": "2.12.0"}
    assert requests.get(f"{base}/proxies/pre", timeout=10).json()["listen"] == f"127.0.0.1:{listen_port}"
    process.send_signal(signal.SIGTERM)
    assert process.wait(15) == 0
    assert b"listening on" in (process.stderr.read() if process.stderr else b"")


def test_proxy_command_reports_a_taken_port_in_one_line() -> None:
    with socket.create_server(("127.0.0.1", free_port())) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            _proxy_command("--port", str(port)), check=False, capture_output=True, timeout=30
        )
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("error: cannot listen on 127.0.0.1:") and "in use" in lines[0]
    )


def test_run_rejects_an_unknown_scenario_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kraft.cli.main",
            "chaos",
            "run",
            "--scenario",
            "nope",
            "--report",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: --scenario: unknown scenario 'nope'")
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_run_refuses_the_data_plane_scenario_with_too_few_brokers_in_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kraft.cli.main", "chaos", "run", "--scenario", "data-plane"]
    result = subprocess.run(
        [*command, "--brokers", "2", "--report", str(tmp_path)], check=False, capture_output=True, timeout=60
    )
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert lines == ["error: --brokers: data-plane needs at least 3 (replication factor 3)"]
    assert not any(tmp_path.iterdir()), "nothing may start before the input is checked"


def test_run_help_lists_every_registered_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    # The list comes from the registry when help is shown: a new scenario cannot be left out of it.
    capsys.readouterr()
    assert cli_main.run(["chaos", "run", "--help"]) == 0
    words = " ".join(capsys.readouterr().out.split())
    assert f"Scenarios: {', '.join(SCENARIOS)}, or all." in words
    assert {"data-plane", "membership"} <= set(SCENARIOS)
