"""The node's side of intake processes (``controller.intake.processes``): start, watch, stop.

:class:`IntakePool` starts N :mod:`kraft.node.intake_process` children once the node's own server listens
(on the network port with ``SO_REUSEPORT``, and on the unix socket they forward to), waits until each
listens, watches them, and stops them first on the way down.

Fail-stop, not restart: an intake process that exits while the node runs is reported through the node's
supervisor (one ``fatal reason=intake_process_died`` line, exit status 70) and the node goes down with it.
Why: every process bound to the port is in the kernel's ``SO_REUSEPORT`` group, so while one is missing
or restarting, the connections the kernel had queued on its socket are reset and the node answers only
part of its callers; and a helper that died (a crash in gRPC's C core, the OOM killer) is the same class of
failure as any other watched task of the node, which is fail-stop.  A controller quorum tolerates a
controller down, and the operator's supervisor (systemd, Kubernetes) restarts the whole node cleanly.

Children die with the node however it ends (``PR_SET_PDEATHSIG`` via
:func:`kraft.procutil.spawn_child`, and each child polls its parent too); a graceful stop sends SIGTERM,
waits, then SIGKILLs and reaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kraft.config import NodeConfig, _join_host_port
from kraft.grpc_service import ServerLimits
from kraft.observability.logging import StructLogger
from kraft.procutil import spawn_child
from kraft.runtime import GRPC_IO_ENV, GRPC_IOS, configure_grpc_io

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
WATCH_INTERVAL_S = 0.2
SOCKET_DIR = "intake"
SOCKET_NAME = "node.sock"
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


class IntakeConfigError(Exception):
    """The configuration cannot run intake processes (the node refuses to start)."""


INTAKE_GRPC_IO_ENV = "KRAFT_INTAKE_GRPC_IO"
"""gRPC's I/O layer for intake processes (``iomgr`` by default; ``event-engine``): see
:func:`child_environment`."""
DEFAULT_INTAKE_GRPC_IO = "iomgr"


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment an intake process starts with: the node's, with gRPC's I/O layer chosen by
    ``$KRAFT_INTAKE_GRPC_IO`` (default ``iomgr``; an operator's own ``GRPC_EXPERIMENTS`` still wins).

    Why iomgr there and not on the node: EventEngine hops every socket read and write through threads of
    its own before grpc.aio's completion-queue thread wakes the loop, and a call through an intake process
    crosses gRPC twice more — a lone commit four times more (the client's call and its answer, and in
    exclusive mode the followers' fetches both ways): on EventEngine that added 1.3-2 ms to a lone write
    (3.0 → 4.3-5.0 ms p50), on iomgr 0.5 ms (docs/internals/raft-performance.md, "Intake processes, phase 2").
    EventEngine's advantage — its threads keep sockets moving while the loop runs a long turn — is what a
    node running bulk controller work needs; an intake process's loop runs no long turns."""
    env = dict(environ)
    choice = env.get(INTAKE_GRPC_IO_ENV, "").strip() or DEFAULT_INTAKE_GRPC_IO
    if choice not in GRPC_IOS:
        raise IntakeConfigError(f"{INTAKE_GRPC_IO_ENV}={choice!r}: must be one of {', '.join(GRPC_IOS)}")
    env[GRPC_IO_ENV] = choice
    configure_grpc_io(env)
    return env


def check_supported(config: NodeConfig) -> None:
    """What intake processes cannot run with.  (TLS and the authorizer can: each caller's TLS identity and
    address are forwarded, believed by the node only on its unix socket, :mod:`kraft.security.principal`.)"""
    listener = config.controller_listener
    if config.controller_intake_exclusive and listener is not None and listener.port == 0:
        raise IntakeConfigError(
            "controller.intake.exclusive=true needs a fixed CONTROLLER port (the node's own process does "
            "not bind it, the intake processes do)"
        )


def socket_path(config: NodeConfig) -> Path:
    """The unix socket the node serves its intake processes on: in a 0700 directory of the metadata log
    dir (only this user can reach the socket; the socket itself is 0600 too)."""
    base = config.metadata_log_dir or config.all_log_dirs[0]
    return Path(base) / SOCKET_DIR / SOCKET_NAME


def prepare_socket_dir(path: Path) -> None:
    """Create the socket's 0700 directory (fixing its mode if it exists) and remove a stale socket."""
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        raise IntakeConfigError(
            f"the intake socket path {path} is longer than {MAX_UNIX_PATH} bytes (a unix socket limit): "
            "use a shorter metadata.log.dir or controller.intake.processes=0"
        )
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()  # a previous run's; the data-dir lock says no live node owns it


