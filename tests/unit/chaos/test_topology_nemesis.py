"""Topology building, partition shapes, nemeses (against a fake API and the real proxy), the scheduler."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Iterator
from itertools import count

import pytest

from chaos import grudges
from chaos.nemesis import (
    CutMode,
    FlakyLinkNemesis,
    FlakySpec,
    KillNemesis,
    NemesisScheduler,
    PartitionNemesis,
    PauseNemesis,
    Targets,
    choose_targets,
)
from chaos.proxy import BackgroundProxyServer
from chaos.proxy.client import ToxiproxyClient, ToxiproxyError
from chaos.topology import CLIENT, Topology, build_topology, kraft_links

CONTROLLERS = ["controller-1", "controller-2", "controller-3"]
BROKERS = ["broker-101", "broker-102"]
LISTENERS = {name: ("127.0.0.1", 9000 + i) for i, name in enumerate([*CONTROLLERS, *BROKERS])}


def _ports() -> Iterator[int]:
    return iter(count(20000))


def _topology() -> Topology:
    ports = _ports()
    return build_topology(LISTENERS, kraft_links(CONTROLLERS, BROKERS), port_for=lambda: next(ports))


class FakeProxies:
    """Records the API calls a nemesis makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def add_toxic(
        self,
        proxy: str,
        name: str,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        attributes: dict[str, int] | None = None,
    ) -> object:
        self.calls.append(("add", proxy, name, kind, stream))
        return {}

    def remove_toxic(self, proxy: str, name: str) -> None:
        self.calls.append(("remove", proxy, name))

    def set_enabled(self, name: str, enabled: bool) -> None:
        self.calls.append(("enable" if enabled else "disable", name))


class FakeProcesses:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def kill(self, node: str) -> None:
        self.calls.append(("kill", node))

    def restart(self, node: str) -> None:
        self.calls.append(("restart", node))

    def pause(self, node: str) -> None:
        self.calls.append(("pause", node))

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))

    def leader(self) -> str | None:
        return "controller-2"


def test_every_directed_link_gets_its_own_proxy() -> None:
    topology = _topology()
    # 3*2 controller links + 2*3 broker->controller + 2 broker->broker (replication) + 5 client links
    assert len(topology.links) == 6 + 6 + 2 + 5
    assert ("broker-101", "broker-102") in topology.links and ("broker-102", "broker-101") in topology.links
    ports = [link.listen_port for link in topology.links.values()]
    assert len(set(ports)) == len(ports)
    link = topology.link("controller-1", "controller-2")
    assert link.name == "controller-1_to_controller-2" and link.upstream == "127.0.0.1:9001"
    assert topology.address_of("controller-1", "controller-2") == ("127.0.0.1", link.listen_port)
    assert topology.address_of("controller-1", "controller-1") == ("127.0.0.1", 9000)  # itself: unproxied
    assert ("controller-1", "broker-101") not in topology.links  # controllers never dial brokers
    assert topology.link(CLIENT, "broker-101").upstream == "127.0.0.1:9003"
    assert {p["name"] for p in topology.populate_body()} == {link.name for link in topology.links.values()}
    with pytest.raises(KeyError):
        build_topology(LISTENERS, [("controller-1", "nowhere")])


def test_partition_shapes() -> None:
    rng = random.Random(1)
    assert grudges.isolate("a", ["a", "b", "c"]) == {("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")}
    assert grudges.one_way("a", "b") == {("a", "b")}
    majority, minority, cuts = grudges.majority_split(CONTROLLERS, BROKERS, rng)
    assert len([n for n in majority if n.startswith("controller")]) == 2
    assert len([n for n in minority if n.startswith("controller")]) == 1
    assert all((a in majority) != (b in majority) for a, b in cuts)
    middle, bridge_cuts = grudges.bridge(CONTROLLERS, rng)
    assert all(middle not in pair for pair in bridge_cuts) and len(bridge_cuts) == 2
    assert grudges.describe(grudges.one_way("a", "b")) == "a -/-> b"
    assert grudges.describe(grudges.split(["a"], ["b"])) == "a <-/-> b"


