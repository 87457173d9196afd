"""``kraft demo``: a guided tour that drives the ``kraft`` CLI exactly as a user would.

Every step runs one real ``kraft …`` command as a subprocess (``python -m kraft.cli.main``, so no PATH
lookup is needed) and shows it as ``$ kraft …`` before its output: the demo exercises the same code paths
as a user typing the commands, and its transcript doubles as a tutorial.

Running it twice is safe: a demo cluster that is fully running is re-used (new records are produced and
read back from their own offsets); a stopped one is started again; a partly running one is refused with
the command that stops it.  A lock file keeps two concurrent demos on one directory apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Final, TextIO

from kraft.client.channel import set_default_security
from kraft.cluster.manager import ClusterError, LocalCluster

DEFAULT_DEMO_DIR: Final = Path("demo-cluster")
DEMO_TOPIC: Final = "demo-events"
DEMO_PARTITIONS: Final = 3
DEMO_RECORDS: Final = 5
_LOCK_NAME: Final = ".demo.lock"
# Bounds per step: `cluster up` starts every process on a possibly busy machine; the rest are RPCs.
UP_TIMEOUT_S: Final = 120.0
STEP_TIMEOUT_S: Final = 60.0


class DemoError(Exception):
    """The demo cannot go on; the message is the one line for the user."""


@dataclass(frozen=True, slots=True)
class StepResult:
    returncode: int
    stdout: str
    stderr: str


# Runs ``kraft <args>``; ``capture`` False lets the child write straight to the terminal (progress).
StepRunner = Callable[[Sequence[str], bool, float], StepResult]


def run_kraft_subprocess(args: Sequence[str], capture: bool, timeout_s: float) -> StepResult:
    """The real step runner: ``python -m kraft.cli.main <args>``, bounded by ``timeout_s``."""
    command = [sys.executable, "-m", "kraft.cli.main", *args]
    try:
        done = subprocess.run(
            command,
            capture_output=capture,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DemoError(f"`kraft {shlex.join(args)}` did not finish within {timeout_s:g} s") from None
    return StepResult(done.returncode, done.stdout or "", done.stderr or "")


@dataclass
class Demo:
    """The demo's plan for one directory; :meth:`run` executes it and writes the transcript to ``out``."""

    directory: Path
    brokers: int = 3
    run_step: StepRunner = run_kraft_subprocess
    out: TextIO = field(default_factory=lambda: sys.stdout)
    tls: bool = False
    """Create the cluster with ``cluster up --tls``; every later step then passes ``--command-config``."""
    _step: int = field(default=0, init=False)
    _client_args: tuple[str, ...] = field(default=(), init=False)

    STEPS: ClassVar[int] = 7

    def run(self) -> None:
        if self.brokers < 1:
            raise DemoError("the demo needs at least one broker (--brokers 1 or more)")
        self.directory.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(self.directory / _LOCK_NAME):
            self._run_locked()

    # --- steps ----------------------------------------------------------------------------------------

    def _run_locked(self) -> None:
        cluster = self._start_cluster()
        if cluster.spec.tls:
            self._client_args = ("--command-config", str(cluster.layout.client_properties))
        controllers = ",".join(node.target for node in cluster.spec.controllers)
        servers = ",".join(node.target for node in cluster.spec.brokers)
        replication = min(3, len(cluster.spec.brokers))

        self._header(f"creating topic {DEMO_TOPIC} ({DEMO_PARTITIONS} partitions, replication {replication})")
        self._show(
            "topic", "create", DEMO_TOPIC, "--partitions", str(DEMO_PARTITIONS),
            "--replication-factor", str(replication), "--if-not-exists",
            "--bootstrap-controller", controllers,
        )  # fmt: skip
        self._show("topic", "describe", DEMO_TOPIC, "--bootstrap-controller", controllers)

        stamp = time.strftime("%H:%M:%S")
        values = [f"hello kraft #{i} ({stamp})" for i in range(1, DEMO_RECORDS + 1)]
        self._header(f"producing {len(values)} records to {DEMO_TOPIC}-0 through its leader")
        value_args = [arg for value in values for arg in ("--value", value)]
        produced = self._show(
            "produce", "--bootstrap-server", servers, "--topic", DEMO_TOPIC, *value_args, "--json"
        )
        base_offset = _json_field(produced, "base_offset")

        self._header(f"consuming them back from offset {base_offset}")
        consumed = self._show(
            "consume", "--bootstrap-server", servers, "--topic", DEMO_TOPIC,
            "--offset", str(base_offset), "--max-records", str(len(values)),
        )  # fmt: skip
        if consumed.splitlines() != values:
            raise DemoError(f"read back {consumed.splitlines()!r}, expected {values!r}")

        self._header("the controller quorum (kafka-metadata-quorum.sh describe)")
        self._show("quorum", "describe", "--status", "--bootstrap-controller", controllers)
        self._show("quorum", "describe", "--replication", "--bootstrap-controller", controllers)

        self._header("the brokers as the active controller sees them")
        self._show("broker", "list", "--bootstrap-controller", controllers)

        self._header("done")
        directory = shlex.quote(str(self.directory))
        self._say(
            f"The demo cluster keeps running in {self.directory}. Try:\n"
            f"  kraft cluster status --dir {directory}\n"
            f"  kraft cluster stop 1 --kill --dir {directory}   # crash a controller, then:\n"
            f"  kraft quorum describe --status --bootstrap-controller {controllers}"
            f"{' ' + shlex.join(self._client_args) if self._client_args else ''}\n"
            f"Stop it with:\n"
            f"  kraft cluster down --dir {directory}            # add --purge to delete its files"
        )

    def _start_cluster(self) -> LocalCluster:
        """Create, restart or re-use the demo cluster; refuse a half-running one."""
        directory = str(self.directory)
        try:
            existing: LocalCluster | None = LocalCluster.open(self.directory)
        except ClusterError:
            existing = None
        if existing is not None:
            running = existing.running()
            every = {node.name for node in existing.spec.nodes}
            if running and set(running) != every:
                stopped = ", ".join(sorted(every - set(running)))
                raise DemoError(
                    f"the demo cluster in {directory} is only partly running ({stopped} stopped); "
                    f"stop it with `kraft cluster down --dir {directory}` (or start the missing nodes with "
                    f"`kraft cluster start NODE --dir {directory}`) and run the demo again"
                )
            if running:
                self._header(f"re-using the demo cluster already running in {directory}")
                self._show("cluster", "status", "--dir", directory)
                self._check_healthy(existing)
                return existing
        what = "starting the existing" if existing is not None else "starting a new"
        self._header(f"{what} local cluster in {directory}: 3 controllers, {self.brokers} broker(s)")
        args = ["cluster", "up", "--dir", directory, "--timeout", f"{UP_TIMEOUT_S:g}"]
        if existing is None:
            args += ["--brokers", str(self.brokers)] + (["--tls"] if self.tls else [])
        self._echo_command(args)
        # No capture: `cluster up` draws its own progress spinner and prints its own one-line error.
        try:
            result = self.run_step(args, False, UP_TIMEOUT_S + 30)
        except DemoError as exc:
            # The killed `cluster up` could not stop the nodes it had started: say how to.
            raise DemoError(
                f"{exc}; stop what it started with `kraft cluster down --dir {directory}`"
            ) from None
        if result.returncode != 0:
            raise DemoError(f"`kraft cluster up` failed (exit {result.returncode}); see its error above")
        return LocalCluster.open(self.directory)

    def _check_healthy(self, cluster: LocalCluster) -> None:
        set_default_security(cluster.client_security())
        status = cluster.status()
        if not status.healthy:
            raise DemoError(
                f"the running demo cluster is not healthy ({status.summary()}); "
                f"stop it with `kraft cluster down --dir {self.directory}` and run the demo again"
            )

    # --- output helpers -------------------------------------------------------------------------------

    def _header(self, text: str) -> None:
        self._step += 1
        self._say(f"\n==> [{self._step}/{self.STEPS}] {text}")

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _echo_command(self, args: Sequence[str]) -> None:
        self._say(f"$ kraft {shlex.join(args)}")

    def _show(self, *args: str) -> str:
        """Run one command, print it and its output; DemoError (with its error line) if it fails."""
        if args[0] != "cluster":  # `kraft cluster` finds a TLS cluster's client.properties by itself
            args = (*args, *self._client_args)
        self._echo_command(args)
        result = self.run_step(args, True, STEP_TIMEOUT_S)
        if result.stdout:
            self.out.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
            self.out.flush()
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            why = lines[-1].removeprefix("error: ") if lines else f"exit {result.returncode}"
            raise DemoError(
                f"`kraft {_command_name(args)}` failed: {why} "
                f"(the cluster keeps running; stop it with `kraft cluster down --dir {self.directory}`)"
            )
        return result.stdout


def _command_name(args: Sequence[str]) -> str:
    """The words before the first option (``topic create demo-events``), for error messages."""
    words: list[str] = []
    for arg in args:
        if arg.startswith("-"):
            break
        words.append(arg)
    return " ".join(words)


def _json_field(text: str, key: str) -> int:
    try:
        value = json.loads(text)[key]
    except (ValueError, KeyError, TypeError):
        raise DemoError(f"unexpected output (no {key!r} in it): {text.strip()[:200]}") from None
    return int(value)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock on ``path``: a second concurrent demo fails at once."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DemoError(
                f"another `kraft demo` is running on {path.parent}; wait for it to finish"
            ) from None
        yield
    finally:
        os.close(fd)  # closing releases the lock
