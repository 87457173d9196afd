"""Every chaos scenario, short, against a real 3-controller, 1-broker cluster with every link proxied.

Each run gets its own cluster (fresh processes and data): sharing one would let a fault of one scenario
leak into the next one's verdicts.  A failure names the seed and the ``kraft chaos run`` command that
replays it (same fault schedule and workload; see docs/chaos.md).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest
from chaos_checked_run import SUITE_DURATION_S, run_checked, suite_options

from chaos.history import EventType, Operation, load_events, pair_operations
from chaos.scenarios import DATA_PLANE_SCENARIOS, DYNAMIC_SCENARIOS, SCENARIOS

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(150)]

# One fixed seed per scenario so the suite is reproducible; tests/chaos/chaos_regressions.py adds seeds that
# once found bugs (replayed by test_chaos_regressions.py).
SUITE_SEEDS = {
    "isolate": 21,
    "isolate-leader": 11,
    "majority": 23,
    "bridge": 24,
    "one-way": 25,
    "flaky": 26,
    "kill": 22,
    "pause": 38,
    "mixed": 29,
    # cut-replication held 3 s (the leader shrinks its ISR below min.insync.replicas=2 and refuses
    # acks=all), lossy replication links, then an isolated broker (a zombie leader consumers still read).
    "data-plane": 50,
    # Short form: one round, which this seed makes replace-wiped on controller-1, the leader (its disk
    # dies, it comes back under a new directory id while its old key is still a voter; the others elect
    # a leader and the stale key is replaced); the long form adds remove-add under an isolated voter.
    "membership": 41,
}
# Per-scenario durations where the default would not fit the suite's time budget.  A membership round
# takes 5-10 s by itself (a wiped controller restarts and catches up from offset 0, a change blocked by
# a cut waits out its timeout), so its short form starts exactly one: its quiet window (< 0.8 s) plus any
# round outlast 4 s, after which the scheduler starts nothing new.
SUITE_DURATIONS = {"membership": 4.0}
# Checkers every run must report (all must PASS); the runner adds them only when their inputs exist.
REQUIRED_CHECKERS = {
    "linearizable-topic",
    "no-lost-acknowledged",
    "no-failed-visible",
    "committed-logs-identical",
    "broker-image-equals-controller",
    "single-leader-per-epoch",
    "fenced-broker-never-acks",
    "liveness-after-heal",
}
# The data-plane scenario (acks=all producers on a replication-factor-3 topic over 3 brokers) adds these.
DATA_PLANE_CHECKERS = {
    "acks-all-at-their-offsets",
    "replicas-identical-below-hwm",
    "consumed-records-in-final-log",
    "acks-all-refused-under-min-isr",
    "refused-records-never-written",
}
# Scenarios on a dynamic quorum (voters removed and added by the nemesis) add this one.
DYNAMIC_CHECKERS = {"voters-restored"}


def test_every_scenario_has_a_suite_seed() -> None:
    assert set(SUITE_SEEDS) == set(SCENARIOS)


# The long forms of scenarios whose short form above is cut to one round: KRAFT_CHAOS_ALL=1 (or
# `kraft chaos run --scenario membership --seed 41 --duration 8`), ~60 s: a removal under a cut can stall
# the quorum until the heal, as it should, and each blocked change waits out its timeout.
LONG_FORMS = {"membership": 8.0}
OPT_IN_ENV = "KRAFT_CHAOS_ALL"


@pytest.mark.parametrize("scenario", list(SUITE_SEEDS))
async def test_scenario_passes_every_checker(tmp_path: Path, scenario: str) -> None:
    await _run_and_check(tmp_path, scenario, SUITE_DURATIONS.get(scenario, SUITE_DURATION_S))


@pytest.mark.skipif(not os.environ.get(OPT_IN_ENV), reason=f"opt-in: set {OPT_IN_ENV}=1")
@pytest.mark.parametrize("scenario", list(LONG_FORMS))
async def test_long_form_passes_every_checker(tmp_path: Path, scenario: str) -> None:
    await _run_and_check(tmp_path, scenario, LONG_FORMS[scenario])


async def _run_and_check(tmp_path: Path, scenario: str, duration_s: float) -> None:
    data_plane = scenario in DATA_PLANE_SCENARIOS
    options = suite_options(
        tmp_path, scenario, SUITE_SEEDS[scenario], duration_s, brokers=3 if data_plane else 1
    )
    report = await run_checked(options)
    required = (
        REQUIRED_CHECKERS
        | (DATA_PLANE_CHECKERS if data_plane else set())
        | (DYNAMIC_CHECKERS if scenario in DYNAMIC_SCENARIOS else set())
    )
    assert {v.checker for v in report.verdicts} == required
    assert any(e.action == "start" for e in report.nemesis_events), "no fault was injected"
    assert report.nemesis_events[-1].action == "heal", "the run ended with a fault still active"
    acknowledged = [op for op in report.operations if op.outcome is EventType.OK]
    assert sum(op.f in ("create", "delete") for op in acknowledged) >= 10, "almost no topic progress"
    assert any(op.f == "produce" for op in acknowledged), "no produce was acknowledged"
    if scenario in DYNAMIC_SCENARIOS:
        # The voter change the run exists for happened: a disk was wiped (a stale voter key) or a voter
        # removed; voters-restored then checks every controller ended a voter under its own directory id.
        changes = " ".join(e.description for e in report.nemesis_events)
        assert "wiped controller-" in changes or "removed controller-" in changes, changes
    if data_plane:
        acked_all = sum(op.f == "produce-all" for op in acknowledged)
        assert acked_all >= 10, f"only {acked_all} acks=all produces were acknowledged"
        refused = next(v for v in report.verdicts if v.checker == "acks-all-refused-under-min-isr")
        assert refused.details["refused"] >= 1, "no acks=all produce was refused under min.insync.replicas"
    await _assert_artefacts(options.report_dir, scenario, options.reproduce_command(), report.operations)


async def _assert_artefacts(
    directory: Path, scenario: str, command: str, operations: list[Operation]
) -> None:
    """What a failed run leaves behind to debug it: history, JSON and HTML with the reproduce command."""
    summary = json.loads((directory / "report.json").read_text())
    assert summary["valid"] is True and summary["scenario"] == scenario
    assert summary["reproduce"] == command and summary["samples"], "report.json lacks replay data"
    page = (directory / "report.html").read_text()
    assert page.count("<tr") > len(summary["verdicts"]) and html.escape(command) in page
    assert (directory / "operations.png").stat().st_size > 0
    assert (directory / "leaders.png").stat().st_size > 0
    assert pair_operations(await load_events(directory / "history.sqlite")) == operations
