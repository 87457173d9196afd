"""`kraft cluster up|status|restart|down` and the LocalCluster API against real controller/broker processes.

These tests cover planning, config generation and pid-file safety without starting nodes.  The whole
lifecycle against real processes (up, status, stop/start, restart, down) is the user story in
``test_e2e_cli.py``, which shares one cluster across those steps to keep the suite short.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.cluster.manager import ClusterError, LocalCluster
from kraft.cluster.process import NodeProcess, pid_alive
from kraft.cluster.spec import ClusterLayout, ClusterSpec, NodeRole, node_properties, plan_cluster
from kraft.config import ConfigError, NodeConfig, load_config
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


def test_a_tls_cluster_is_default_deny_but_for_its_own_certificates(tmp_path: Path) -> None:
    spec = plan_cluster(random_uuid(), 1, 1, base_port=20000, tls=True)
    layout = ClusterLayout(tmp_path)
    cfg = NodeConfig.from_properties(node_properties(spec, spec.node(101), layout))
    assert cfg.authorizer_settings.enabled and not cfg.authorizer_settings.allow_everyone_if_no_acl_found
    # The DEFAULT mapping gives the certificate's RFC 2253 subject: CN first, then O.
    assert cfg.super_users == {
        "User:CN=controller-1,O=kraft",
        "User:CN=broker-101,O=kraft",
        "User:CN=admin,O=kraft",
    }
    assert ClusterSpec.from_json(spec.to_json()) == spec
    opted_out = plan_cluster(random_uuid(), 1, 1, base_port=20000, tls=True, authorizer=False)
    plaintext = plan_cluster(random_uuid(), 1, 1, base_port=20000)
    for other in (opted_out, plaintext):
        props = node_properties(other, other.node(1), layout)
        assert "authorizer.class.name" not in props and "super.users" not in props
    with pytest.raises(ValueError, match="needs TLS"):
        plan_cluster(random_uuid(), 1, 1, base_port=20000, authorizer=True)
    # A cluster.json written before the authorizer existed reads back without one.
    legacy = {k: v for k, v in spec.to_json().items() if k != "authorizer"}
    assert not ClusterSpec.from_json(legacy).authorizer
    result = runner.invoke(app, ["cluster", "up", "--dir", str(tmp_path / "x"), "--no-authorizer"])
    assert result.exit_code != 0 and "--no-authorizer goes with --tls" in result.output


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


# --- nodes that ended by themselves (issue #14) ----------------------------------------------------------


def test_status_shows_a_node_that_exited_with_a_fatal_line_as_failed(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path / "c", controllers=1, brokers=0, profile="fast")
    node = cluster.spec.node(1)
    log = cluster.layout.log_path(node)
    log.parent.mkdir(parents=True, exist_ok=True)
    fatal = (
        "ts=2026-11-24T00:00:00.000Z level=error logger=controller event=fatal node=1 "
        'reason=raft_driver_failed error="FatalStorageError: write failed (No space left on device)" '
        "errno=ENOSPC exit_code=70"
    )
    log.write_text(
        "# 2026-11-23T00:00:00Z starting controller-1: kraft controller start\n"
        "ts=... level=error logger=controller event=fatal node=1 reason=an_older_run exit_code=70\n"
        "# 2026-11-24T00:00:00Z starting controller-1: kraft controller start\n"
        f"ts=... level=info logger=controller event=controller_started node=1\n{fatal}\n"
    )
    # The process is gone but nobody stopped it through `kraft cluster`: its pid file is still there.
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    pid_path = cluster.layout.pid_path(node)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    pid_path.write_text(f"{dead.pid}\n")

    status = LocalCluster.open(tmp_path / "c").status()
    [failed] = status.nodes
    assert (failed.state, failed.exit_code, failed.last_error) == ("failed", 70, fatal)
    assert not status.healthy
    assert status.as_json()["nodes"][0]["exit_code"] == 70
    result = runner.invoke(app, ["cluster", "status", "--dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert f"controller-1 failed (exit 70): {fatal}\n" in result.output


def test_status_shows_a_node_that_could_not_start_as_failed_with_exit_1(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path / "c", controllers=1, brokers=0, profile="fast")
    node = cluster.spec.node(1)
    (cluster.layout.data_dir(node) / "meta.properties").unlink()  # unformatted: the start is refused
    proc = cluster.process(1)
    proc.start()
    try:
        assert proc._popen is not None
        assert proc._popen.wait(timeout=60) == 1
    finally:
        proc.kill()
    status = LocalCluster.open(tmp_path / "c").status()  # another invocation: only the log says why
    [failed] = status.nodes
    assert failed.state == "failed" and failed.exit_code == 1, failed
    assert failed.last_error.startswith("error:") and "meta.properties" in failed.last_error


def test_a_dynamic_cluster_names_bootstrap_servers_and_formats_one_standalone_voter(tmp_path: Path) -> None:
    spec = plan_cluster(random_uuid(), 3, 1, base_port=20000, dynamic=True)
    assert ClusterSpec.from_json(spec.to_json()) == spec and spec.dynamic
    layout = ClusterLayout(tmp_path)
    controller = node_properties(
        spec, spec.node(2), layout, advertised_of=lambda node_id: ("10.9.9.9", 30000 + node_id)
    )
    assert "controller.quorum.voters" not in controller
    assert (
        controller["controller.quorum.bootstrap.servers"] == "127.0.0.1:20000,127.0.0.1:20001,127.0.0.1:20002"
    )
    assert controller["advertised.listeners"] == "CONTROLLER://10.9.9.9:30002"  # its VotersRecord endpoint
    cluster = LocalCluster.create(tmp_path / "c", controllers=3, brokers=1, dynamic=True)
    checkpoints = {
        node.node_id: [
            p.name for p in (cluster.layout.data_dir(node) / "__cluster_metadata-0").glob("*.checkpoint")
        ]
        for node in cluster.spec.controllers
    }
    # Only controller 1 starts with a voter set (itself); 2 and 3 join with add-controller.
    assert checkpoints == {1: ["00000000000000000000-0000000000.checkpoint"], 2: [], 3: []}
    with pytest.raises(ClusterError, match="dynamic quorum"):
        LocalCluster.create(tmp_path / "s", controllers=1, brokers=0).grow_quorum(1.0)
