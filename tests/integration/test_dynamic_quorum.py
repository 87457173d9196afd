"""A dynamic controller quorum (KIP-853) built the way an operator builds one, with real processes:
controller 1 formatted ``--standalone``, controllers 2 to 5 ``--no-initial-controllers`` (they start as
observers that find the quorum through ``controller.quorum.bootstrap.servers``), ``kraft quorum
add-controller`` for each — grown 1 → 3 → 5 as docs/operations.md describes — a topic created through a
broker that also only knows the bootstrap server, then the leader removed with ``kraft quorum
remove-controller``: the four remaining voters elect a leader and the next write succeeds.  Then controller
1 and that leader stop: the broker, which learned the voter set from its MetadataFetch answers, heartbeats
the next leader.  No controller may have resigned over a mispredicted metadata offset on the way
(``offset_prediction_mismatch``) or fenced the live broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import TEST_PROFILE

from kraft.client.quorum import describe_quorum, quorum_status
from kraft.cluster.formatting import format_node_storage
from kraft.cluster.quorum import REPO_ROOT, ControllerQuorum
from kraft.config import load_config
from kraft.netutil import free_port, wait_for_port
from kraft.procutil import log_tail, reap, spawn_logged
from kraft.storage.meta_properties import read_meta_properties

CALL_TIMEOUT_S = 45.0


def kraft(*args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "kraft.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    print(f"[{time.monotonic() - started:5.1f} s] exit {result.returncode}: kraft {' '.join(args)}")
    assert result.returncode == 0, f"kraft {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


def status(bootstrap: str) -> dict[str, Any]:
    described: dict[str, Any] = json.loads(
        kraft("quorum", "describe", "--status", "--json", "--bootstrap-controller", bootstrap).stdout
    )
    return described


def test_grow_one_to_three_to_five_create_a_topic_and_remove_the_leader(tmp_path: Path) -> None:
    started = time.monotonic()
    quorum = ControllerQuorum(
        tmp_path / "quorum", size=5, overrides=TEST_PROFILE, test_append=False, dynamic=True
    )
    broker = None
    try:
        quorum.prepare()
        first_dir = (quorum.nodes[1].metadata_dir / "__cluster_metadata-0").iterdir()
        assert [p.name for p in first_dir if p.suffix == ".checkpoint"] == [
            "00000000000000000000-0000000000.checkpoint"
        ]
        quorum.start()
        bootstrap = quorum.nodes[1].target
        assert quorum.wait_for_leader(30).leader_id == 1

        every = ",".join(node.target for node in quorum.nodes.values())
        directory_ids = {
            node_id: read_meta_properties(node.metadata_dir).directory_id
            for node_id, node in quorum.nodes.items()
        }
        voters = [1]
        for grown_to in ((1, 2, 3), (1, 2, 3, 4, 5)):
            for node_id in grown_to:
                if node_id not in voters:
                    added = kraft(
                        "quorum", "add-controller", "--bootstrap-controller", bootstrap,
                        "--command-config", str(quorum.nodes[node_id].config_path),
                    )  # fmt: skip
                    assert f"Added controller {node_id}" in added.stdout
            # The CLI's view once, at the end; in between the same answer in-process (a CLI run costs
            # a second or two of a shared core).
            view = status(every) if len(grown_to) == 5 else _status_in_process(every)
            voters = sorted(view["current_voters"])
            assert voters == list(grown_to)
            expected = {(node_id, directory_ids[node_id]) for node_id in grown_to}
            assert {(v["id"], v["directory_id"]) for v in view["voters"]} == expected
            assert all(v["endpoints"] for v in view["voters"]), view["voters"]
            print(f"[{time.monotonic() - started:5.1f} s] grown to {len(grown_to)} voters")

        # A broker that only knows the bootstrap server registers; a topic is created.
        broker_port = free_port()
        broker_config = tmp_path / "broker.properties"
        broker_config.write_text(
            "process.roles=broker\nnode.id=101\n"
            f"controller.quorum.bootstrap.servers={bootstrap}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{broker_port}\nlog.dirs={tmp_path / 'broker-logs'}\n"
            "broker.heartbeat.interval.ms=200\n",
            encoding="utf-8",
        )
        format_node_storage(load_config(broker_config), quorum.cluster_id)
        broker = spawn_logged(
            [sys.executable, "-m", "kraft.cli.main", "broker", "start", "--config", str(broker_config)],
            tmp_path / "broker.log",
            banner="--- broker 101 ---",
            cwd=REPO_ROOT,
        )
        assert wait_for_port("127.0.0.1", broker_port, 30), log_tail(tmp_path / "broker.log", 30)
        _wait_for_broker(every)
        kraft(
            "topic",
            "create",
            "before",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--bootstrap-controller",
            every,
        )

        # Remove the leader: it hands over once the change commits; the other four stay a quorum.
        kraft(
            "quorum", "remove-controller", "--bootstrap-controller", every,
            "--controller-id", "1", "--controller-directory-id", directory_ids[1],
        )  # fmt: skip
        after = quorum.wait_for_leader(30, exclude=[1])
        assert after.leader_id in (2, 3, 4, 5)
        view = status(every)
        assert sorted(view["current_voters"]) == [2, 3, 4, 5]
        # The broker knows only controller 1, now removed: it must follow the redirect to the new leader
        # (a dynamic quorum's hint carries the leader's address from the voter set) and keep its session.
        # Before, the hint had no address and it heartbeated controller 1 until the new leader fenced it.
        leader_target = quorum.nodes[after.leader_id].target
        opened = f"event=heartbeat_stream_opened controller={leader_target}"
        deadline = time.monotonic() + 20
        while opened not in (tmp_path / "broker.log").read_text(encoding="utf-8", errors="replace"):
            assert time.monotonic() < deadline, f"the broker never heartbeated the new leader ({opened})"
            time.sleep(0.2)
        _wait_for_broker(every)

        # The broker learns the voter set from the leader's MetadataFetch answers (KIP-853), so controller
        # 1 leaves its rotation.  Then 1 stops, and the leader too: the broker's bootstrap controller and the
        # leader a hint named are both gone, and it must find the next leader among the voters it learned.
        # Before, with only its bootstrap server and hints, it found no controller until its session ran out.
        _wait_for_voters_learned(tmp_path / "broker.log", [2, 3, 4, 5])
        quorum.terminate(1)
        quorum.terminate(after.leader_id)
        final = quorum.wait_for_leader(30, exclude=[1, after.leader_id])
        opened = f"event=heartbeat_stream_opened controller={quorum.nodes[final.leader_id].target}"
        deadline = time.monotonic() + 20
        while opened not in (tmp_path / "broker.log").read_text(encoding="utf-8", errors="replace"):
            assert time.monotonic() < deadline, f"the broker never heartbeated the next leader ({opened})"
            time.sleep(0.2)
        print(f"[{time.monotonic() - started:5.1f} s] the broker heartbeats leader {final.leader_id}")
        kraft(
            "topic",
            "create",
            "after",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--bootstrap-controller",
            every,
        )
        listed = kraft("topic", "list", "--bootstrap-controller", every).stdout
        assert "before" in listed and "after" in listed
        for node in quorum.nodes.values():
            log = node.log_path.read_text(encoding="utf-8", errors="replace")
            expired = [line for line in log.splitlines() if "event=broker_session_expired" in line]
            assert expired == [], f"controller {node.node_id} fenced the live broker: {expired}"
            mismatches = [line for line in log.splitlines() if "offset_prediction_mismatch" in line]
            assert mismatches == [], f"controller {node.node_id} resigned over its offsets: {mismatches}"
        print(f"[{time.monotonic() - started:5.1f} s] done")
        assert time.monotonic() - started < 90, (
            "the scenario should stay well under a minute on an idle machine"
        )
    except BaseException:
        print(quorum.diagnostics(lines=40))
        if (tmp_path / "broker.log").exists():
            print(log_tail(tmp_path / "broker.log", 30))
        raise
    finally:
        if broker is not None:
            broker.kill()
            reap(broker)
        quorum.close()


def _status_in_process(bootstrap: str) -> dict[str, Any]:
    view = quorum_status(describe_quorum(bootstrap.split(","), CALL_TIMEOUT_S))
    return {"current_voters": view.current_voters, "voters": view.voters}


def _wait_for_voters_learned(broker_log: Path, voters: list[int], timeout_s: float = 20.0) -> None:
    """Wait for the broker's ``controller_voters_learned`` line naming exactly ``voters``."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in broker_log.read_text(encoding="utf-8", errors="replace").splitlines():
            if "event=controller_voters_learned" not in line:
                continue
            named = line.split("voters=", 1)[1].split(" ", 1)[0]
            if sorted(int(entry.split("@", 1)[0]) for entry in named.split(",")) == voters:
                return
        assert time.monotonic() < deadline, f"the broker never learned the voters {voters}"
        time.sleep(0.2)


def _wait_for_broker(bootstrap: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "kraft.cli.main",
                "broker",
                "list",
                "--json",
                "--bootstrap-controller",
                bootstrap,
            ],
            capture_output=True,
            text=True,
            timeout=CALL_TIMEOUT_S,
            cwd=REPO_ROOT,
            check=False,
        )
        if result.returncode == 0 and any(b["state"] == "ACTIVE" for b in json.loads(result.stdout)):
            return
        time.sleep(0.3)
    raise AssertionError("broker 101 never became ACTIVE")
