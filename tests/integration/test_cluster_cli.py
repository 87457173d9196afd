"""`kraft cluster up|status|restart|down` and the LocalCluster API against real controller/broker processes.

These tests cover planning, config generation and pid-file safety without starting nodes.  The whole
lifecycle against real processes (up, status, stop/start, restart, down) is the user story in
``test_e2e_cli.py``, which shares one cluster across those steps to keep the suite short.
"""

from __future__ import annotations

import json
import os
import socket
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
