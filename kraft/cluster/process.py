"""One node process of a local cluster: start in the background, find it again by pid file, stop, kill.

Each node runs ``python -m kraft.cli.main <role> start --config <file>`` in its own session (so a
terminal's Ctrl-C does not reach it and its whole process group can be signalled), with stdout and stderr
appended to its log file and its pid in a pid file.  A pid is trusted only while ``/proc/<pid>/cmdline``
still names the node's config file, so a recycled pid never gets a signal meant for a dead node.

A node that ended by itself (fail-stop: one ``event=fatal`` line and exit status 70; or a failed start:
one ``error:`` line, exit 1) leaves its pid file behind; :meth:`NodeProcess.last_exit` reads why from its
log, which is how ``kraft cluster status`` shows it as ``failed`` from another CLI invocation.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kraft.cluster.spec import ClusterLayout, NodeSpec
from kraft.procutil import spawn_logged

_POLL_S: Final = 0.05


class ProcessError(Exception):
    """A node process could not be started or stopped as asked."""


def _is_zombie(pid: int) -> bool:
    """A zombie all of whose threads have exited.  The thread-group leader shows ``Z`` as soon as it
    exits, while the process's other threads — which share its open files, listening sockets included —
    may still be exiting: a node killed with SIGKILL looked gone while its port was still bound, and its
    restart failed with "address in use"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may itself contain spaces.
    if stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] != "Z":
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True  # reaped meanwhile


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _cmdline_mentions(pid: int, needle: str) -> bool:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc to check against: trust the pid file
    return needle in raw.decode(errors="replace").split("\0")


