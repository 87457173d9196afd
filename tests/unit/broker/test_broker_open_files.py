"""The broker raises its soft open-file limit to the hard limit at start (in a child process, so the test
runner's own limit is left alone)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

CHILD = """
import resource
from kraft.broker.open_files import raise_open_file_limit
from kraft.observability.logging import configure_logging
configure_logging("INFO")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
limit = raise_open_file_limit()
print(limit.before, limit.after, limit.hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def test_the_soft_limit_is_raised_to_the_hard_limit_and_logged() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard open-file limit is too low to observe a raise")
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr
    before, after, reported_hard, now = (int(v) for v in result.stdout.split())
    assert before == 256 and after == now and after > before
    if reported_hard != resource.RLIM_INFINITY:
        assert after == reported_hard
    assert "event=open_file_limit" in result.stderr and "before=256" in result.stderr
