"""Executed docs: every ``kraft`` command shown in README.md and docs/operations.md runs against one live
local cluster, and its output must have the shape the doc shows (exit status, ``error: CODE`` lines, table
columns, ``Key: value`` keys, JSON keys, the wording of each sample sentence) — so the docs cannot drift
from the CLI again.

How the docs are read (prompts, sample output, the ``<!-- doc-test: … -->`` markers that skip a command
with its reason, add setup, or order a block) is ``doc_examples.py``.  A command shown in those docs is
either executed here or skipped by a marker that says why; nothing else is possible, so a new command in
the docs is executed by this test from the day it is written.

The cluster is the one the docs start: operations.md's ``kraft cluster up --dir /tmp/c --profile fast``
sample (3 controllers, 3 brokers) runs first and its ``kraft cluster down`` sample last.  Placeholders
of the docs (``/tmp/c``, ``./kc``, ``$BC``, ``127.0.0.1:PORT``…) become that cluster's values, and
``KRAFT_CLUSTER_DIR`` names it (the docs' commands without a bootstrap list rely on it).  Plain commands
run in-process (``kraft.cli.main.run``: no interpreter start per command); a command line with a pipe or
``$(…)`` runs in bash with ``kraft`` bound to this checkout.

The second test checks that every event name the docs tell operators to look for (``event=NAME``, the
first column of an ``| event |`` table) in README.md and docs/ is logged by the code (a string literal in
``kraft/`` or ``chaos/``).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doc_examples import Block, Example, documented_events, load_blocks, shape_problems

import kraft.cli.main as cli_main
from kraft.cluster.manager import ClusterError, LocalCluster
from kraft.cluster.spec import NodeRole

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/operations.md")
SHELL_TIMEOUT_S = 60.0
# A command line that needs a shell: pipes, lists, redirections, substitutions, variables.
_NEEDS_SHELL = re.compile(r"[|&;<>`$]")
# The cluster directory as the docs spell it.
_CLUSTER_DIR = re.compile(r"(?<![\w/.])(?:\./kc|/tmp/kc|/tmp/c)(?![\w.-])")


@dataclass
class Session:
    """The live cluster the docs' commands run against, known once its ``cluster up`` ran."""

    directory: Path
    bootstrap_controller: str = ""
    bootstrap_server: str = ""
    timings: list[tuple[float, str]] = field(default_factory=list)

    def learn_endpoints(self) -> None:
        try:
            status = LocalCluster.open(self.directory).status()
        except ClusterError:
            return  # not created yet (the docs' commands before `cluster up` use only the directory)
        self.bootstrap_controller = status.bootstrap(NodeRole.CONTROLLER)
        self.bootstrap_server = status.bootstrap(NodeRole.BROKER)

    def substitute(self, command: str) -> str:
        """The doc's command with its placeholders replaced by this cluster's values."""
        text = _CLUSTER_DIR.sub(str(self.directory), command)
        for placeholder, value in (
            ("127.0.0.1:BROKER_PORT", self.bootstrap_server),
            ("127.0.0.1:PORT", self.bootstrap_controller),
            ("$BC", self.bootstrap_controller),
            ("$BS", self.bootstrap_server),
        ):
            if placeholder in text:
                assert value, f"{placeholder} used before the cluster is up: {command}"
                text = text.replace(placeholder, value)
        return text

    def run(self, command: str) -> tuple[int, str, str]:
        """Run one command line of the docs (already substituted): exit status, stdout, stderr."""
        started = time.monotonic()
        if _NEEDS_SHELL.search(command):
            script = f'kraft() {{ "{sys.executable}" -m kraft.cli.main "$@"; }}\nset -o pipefail\n{command}\n'
            done = subprocess.run(
                ["bash", "-c", script],
                capture_output=True,
                text=True,
                timeout=SHELL_TIMEOUT_S,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            code, out, err = done.returncode, done.stdout, done.stderr
        else:
            words = shlex.split(command)
            assert words[0] == "kraft", command
            out_buffer, err_buffer = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out_buffer), contextlib.redirect_stderr(err_buffer):
                try:
                    code = cli_main.run(words[1:])
                except Exception:
                    # A crash is a finding like any other: report it with the rest, keep going.
                    code = -1
                    traceback.print_exc()
            out, err = out_buffer.getvalue(), err_buffer.getvalue()
        self.timings.append((time.monotonic() - started, command))
        return code, out, err


def _report(example: Example, command: str, problems: list[str], out: str, err: str) -> str:
    return (
        f"{example.where}: $ {command}\n"
        + "".join(f"    - {problem}\n" for problem in problems)
        + f"    stdout: {out[:600]!r}\n    stderr: {err[:300]!r}"
    )


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Session]:
    directory = tmp_path / "c"
    monkeypatch.setenv("KRAFT_CLUSTER_DIR", str(directory))
    current = Session(directory)
    try:
        yield current
    finally:
        with contextlib.suppress(ClusterError):
            LocalCluster.open(directory).down(timeout_s=5)


def test_every_command_in_the_docs_runs_with_the_output_shape_shown(session: Session) -> None:
    blocks: list[Block] = load_blocks(REPO_ROOT, DOCUMENTS)
    failures: list[str] = []
    executed, skipped = 0, list[Example]()
    started = time.monotonic()
    for block in blocks:
        runnable = [e for e in block.examples if e.skip_reason is None]
        skipped.extend(e for e in block.examples if e.skip_reason is not None)
        if not runnable:
            continue
        for command, reason in block.setup:
            real = session.substitute(command)
            code, out, err = session.run(real)
            if code != 0:
                failures.append(
                    _report(Example(block.where, command, ()), real, [f"setup ({reason})"], out, err)
                )
        for example in runnable:
            real = session.substitute(example.command)
            code, out, err = session.run(real)
            executed += 1
            problems = shape_problems(example, code, out, err)
            if problems:
                failures.append(_report(example, real, problems, out, err))
            if not session.bootstrap_controller:
                session.learn_endpoints()  # after the docs' `cluster up`
    elapsed = time.monotonic() - started
    print(f"{executed} doc commands executed in {elapsed:.1f} s; {len(skipped)} skipped:")
    for example in skipped:
        print(f"  {example.where}: {example.command[:90]}  ({example.skip_reason})")
    for seconds, command in sorted(session.timings, reverse=True)[:8]:
        print(f"  [{seconds:5.2f} s] {command[:100]}")
    assert executed >= 40, f"only {executed} commands executed: did the docs' markup change?"
    assert not failures, f"{len(failures)} doc commands differ from the docs:\n" + "\n".join(failures)


# --- event names ------------------------------------------------------------------------------------


def source_text(*roots: Path) -> str:
    return "\n".join(
        path.read_text(encoding="utf-8") for root in roots for path in sorted(root.rglob("*.py"))
    )


def test_event_names_in_the_docs_are_logged_by_the_code() -> None:
    # Every doc, not only the executed ones: an operator greps for what any of them names.
    source = source_text(REPO_ROOT / "kraft", REPO_ROOT / "chaos")
    documents = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    named = {doc.relative_to(REPO_ROOT).as_posix(): documented_events(doc.read_text()) for doc in documents}
    assert named["docs/operations.md"] >= {"broker_session_expired", "partition_logs_closed"}, named
    missing = {
        doc: sorted(name for name in names if f'"{name}"' not in source and f"'{name}'" not in source)
        for doc, names in named.items()
    }
    missing = {doc: names for doc, names in missing.items() if names}
    assert not missing, f"event names the docs show but the code never logs: {missing}"