_FATAL_MARK = " event=fatal "
_EXIT_CODE = re.compile(r"\bexit_code=(\d+)")
_LOG_TAIL_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a node's last run ended by itself: the exit code (from the ``fatal`` line's ``exit_code=``,
    1 for an ``error:`` line, or the process's own status when this object started it; None when unknown,
    e.g. after SIGKILL by the OOM killer) and the line that says why (empty when there is none)."""

    code: int | None
    line: str

    @property
    def failed(self) -> bool:
        return bool(self.line) or (self.code is not None and self.code != 0)


@dataclass
class NodeProcess:
    """Start/stop/kill one node; the pid file makes it work across separate CLI invocations."""

    node: NodeSpec
    layout: ClusterLayout
    extra_env: dict[str, str] = field(default_factory=dict)
    _popen: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def config_path(self) -> Path:
        return self.layout.config_path(self.node)

    @property
    def log_path(self) -> Path:
        return self.layout.log_path(self.node)

    @property
    def pid_path(self) -> Path:
        return self.layout.pid_path(self.node)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "kraft.cli.main",
            str(self.node.role),
            "start",
            "--config",
            str(self.config_path),
        ]

    def pid(self) -> int | None:
        """The pid of the running node, or None (no pid file, dead process, or a recycled pid)."""
        if self._popen is not None and self._popen.poll() is None:
            return self._popen.pid
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and _cmdline_mentions(pid, str(self.config_path)):
            return pid
        return None

    def is_running(self) -> bool:
        return self.pid() is not None

    def exit_code(self) -> int | None:
        """The exit status if this object started the process and it has ended, else None."""
        return self._popen.poll() if self._popen is not None else None

    def start(self) -> int:
        """Launch the node in the background; its output is appended to :attr:`log_path`."""
        running = self.pid()
        if running is not None:
            raise ProcessError(f"{self.node.name} is already running (pid {running})")
        for path in (self.log_path, self.pid_path):
            path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._popen = spawn_logged(
            self.command(),
            self.log_path,
            banner=f"# {stamp} starting {self.node.name}: {' '.join(self.command())}",
            extra_env=self.extra_env,
        )
        tmp = self.pid_path.with_suffix(".tmp")
        tmp.write_text(f"{self._popen.pid}\n")
        tmp.replace(self.pid_path)
        return self._popen.pid

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # the node leads its own session: reach any child it spawned too
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._popen is not None and self._popen.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(timeout=_POLL_S)
            if not pid_alive(pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def request_stop(self) -> int | None:
        """Send SIGTERM (graceful shutdown) and return the pid to wait for, or None if not running."""
        pid = self.pid()
        if pid is None:
            self._forget()
            return None
        self._signal(pid, signal.SIGTERM)
        self._signal(pid, signal.SIGCONT)  # a paused node must run to handle its SIGTERM
        return pid

    def finish_stop(self, pid: int | None, timeout_s: float) -> str:
        """Wait for a :meth:`request_stop`; SIGKILL after ``timeout_s``.

        Returns ``"not running"``, ``"stopped"`` (exited after SIGTERM) or ``"killed"``.
        """
        if pid is None:
            return "not running"
        outcome = "stopped"
        if not self._wait_gone(pid, timeout_s):
            # A node that ignored SIGTERM is stuck: its stacks (runtime.enable_stack_dumps) go to its
            # log first, so the kill leaves a record of where.
            self._signal(pid, signal.SIGUSR2)
            self._wait_gone(pid, 0.5)
            self._signal(pid, signal.SIGKILL)
            outcome = "killed"
            if not self._wait_gone(pid, 5.0):
                raise ProcessError(f"{self.node.name} (pid {pid}) survived SIGKILL")
        self._forget()
        return outcome

    def stop(self, timeout_s: float = 15.0) -> str:
        """SIGTERM, then SIGKILL after ``timeout_s``; see :meth:`finish_stop` for the result."""
        return self.finish_stop(self.request_stop(), timeout_s)

    def kill(self) -> bool:
        """SIGKILL at once (a crash, for chaos tests); False when it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        self._signal(pid, signal.SIGKILL)
        if not self._wait_gone(pid, 5.0):
            raise ProcessError(f"{self.node.name} (pid {pid}) survived SIGKILL")
        self._forget()
        return True

    def pause(self) -> None:
        """SIGSTOP: the process stays alive but stops answering (a hung node)."""
        pid = self.pid()
        if pid is None:
            raise ProcessError(f"{self.node.name} is not running")
        self._signal(pid, signal.SIGSTOP)

    def resume(self) -> None:
        pid = self.pid()
        if pid is None:
            raise ProcessError(f"{self.node.name} is not running")
        self._signal(pid, signal.SIGCONT)

    def _forget(self) -> None:
        self.pid_path.unlink(missing_ok=True)

    def last_exit(self) -> ExitInfo | None:
        """How the last run ended when the node is not running although nobody stopped it through this
        module (its pid file is still there); None while it runs or after a stop/kill here."""
        if self.is_running():
            return None
        own = self._popen.poll() if self._popen is not None else None
        if own is None and not self.pid_path.exists():
            return None
        line, code = self._last_failure_line()
        return ExitInfo(own if own is not None else code, line)

    def _last_failure_line(self) -> tuple[str, int | None]:
        """The last ``event=fatal`` line (and its exit code) of the last run, else its last ``error:`` line
        (exit code 1, the CLI's contract), else ("", None)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _LOG_TAIL_BYTES))
                text = log.read().decode(errors="replace")
        except OSError:
            return "", None
        lines = text.splitlines()
        banner = f"starting {self.node.name}:"
        starts = [i for i, line in enumerate(lines) if line.startswith("# ") and banner in line]
        run = lines[starts[-1] + 1 :] if starts else lines
        for line in reversed(run):
            if _FATAL_MARK in line:
                match = _EXIT_CODE.search(line)
                return line.strip(), int(match.group(1)) if match else None
        for line in reversed(run):
            if line.startswith("error:"):
                return line.strip(), 1
        return "", None

    def log_tail(self, lines: int = 5) -> list[str]:
        """The last ``lines`` lines of the node's log (for error messages)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 16384))
                text = log.read().decode(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]
