"""A misconfigured controller is reported within seconds (issue #19): its wrong voter addresses show in
DescribeQuorum's ``peer_problems``, in ``kraft quorum describe --status`` and in the cluster-status probe,
instead of an unexplained Follower/Prospective loop."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.client.quorum import PeerProblemView, gather_peer_problems
from kraft.cluster.probe import quorum_view
from kraft.cluster.quorum import QuorumFactory
from kraft.netutil import free_port

pytestmark = pytest.mark.integration


def test_a_controller_with_wrong_voter_ports_is_reported_within_seconds(
    quorum_factory: QuorumFactory,
) -> None:
    quorum = quorum_factory(size=3, test_append=True)
    quorum.prepare()
    nodes = quorum.nodes
    # Node 3 was given a stale voter list: nothing listens on the ports it dials for voters 1 and 2.
    wrong = {1: free_port(), 2: free_port()}
    config = nodes[3].config_path.read_text()
    for peer, port in wrong.items():
        config = config.replace(f"{peer}@127.0.0.1:{nodes[peer].port}", f"{peer}@127.0.0.1:{port}")
    nodes[3].config_path.write_text(config)
    started = time.monotonic()
    quorum.start()
    leader = quorum.wait_for_leader(timeout_s=30)  # voters 1 and 2 are a majority
    assert leader.leader_id in (1, 2)

    def reported() -> list[PeerProblemView]:
        found = gather_peer_problems([nodes[3].target], timeout_s=2.0).problems
        return [p for p in found if p.reporter_id == 3 and p.kind == "unreachable"]

    while {p.peer_id for p in reported()} != {1, 2}:
        assert time.monotonic() - started < 20, "node 3's unreachable voters were never reported"
        time.sleep(0.2)
    problems = {p.peer_id: p for p in reported()}
    assert problems[1].address == f"127.0.0.1:{wrong[1]}"
    assert problems[2].address == f"127.0.0.1:{wrong[2]}"

    # `quorum describe --status` asks the leader, then every advertised controller for its problems.
    result = CliRunner().invoke(
        app, ["quorum", "describe", "--status", "--json", "--bootstrap-controller", nodes[1].target]
    )
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    shown = {(p["reporter_id"], p["peer_id"], p["kind"], p["address"]) for p in status["peer_problems"]}
    assert (3, 1, "unreachable", f"127.0.0.1:{wrong[1]}") in shown
    assert status["unanswered_controllers"] == []
    text = CliRunner().invoke(
        app, ["quorum", "describe", "--status", "--bootstrap-controller", nodes[1].target]
    )
    assert text.exit_code == 0, text.output
    assert f"controller 3 -> 1: unreachable at 127.0.0.1:{wrong[1]}" in text.stdout

    # What `kraft cluster status` shows per controller (its probe).
    view = quorum_view(nodes[3].target, 2.0)
    assert view is not None
    assert any(f"127.0.0.1:{wrong[1]}" in line for line in view.peer_problems)
    healthy = quorum_view(nodes[1].target, 2.0)
    assert healthy is not None and not any("unreachable" in line for line in healthy.peer_problems)
