"""`kraft cluster up|status|restart|down` and the LocalCluster API against real controller/broker processes.

The unmarked tests cover planning, config generation and pid-file safety without starting nodes; the
integration test starts one fast-profile cluster (3 controllers, 1 broker) and always tears it down.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.cluster.manager import ClusterError, LocalCluster
from kraft.cluster.process import NodeProcess, pid_alive
from kraft.cluster.spec import ClusterLayout, ClusterSpec, NodeRole, node_properties, plan_cluster
from kraft.config import ConfigError, load_config
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import read_meta_properties

runner = CliRunner()
UP_TIMEOUT_S = 120  # generous: 2 shared cores, 4 Python processes starting at once


def _kraft(*args: str, timeout_s: float = UP_TIMEOUT_S + 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kraft.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _log_tails(cluster_dir: Path, lines: int = 15) -> str:
    """The end of every node log, so a failure on a loaded CI machine can be diagnosed afterwards."""
    parts = []
    for log in sorted((cluster_dir / "logs").glob("*.log")):
        parts.append(
            f"\n--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        )
    return "".join(parts)


# --- without processes -------------------------------------------------------------------------------


def test_plan_assigns_ids_and_consecutive_ports_from_base_port() -> None:
    spec = plan_cluster(random_uuid(), 3, 2, base_port=20000, metrics=True)
    assert [(n.node_id, n.role, n.port, n.metrics_port) for n in spec.nodes] == [
        (1, NodeRole.CONTROLLER, 20000, 20005),
        (2, NodeRole.CONTROLLER, 20001, 20006),
        (3, NodeRole.CONTROLLER, 20002, 20007),
        (101, NodeRole.BROKER, 20003, 20008),
        (102, NodeRole.BROKER, 20004, 20009),
    ]
    assert spec.node("broker-102") == spec.node(102) == spec.node("102")
    with pytest.raises(KeyError, match="no node 'x'"):
        spec.node("x")


def test_generated_configs_are_valid_and_address_of_rewrites_voters(tmp_path: Path) -> None:
    spec = plan_cluster(random_uuid(), 3, 1, profile="fast", overrides={"log.level": "DEBUG"})
    layout = ClusterLayout(tmp_path)
    proxied = node_properties(
        spec, spec.node(101), layout, address_of=lambda viewer, target: ("10.9.9.9", target)
    )
    assert proxied["controller.quorum.voters"] == "1@10.9.9.9:1,2@10.9.9.9:2,3@10.9.9.9:3"
    cluster = LocalCluster.create(tmp_path / "c", controllers=3, brokers=1, profile="fast")
    for node in cluster.spec.nodes:
        cfg = load_config(cluster.layout.config_path(node))
        assert cfg.node_id == node.node_id
        assert cfg.controller_quorum_election_timeout_ms == 500
        meta = read_meta_properties(cluster.layout.data_dir(node))
        assert (meta.cluster_id, meta.node_id) == (cluster.spec.cluster_id, node.node_id)
    assert ClusterSpec.from_json(json.loads(cluster.layout.state_path.read_text())) == cluster.spec
    with pytest.raises(ClusterError, match="already holds a cluster"):
        LocalCluster.create(tmp_path / "c")


def test_a_bad_override_fails_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"broker\.session\.timeout\.ms='nope'"):
        LocalCluster.create(tmp_path / "c", overrides={"broker.session.timeout.ms": "nope"})
    assert not (tmp_path / "c").exists()


def test_up_refuses_ports_in_use(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = runner.invoke(
            app, ["cluster", "up", "--dir", str(tmp_path / "c"), "--base-port", str(port), "--brokers", "0"]
        )
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: port {port} (controller-1 listener) on 127.0.0.1 is already in use; "
        "stop whatever holds it or choose another --base-port"
    )
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_status_and_down_of_a_missing_cluster_fail_with_one_line(tmp_path: Path) -> None:
    for command in ("status", "down"):
        result = runner.invoke(app, ["cluster", command, "--dir", str(tmp_path)])
        assert result.exit_code == 1
        assert result.stderr.startswith(f"error: no cluster in {tmp_path}")


def test_a_recycled_pid_is_never_trusted(tmp_path: Path) -> None:
    spec = plan_cluster(random_uuid(), 1, 0)
    proc = NodeProcess(spec.nodes[0], ClusterLayout(tmp_path))
    proc.pid_path.parent.mkdir(parents=True)
    proc.pid_path.write_text(f"{os.getpid()}\n")  # alive, but it is pytest, not this node
    assert proc.pid() is None
    assert proc.stop(timeout_s=1) == "not running"
    assert not proc.pid_path.exists()
    assert pid_alive(os.getpid())


# --- with real processes -----------------------------------------------------------------------------


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).down(timeout_s=5)


@pytest.mark.integration
def test_cluster_lifecycle_up_status_restart_kill_down(cluster_dir: Path) -> None:
    up = _kraft(
        "cluster", "up", "--dir", str(cluster_dir), "--brokers", "1", "--profile", "fast",
        "--timeout", str(UP_TIMEOUT_S), "--json",
    )  # fmt: skip
    assert up.returncode == 0, up.stderr + _log_tails(cluster_dir)
    started = json.loads(up.stdout)
    assert started["healthy"] is True
    states = {n["id"]: n["state"] for n in started["nodes"]}
    assert sorted(states.values()) == ["active", "follower", "follower", "leader"]
    assert states[started["leader_id"]] == "leader"
    assert all(pid_alive(n["pid"]) for n in started["nodes"])

    again = _kraft("cluster", "up", "--dir", str(cluster_dir))
    assert again.returncode == 1
    assert again.stderr.startswith("error: a cluster is already running in")
    assert len(again.stderr.splitlines()) == 1

    status = json.loads(_kraft("cluster", "status", "--dir", str(cluster_dir), "--json").stdout)
    assert {n["id"]: n["pid"] for n in status["nodes"]} == {n["id"]: n["pid"] for n in started["nodes"]}
    assert set(status) >= {"cluster_id", "dir", "nodes"}
    assert set(status["nodes"][0]) >= {"id", "role", "pid", "endpoint", "state", "log"}

    # Graceful restart of the leader: the quorum elects another one and the old leader rejoins.
    old_leader = started["leader_id"]
    restart = _kraft("cluster", "restart", str(old_leader), "--dir", str(cluster_dir), "--json")
    assert restart.returncode == 0, restart.stderr + _log_tails(cluster_dir)
    after = json.loads(restart.stdout)
    restarted = next(n for n in after["nodes"] if n["id"] == old_leader)
    assert restarted["state"] in ("leader", "follower")
    assert restarted["pid"] != next(n["pid"] for n in started["nodes"] if n["id"] == old_leader)

    # The Python API: crash a follower, see it stopped, bring it back.
    cluster = LocalCluster.open(cluster_dir)
    current = cluster.status()
    follower = next(n.node_id for n in current.nodes if n.state == "follower")
    assert cluster.kill(follower)
    cluster.wait_until(lambda s: s.node(follower).state == "stopped", 10, what="the follower to be down")
    cluster.start([follower])
    cluster.wait_node_ready(follower, UP_TIMEOUT_S)
    assert cluster.wait_healthy(UP_TIMEOUT_S).healthy

    pids = [n.pid for n in cluster.status().nodes]
    down = _kraft("cluster", "down", "--dir", str(cluster_dir), "--timeout", "8")
    assert down.returncode == 0, down.stderr
    outcomes = dict(line.split(": ") for line in down.stdout.splitlines())
    assert set(outcomes) == {"broker-101", "controller-1", "controller-2", "controller-3"}
    assert outcomes["broker-101"] == "stopped"  # a controlled shutdown while the controllers still run
    # A controller that outlives --timeout is SIGKILLed; either way nothing may be left running.
    assert set(outcomes.values()) <= {"stopped", "killed"}
    assert not any(pid is not None and pid_alive(pid) for pid in pids)
    assert not list((cluster_dir / "run").glob("*.pid"))
    final = json.loads(_kraft("cluster", "status", "--dir", str(cluster_dir), "--json").stdout)
    assert {n["state"] for n in final["nodes"]} == {"stopped"}