def test_blackhole_partition_adds_and_removes_timeout_toxics_on_both_streams() -> None:
    topology = _topology()
    proxies = FakeProxies()
    nemesis = PartitionNemesis(
        "isolate", proxies, topology, lambda rng: grudges.isolate("controller-1", CONTROLLERS)
    )
    description = nemesis.start(random.Random(0))
    assert "controller-1 <-/-> controller-2" in description
    added = [c for c in proxies.calls if c[0] == "add"]
    assert {c[1] for c in added} == {
        "controller-1_to_controller-2",
        "controller-2_to_controller-1",
        "controller-1_to_controller-3",
        "controller-3_to_controller-1",
    }
    assert all(c[3] == "timeout" for c in added) and len(added) == 8
    nemesis.heal()
    assert len([c for c in proxies.calls if c[0] == "remove"]) == 8
    assert nemesis.heal() == "nothing to heal"


def test_refuse_partition_disables_and_reenables() -> None:
    proxies = FakeProxies()
    nemesis = PartitionNemesis(
        "one-way",
        proxies,
        _topology(),
        lambda rng: grudges.one_way("broker-101", "controller-1"),
        CutMode.REFUSE,
    )
    nemesis.start(random.Random(0))
    nemesis.heal()
    assert proxies.calls == [
        ("disable", "broker-101_to_controller-1"),
        ("enable", "broker-101_to_controller-1"),
    ]


def test_flaky_links_get_the_toxic_on_a_fraction_of_links() -> None:
    proxies = FakeProxies()
    links = _topology().links_between(CONTROLLERS, CONTROLLERS)
    nemesis = FlakyLinkNemesis(
        "latency", proxies, links, FlakySpec("latency", {"latency": 50, "jitter": 20}), 0.5
    )
    description = nemesis.start(random.Random(3))
    assert description.startswith("latency(jitter=20,latency=50, toxicity=1)")
    assert len(proxies.calls) == 3 * 2
    nemesis.heal()
    assert len(proxies.calls) == 12


def test_process_nemeses_target_and_undo() -> None:
    control = FakeProcesses()
    kill = KillNemesis("kill-leader", control, CONTROLLERS, Targets.LEADER)
    assert kill.start(random.Random(0)) == "killed controller-2"
    kill.heal()
    pause = PauseNemesis("pause", control, CONTROLLERS)
    pause.start(random.Random(0))
    pause.heal()
    assert [c[0] for c in control.calls] == ["kill", "restart", "pause", "resume"]
    assert control.calls[2][1] == control.calls[3][1]
    assert len(choose_targets(Targets.MINORITY, ["a", "b", "c", "d", "e"], random.Random(0), None)) == 2
    for seed in range(5):  # two of three brokers: below min.insync.replicas=2 for every partition
        two = choose_targets(Targets.ALL_BUT_ONE, ["b1", "b2", "b3"], random.Random(seed), None)
        assert len(set(two)) == 2 and set(two) < {"b1", "b2", "b3"}


