"""Named chaos scenarios: which nemeses a run draws its faults from.

A scenario builds its nemeses for a started :class:`~chaos.harness.ChaosCluster`; the scheduler then
picks among them with the run's seed.  Network faults cut or degrade controller links (and, for splits,
broker→controller links); client links are never cut, as Jepsen never partitions its control node.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from types import MappingProxyType

from chaos import grudges
from chaos.harness import ChaosCluster
from chaos.nemesis import (
    CutMode,
    FlakyLinkNemesis,
    FlakySpec,
    KillNemesis,
    MembershipNemesis,
    Nemesis,
    PartitionNemesis,
    PauseNemesis,
    Targets,
)
from chaos.proxy.client import ToxiproxyClient
from chaos.topology import Topology

ScenarioBuilder = Callable[[ChaosCluster], list[Nemesis]]
ISOLATE_BROKER_MIN_HOLD_S = 5.0
# A fault that takes a partition's ISR below min.insync.replicas shows it only after the leader drops the
# lagging followers (replica.lag.time.max.ms, 1.5 s in data-plane runs, plus its check) and the controller's
# ISR change is back in the leader's metadata: ~3 s after the fault on a quiet host, more on a busy one.  A
# shorter hold healed before any acks=all produce could be refused (seed 50's 3.0 s cut, under the full
# suite's load: 0 refused, so the run checked nothing of the refusal).
UNDER_MIN_ISR_MIN_HOLD_S = 5.0


def _parts(cluster: ChaosCluster) -> tuple[ToxiproxyClient, Topology, list[str], list[str]]:
    if cluster.proxies is None or cluster.topology is None:
        raise RuntimeError("start the chaos cluster before building its nemeses")
    controllers = [c.name for c in cluster.controllers]
    brokers = [b.name for b in cluster.brokers]
    return cluster.proxies, cluster.topology, controllers, brokers


def isolate(cluster: ChaosCluster) -> list[Nemesis]:
    proxies, topology, controllers, brokers = _parts(cluster)
    everyone = [*controllers, *brokers]

    def shape(rng: random.Random) -> grudges.Cuts:
        return grudges.isolate(rng.choice(controllers), everyone)

    return [PartitionNemesis("isolate-one", proxies, topology, shape)]


def isolate_leader(cluster: ChaosCluster) -> list[Nemesis]:
    proxies, topology, controllers, brokers = _parts(cluster)
    everyone = [*controllers, *brokers]

    def shape(rng: random.Random) -> grudges.Cuts:
        leader = cluster.leader() or rng.choice(controllers)
        return grudges.isolate(leader, everyone)

    return [PartitionNemesis("isolate-leader", proxies, topology, shape)]


def majority(cluster: ChaosCluster) -> list[Nemesis]:
    proxies, topology, controllers, brokers = _parts(cluster)

    def shape(rng: random.Random) -> grudges.Cuts:
        return grudges.majority_split(controllers, brokers, rng)[2]

    return [PartitionNemesis("majority-split", proxies, topology, shape)]


def bridge(cluster: ChaosCluster) -> list[Nemesis]:
    proxies, topology, controllers, _ = _parts(cluster)

    def shape(rng: random.Random) -> grudges.Cuts:
        return grudges.bridge(controllers, rng)[1]

    return [PartitionNemesis("bridge", proxies, topology, shape)]


def one_way(cluster: ChaosCluster) -> list[Nemesis]:
    proxies, topology, controllers, _ = _parts(cluster)

    def shape(rng: random.Random) -> grudges.Cuts:
        source, target = rng.sample(controllers, 2)
        return grudges.one_way(source, target)

    return [
        PartitionNemesis("one-way-drop", proxies, topology, shape),
        PartitionNemesis("one-way-refuse", proxies, topology, shape, CutMode.REFUSE),
    ]


def flaky(cluster: ChaosCluster) -> list[Nemesis]:
    proxies, topology, controllers, brokers = _parts(cluster)
    links = topology.links_between([*controllers, *brokers], controllers)
    return [
        FlakyLinkNemesis("latency", proxies, links, FlakySpec("latency", {"latency": 80, "jitter": 60})),
        FlakyLinkNemesis(
            "reset-peer", proxies, links, FlakySpec("reset_peer", {"timeout": 200}, 0.5, ("upstream",))
        ),
        FlakyLinkNemesis(
            "slicer",
            proxies,
            links,
            FlakySpec("slicer", {"average_size": 64, "size_variation": 32, "delay": 200}),
        ),
    ]


def kill(cluster: ChaosCluster) -> list[Nemesis]:
    controllers = [c.name for c in cluster.controllers]
    return [
        KillNemesis("kill-one", cluster, controllers, Targets.ONE),
        KillNemesis("kill-leader", cluster, controllers, Targets.LEADER),
    ]


def pause(cluster: ChaosCluster) -> list[Nemesis]:
    controllers = [c.name for c in cluster.controllers]
    return [
        PauseNemesis("pause-one", cluster, controllers, Targets.ONE),
        PauseNemesis("pause-leader", cluster, controllers, Targets.LEADER),
    ]


def data_plane(cluster: ChaosCluster) -> list[Nemesis]:
    """Broker faults under acks=all producers and consumers (issue #16) on a topic with
    ``min.insync.replicas=2``:

    - kill or pause one broker, or cut one off from the controllers and the other brokers (its followers
      stop fetching, it is fenced, its partitions move, and until its lease lapses it still believes it
      leads — the zombie leader; clients, consumers included, still reach it);
    - kill two of the three brokers: the survivor's ISRs fall below the minimum, acks=all is refused;
    - cut one broker's replication links only (it keeps the controllers): as leader it shrinks its ISR
      to itself and must refuse acks=all; as follower it leaves the ISR;
    - slow and lossy replication links on half of the broker→broker links: latency, a bandwidth cap, or
      connections that stall and close (Toxiproxy ``timeout`` drawn per connection).
    """
    proxies, topology, controllers, brokers = _parts(cluster)
    everyone = [*controllers, *brokers]

    def shape(rng: random.Random) -> grudges.Cuts:
        return grudges.isolate(rng.choice(brokers), everyone)

    def replication(rng: random.Random) -> grudges.Cuts:
        return grudges.isolate(rng.choice(brokers), brokers)

    links = topology.links_between(brokers, brokers)
    isolated = PartitionNemesis("isolate-broker", proxies, topology, shape)
    # Past the broker session (fast profile: 3 s), an election and the new leader's metadata: the
    # isolated broker is replaced while it still believes it leads (and serves its consumers).
    isolated.min_hold_s = ISOLATE_BROKER_MIN_HOLD_S
    kill_two = KillNemesis("kill-two-brokers", cluster, brokers, Targets.ALL_BUT_ONE)
    kill_two.min_hold_s = UNDER_MIN_ISR_MIN_HOLD_S
    cut = PartitionNemesis("cut-replication", proxies, topology, replication)
    cut.min_hold_s = UNDER_MIN_ISR_MIN_HOLD_S
    return [
        KillNemesis("kill-broker", cluster, brokers, Targets.ONE),
        PauseNemesis("pause-broker", cluster, brokers, Targets.ONE),
        isolated,
        kill_two,
        cut,
        FlakyLinkNemesis(
            "slow-replication", proxies, links, FlakySpec("latency", {"latency": 150, "jitter": 100})
        ),
        FlakyLinkNemesis("narrow-replication", proxies, links, FlakySpec("bandwidth", {"rate": 16})),
        FlakyLinkNemesis("lossy-replication", proxies, links, FlakySpec("timeout", {"timeout": 300}, 0.5)),
    ]


def membership(cluster: ChaosCluster) -> list[Nemesis]:
    """Voter changes (KIP-853) on a dynamic quorum: remove a voter (the leader too) and add it back —
    alone, with one controller or the leader cut off, or across a majority split; the removal and the
    first add happen while the cut is in place — or wipe a voter's disk (it comes back under a new
    directory id, an observer, while its old key is still a voter) and replace the stale key by the new
    one (``chaos.nemesis.MembershipNemesis``)."""
    proxies, topology, controllers, brokers = _parts(cluster)
    everyone = [*controllers, *brokers]

    def one(rng: random.Random) -> grudges.Cuts:
        return grudges.isolate(rng.choice(controllers), everyone)

    def leader(rng: random.Random) -> grudges.Cuts:
        return grudges.isolate(cluster.leader() or rng.choice(controllers), everyone)

    def split(rng: random.Random) -> grudges.Cuts:
        return grudges.majority_split(controllers, brokers, rng)[2]

    return [
        MembershipNemesis("remove-add", cluster),
        MembershipNemesis("replace-wiped", cluster, wipe=True),
        MembershipNemesis(
            "remove-add-isolated-one", cluster, PartitionNemesis("isolate-one", proxies, topology, one)
        ),
        MembershipNemesis(
            "remove-add-isolated-leader",
            cluster,
            PartitionNemesis("isolate-leader", proxies, topology, leader),
        ),
        MembershipNemesis(
            "remove-add-majority-split",
            cluster,
            PartitionNemesis("majority-split", proxies, topology, split),
        ),
    ]


def mixed(cluster: ChaosCluster) -> list[Nemesis]:
    return [
        *isolate_leader(cluster),
        *majority(cluster),
        *one_way(cluster),
        *flaky(cluster),
        *kill(cluster),
        *pause(cluster),
    ]


SCENARIOS: Mapping[str, ScenarioBuilder] = MappingProxyType(
    {
        "isolate": isolate,
        "isolate-leader": isolate_leader,
        "majority": majority,
        "bridge": bridge,
        "one-way": one_way,
        "flaky": flaky,
        "kill": kill,
        "pause": pause,
        "mixed": mixed,
        "data-plane": data_plane,
        "membership": membership,
    }
)


DATA_PLANE_SCENARIOS = frozenset({"data-plane"})
"""Scenarios that also run the replicated acks=all workload and its checkers (3 brokers or more)."""
DATA_PLANE_MIN_BROKERS = 3
DYNAMIC_SCENARIOS = frozenset({"membership"})
"""Scenarios run on a dynamic quorum (KIP-853: grown with add-controller, voters changed by the nemesis);
they add the ``voters-restored`` checker."""


def scenario_names(selection: str) -> list[str]:
    """``all`` → every scenario; otherwise the one name (ValueError listing the known names)."""
    if selection == "all":
        return list(SCENARIOS)
    if selection not in SCENARIOS:
        raise ValueError(f"unknown scenario {selection!r}: expected all or one of {', '.join(SCENARIOS)}")
    return [selection]
