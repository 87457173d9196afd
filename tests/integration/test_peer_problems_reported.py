"""A misconfigured controller is reported within seconds (issue #19): its wrong voter addresses, a data
dir formatted for another cluster and a voter list that differs from the quorum's show in DescribeQuorum's
``peer_problems``, in ``kraft quorum describe --status``, in the cluster-status probe and as
``raft_peer_refused`` lines in the node's log, instead of an unexplained Follower/Prospective loop."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.client.quorum import PeerProblemView, gather_peer_problems
from kraft.cluster.probe import quorum_view
from kraft.cluster.quorum import QuorumFactory, wait_until
from kraft.netutil import free_port
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import META_PROPERTIES_FILE, format_log_dir

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
    quorum.start()
    leader = quorum.wait_for_leader(timeout_s=30)  # voters 1 and 2 are a majority
    assert leader.leader_id in (1, 2)
    # "within seconds" of the quorum running: counted from its first leader, not from the process starts
    # (on a loaded CI host starting three interpreters alone can take seconds)
    started = time.monotonic()

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


def test_cluster_id_and_voter_set_mismatches_are_logged_and_shown_within_seconds(
    quorum_factory: QuorumFactory,
) -> None:
    """Controllers 1-2-3 are the quorum.  Node 3's data dir was formatted for another cluster; node 4 was
    given ``controller.quorum.voters`` 1,2,4 (it believes it is a voter, nobody else does)."""
    quorum = quorum_factory(size=4)
    quorum.prepare()
    nodes = quorum.nodes
    voters = ",".join(f"{i}@127.0.0.1:{nodes[i].port}" for i in (1, 2, 3))
    full = ",".join(f"{i}@127.0.0.1:{nodes[i].port}" for i in (1, 2, 3, 4))
    for i in (1, 2, 3):
        nodes[i].config_path.write_text(nodes[i].config_path.read_text().replace(full, voters))
    wrong_voters = ",".join(f"{i}@127.0.0.1:{nodes[i].port}" for i in (1, 2, 4))
    nodes[4].config_path.write_text(nodes[4].config_path.read_text().replace(full, wrong_voters))
    (nodes[3].metadata_dir / META_PROPERTIES_FILE).unlink()
    format_log_dir(nodes[3].metadata_dir, cluster_id=random_uuid(), node_id=3)
    quorum.start()
    # Nodes 3 and 4 never agree with the quorum: the leader is the one 1 and 2 agree on.
    leader = wait_until(lambda: quorum.current_leader(among=[1, 2]), 30, "a leader among 1 and 2")
    assert leader.leader_id in (1, 2)
    started = time.monotonic()  # "within seconds" of the quorum running (see the test above)

    def refused(node: int, code: str) -> list[str]:
        text = nodes[node].log_path.read_text(errors="replace")
        return [
            line for line in text.splitlines() if "event=raft_peer_refused" in line and f"code={code}" in line
        ]

    # Node 3 hears from its peers that it belongs to another cluster; node 4 that it is not their voter.
    while not (refused(3, "INCONSISTENT_CLUSTER_ID") and refused(4, "INCONSISTENT_VOTER_SET")):
        assert time.monotonic() - started < 10, quorum.diagnostics(lines=20)
        time.sleep(0.1)
    assert any(
        f"address=127.0.0.1:{nodes[1].port}" in line for line in refused(4, "INCONSISTENT_VOTER_SET")
    ) or any(f"address=127.0.0.1:{nodes[2].port}" in line for line in refused(4, "INCONSISTENT_VOTER_SET"))

    def shown() -> set[tuple[int, str]]:
        result = CliRunner().invoke(
            app,
            [
                "quorum",
                "describe",
                "--status",
                "--json",
                "--bootstrap-controller",
                f"{nodes[1].target},{nodes[4].target}",
            ],
        )
        assert result.exit_code == 0, result.output
        return {(p["reporter_id"], p["kind"]) for p in json.loads(result.stdout)["peer_problems"]}

    # `quorum describe --status` asks every controller it knows (the voters, and the bootstrap list: node
    # 4 is no voter of the quorum) for its own problems.
    while not {(3, "INCONSISTENT_CLUSTER_ID"), (4, "INCONSISTENT_VOTER_SET")} <= (seen := shown()):
        assert time.monotonic() - started < 12, seen
        time.sleep(0.2)
    text = CliRunner().invoke(
        app,
        ["quorum", "describe", "--status", "--bootstrap-controller", f"{nodes[1].target},{nodes[4].target}"],
    )
    assert text.exit_code == 0, text.output
    assert "controller 3 -> " in text.stdout and "INCONSISTENT_CLUSTER_ID from" in text.stdout, text.stdout
    assert "controller 4 -> " in text.stdout and "INCONSISTENT_VOTER_SET from" in text.stdout, text.stdout