async def test_scheduler_runs_seeded_rounds_and_always_heals() -> None:
    proxies = FakeProxies()
    topology = _topology()
    nemeses = [
        PartitionNemesis(
            "isolate", proxies, topology, lambda rng: grudges.isolate(rng.choice(CONTROLLERS), CONTROLLERS)
        ),
        FlakyLinkNemesis(
            "slicer",
            proxies,
            topology.links_between(CONTROLLERS, CONTROLLERS),
            FlakySpec("slicer", {"average_size": 64, "size_variation": 16, "delay": 10}),
        ),
    ]
    first = NemesisScheduler(nemeses, seed=5, quiet_s=(0.01, 0.02), fault_s=(0.01, 0.02))
    await asyncio.wait_for(first.run(0.3), timeout=10)
    assert first.events and first.events[-1].action == "heal"
    assert [e.action for e in first.events] == ["start", "heal"] * (len(first.events) // 2)
    assert not any(n.active for n in nemeses)
    replay = NemesisScheduler(nemeses, seed=5, quiet_s=(0.01, 0.02), fault_s=(0.01, 0.02))
    await asyncio.wait_for(replay.run(0.3), timeout=10)
    shared = min(len(first.events), len(replay.events))
    assert [e.description for e in first.events[:shared]] == [e.description for e in replay.events[:shared]]


async def test_scheduler_holds_a_fault_at_least_its_min_hold() -> None:
    nemesis = PartitionNemesis(
        "cut", FakeProxies(), _topology(), lambda rng: grudges.one_way("controller-1", "controller-2")
    )
    nemesis.min_hold_s = 0.2
    scheduler = NemesisScheduler([nemesis], seed=1, quiet_s=(0.0, 0.01), fault_s=(0.01, 0.02))
    await asyncio.wait_for(scheduler.run(0.5), timeout=10)
    start, heal = scheduler.events[0], scheduler.events[1]
    assert (start.action, heal.action) == ("start", "heal")
    assert heal.time_ns - start.time_ns >= 200_000_000  # drawn 10-20 ms, held 200 ms


async def test_cancelled_scheduler_heals_the_active_fault() -> None:
    proxies = FakeProxies()
    nemesis = PartitionNemesis(
        "cut", proxies, _topology(), lambda rng: grudges.one_way("controller-1", "controller-2")
    )
    scheduler = NemesisScheduler([nemesis], seed=1, quiet_s=(0.0, 0.01), fault_s=(30.0, 30.0))
    task = asyncio.create_task(scheduler.run(60))
    for _ in range(200):
        if nemesis.active:
            break
        await asyncio.sleep(0.01)
    assert nemesis.active
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not nemesis.active and scheduler.events[-1].action == "heal"


def _wait_until_dropped(server: BackgroundProxyServer, proxy: str, timeout_s: float = 10.0) -> None:
    """Wait until a toxic of ``proxy`` got a piece of data (the proxy's own counter, read across threads)."""
    deadline = time.monotonic() + timeout_s
    while sum(server.server.collection.get(proxy).toxic_chunks.values()) == 0:
        assert time.monotonic() < deadline, f"no data reached a toxic of {proxy} in {timeout_s}s"
        time.sleep(0.005)


def test_partition_through_the_real_proxy_blocks_then_restores_traffic(echo_address: str) -> None:
    host, port = echo_address.rsplit(":", 1)
    listeners = {"server": (host, int(port))}
    topology = build_topology(listeners, [("a", "server"), ("b", "server")])
    with BackgroundProxyServer(port=0, seed=1) as server:
        client = ToxiproxyClient(server.url)
        try:
            client.populate(topology.populate_body())
            nemesis = PartitionNemesis("cut-a", client, topology, lambda rng: grudges.one_way("a", "server"))
            a_sock = socket.create_connection(topology.address_of("a", "server"), timeout=5)
            b_sock = socket.create_connection(topology.address_of("b", "server"), timeout=5)
            with a_sock, b_sock:
                nemesis.start(random.Random(0))
                a_sock.sendall(b"x")
                _wait_until_dropped(server, "a_to_server")  # by the cut's blackhole: it can never arrive
                a_sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    a_sock.recv(10)  # no echo and no EOF: blackholed, not closed
                b_sock.sendall(b"y")
                assert b_sock.recv(10) == b"y"  # the other link is untouched
                nemesis.heal()
                a_sock.settimeout(5)
                assert a_sock.recv(10) == b""  # healing closes the blackholed connection
            with socket.create_connection(topology.address_of("a", "server"), timeout=5) as again:
                again.sendall(b"z")
                assert again.recv(10) == b"z"
            with pytest.raises(ToxiproxyError) as missing:
                client.remove_toxic("a_to_server", "nope")
            assert missing.value.status == 404
        finally:
            client.close()


def test_process_nemeses_describe_and_undo_on_the_same_nodes() -> None:
    control = FakeProcesses()
    for nemesis, verbs in (
        (KillNemesis("kill", control, CONTROLLERS, Targets.MINORITY), ("killed", "restarted")),
        (PauseNemesis("pause", control, CONTROLLERS, Targets.MINORITY), ("paused", "resumed")),
    ):
        started = nemesis.start(random.Random(1))
        healed = nemesis.heal()
        assert started.startswith(f"{verbs[0]} ") and healed == f"{verbs[1]} {started.split(' ', 1)[1]}"
        assert nemesis.heal() == "nothing to heal"
    assert [c[0] for c in control.calls] == ["kill", "restart", "pause", "resume"]