def secure_socket(path: Path) -> None:
    os.chmod(path, 0o600)


def write_tls_config(config: NodeConfig, directory: Path) -> Path:
    """The node's configuration for its intake processes' TLS listener: 0600 in the 0700 directory (it
    names the key files and may hold their passwords, as the node's own file does)."""
    path = directory / "node.properties"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(config.to_properties(include_defaults=False))
    return path


def check_port_free(host: str, port: int) -> None:
    """With ``SO_REUSEPORT`` a second process may bind a port the node's own listener uses; so before
    binding, a plain bind (no ``SO_REUSEPORT``) tells whether anybody listens there already."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are fine
        try:
            probe.bind((host or "0.0.0.0", port))
        except OSError as exc:
            raise IntakeConfigError(f"cannot listen on {_join_host_port(host, port)}: {exc}") from None


@dataclasses.dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes]
    ready: Path


class IntakeProcesses:
    """N intake processes of one node (see the module docstring)."""

    def __init__(
        self,
        count: int,
        *,
        listen: str,
        upstream: Path,
        cluster_id: str,
        limits: ServerLimits,
        batch_appends: bool,
        log: StructLogger,
        batch_controller_calls: bool = True,
        listener: str = "CONTROLLER",
        tls_config: Path | None = None,
    ) -> None:
        """``tls_config``: the node's configuration file for the children's TLS (an SSL listener)."""
        self._count = count
        self._listen = listen
        self._upstream = upstream
        self._cluster_id = cluster_id
        self._limits = limits
        self._batch_appends = batch_appends
        self._batch_controller_calls = batch_controller_calls
        self._log = log
        self._listener = listener
        self._tls_config = tls_config
        self._children: list[_Child] = []
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [child.process.pid for child in self._children]

    def _command(self, index: int, ready: Path) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "kraft.node.intake_process",
            "--index",
            str(index),
            "--listen",
            self._listen,
            "--upstream",
            str(self._upstream),
            "--cluster-id",
            self._cluster_id,
            "--limits",
            json.dumps(dataclasses.asdict(self._limits)),
            "--ready",
            str(ready),
            "--parent-pid",
            str(os.getpid()),
        ]
        if self._batch_appends:
            command.append("--batch-appends")
        if not self._batch_controller_calls:
            command.append("--no-batch-controller-calls")
        command += ["--listener", self._listener]
        if self._tls_config is not None:
            command += ["--tls-config", str(self._tls_config)]
        return command

    async def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start every child and wait until each listens; raises (after stopping them) otherwise."""
        try:
            for index in range(self._count):
                ready = self._upstream.parent / f"ready-{index}"
                with contextlib.suppress(FileNotFoundError):
                    ready.unlink()
                # Output goes to the node's own stdout/stderr (its log).
                process = spawn_child(
                    self._command(index, ready),
                    die_with_parent=True,
                    stdin=subprocess.DEVNULL,
                    env=child_environment(os.environ),
                )
                self._children.append(_Child(index, process, ready))
            deadline = time.monotonic() + timeout_s
            for child in self._children:
                while not child.ready.exists():
                    code = child.process.poll()
                    if code is not None:
                        raise IntakeConfigError(
                            f"intake process {child.index} exited at start (status {code})"
                        )
                    if time.monotonic() > deadline:
                        raise IntakeConfigError(
                            f"intake process {child.index} did not listen in {timeout_s:.0f} s"
                        )
                    await asyncio.sleep(0.02)
        except BaseException:
            await self.stop(timeout_s=0)
            raise
        self._log.info("intake_processes_started", count=self._count, pids=",".join(map(str, self.pids)))

    async def watch(self, on_death: Callable[[int, int, int], None]) -> None:
        """Poll the children; the first that exits outside :meth:`stop` is reported once through
        ``on_death(index, pid, status)`` and the watch ends."""
        while not self._stopping:
            for child in self._children:
                code = child.process.poll()
                if code is not None and not self._stopping:
                    on_death(child.index, child.process.pid, code)
                    return
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every child (SIGKILL at once with ``timeout_s`` 0), wait up to ``timeout_s``, SIGKILL
        what remains and reap all."""
        self._stopping = True
        children, self._children = self._children, []
        sig = signal.SIGTERM if timeout_s > 0 else signal.SIGKILL
        for child in children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(sig)
        deadline = time.monotonic() + timeout_s
        for child in children:
            while child.process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)  # (no event says a child exited: asyncio's child watcher is gone)
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: give up
                    await asyncio.to_thread(child.process.wait, STOP_TIMEOUT_S)
            with contextlib.suppress(FileNotFoundError):
                child.ready.unlink()
