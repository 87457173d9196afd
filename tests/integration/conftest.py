"""Fixtures for tests that run real kraft processes on loopback.

``quorum_factory(size=3, overrides={...}, test_append=True)`` returns an unstarted
:class:`kraft.cluster.quorum.ControllerQuorum` under the test's tmp dir; every quorum it made is killed at
teardown, and a failing test gets every node's log tail in its report.  ``quorum`` is a started 3-node
quorum.  The machinery itself lives in :mod:`kraft.cluster.quorum`, shared with the benchmarks.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

import pytest

from kraft.cluster.quorum import ControllerQuorum, QuorumFactory

# Timeouts shorter than Kafka's defaults keep the tests quick, yet loose enough for a busy 2-core box.
TEST_PROFILE: dict[str, str] = {
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.fetch.timeout.ms": "1500",
    "controller.quorum.election.backoff.max.ms": "500",
    "controller.quorum.fetch.max.wait.ms": "200",
    "controller.quorum.append.linger.ms": "5",
}


@pytest.fixture
def quorum_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[QuorumFactory]:
    made: list[ControllerQuorum] = []

    def make(
        size: int = 3, overrides: Mapping[str, str] | None = None, test_append: bool = True
    ) -> ControllerQuorum:
        quorum = ControllerQuorum(
            tmp_path / f"quorum{len(made)}",
            size=size,
            overrides={**TEST_PROFILE, **(overrides or {})},
            test_append=test_append,
        )
        made.append(quorum)
        return quorum

    try:
        yield make
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for quorum in made:
                print(quorum.diagnostics(lines=60))
        for quorum in made:
            quorum.close()


@pytest.fixture
def quorum(quorum_factory: QuorumFactory) -> ControllerQuorum:
    started = quorum_factory()
    started.start()
    return started


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Keep the call-phase report on the item so the fixture above knows whether the test failed.
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
