"""Child-process helpers shared by ``kraft cluster``, the integration-test quorum and the benchmarks.

One way to start a node-like child (own session, output appended to a log file), to stop one
(SIGTERM, then SIGKILL if it overstays) and to quote the end of its log in an error message.

A process that must not leave children behind when it ends however it ends — a benchmark killed by
``timeout``, Ctrl-C, a closed terminal or SIGKILL — calls :func:`reap_children_on_exit` first: from
then on every child started here (:func:`spawn_child`, :func:`spawn_logged`, so also the nodes of
:class:`kraft.cluster.quorum.ControllerQuorum` and :class:`kraft.cluster.manager.LocalCluster`) is
bound to it.  ``kraft cluster up`` never calls it: its nodes outlive the command by design.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

# prctl(2) option: the signal the calling process gets when its parent (the thread that forked it) dies
_PR_SET_PDEATHSIG = 1
_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Children bound to this process (reap_children_on_exit): killed, their whole group, when it exits.
_bound: list[subprocess.Popen[Any]] = []
_bound_lock = threading.RLock()  # re-entrant: the signal handler may interrupt its holder
_reaping = False
_exiting = False


def reap_children_on_exit() -> None:
    """Bind every child this process starts through this module from now on to this process's life.

    Each such child leads its own process group (as every child here does) and

    - gets SIGKILL from the kernel when this process dies, even by SIGKILL (``PR_SET_PDEATHSIG`` on
      Linux, set by a tiny trampoline interpreter that then execs the command, for children started
      from the main thread: the kernel sends it when the *thread* that started the child ends, and only
      the main thread lives as long as the process);
    - has its process group killed and is reaped at interpreter exit (``atexit``) and on SIGTERM,
      SIGINT or SIGHUP, whose handlers here kill the children first, then exit through ``SystemExit(128
      + signal)`` so ``finally`` blocks and context managers still run (a second signal exits at once).

    Call it from the main thread, once, before starting children (later calls do nothing); a
    benchmark's ``main`` does.  Not for processes whose children are meant to outlive them.
    """
    global _reaping
    if _reaping:
        return
    _reaping = True
    atexit.register(kill_children)
    for signum in _EXIT_SIGNALS:
        signal.signal(signum, _exit_on_signal)


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    global _exiting
    if _exiting:  # a second signal while unwinding: do not wait for slow cleanups
        os._exit(128 + signum)
    _exiting = True
    kill_children()
    raise SystemExit(128 + signum)


def kill_children(wait_s: float = 5.0) -> int:
    """SIGKILL the process group of every bound child still running and reap them (within ``wait_s``
    in all); returns how many were running.  Safe to call more than once."""
    with _bound_lock:
        children = list(_bound)
        _bound.clear()
    running = [child for child in children if child.poll() is None]
    for child in running:
        # an unreaped child's pid is still its own, so the group id (= its pid: it leads its session)
        # cannot name anybody else's processes
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    for child in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
    return len(running)


# Runs as the child's first program: asks the kernel for SIGKILL when the parent (the thread that
# started it) dies, gives up if that already happened, then becomes the real command (execvp keeps the
# pid and the death signal).  A separate interpreter, so the parent never runs Python between fork and
# exec: a ``preexec_fn`` makes Popen fork instead of vfork and runs the at-fork hooks of whatever the
# parent loaded (gRPC's abort ~1 child in 250 with "epoll_wait error: Bad file descriptor" once the
# parent has gRPC running), and any lock another thread held at the fork is held forever in the child.
_TRAMPOLINE = (
    "import ctypes,os,sys\n"
    f"ctypes.CDLL(None,use_errno=True).prctl({_PR_SET_PDEATHSIG},{int(signal.SIGKILL)},0,0,0)\n"
    "os.getppid()==int(sys.argv[1]) or os._exit(1)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def _bound_command(command: Sequence[str], popen_args: Mapping[str, Any]) -> list[str]:
    """``command`` behind the death-signal trampoline where that works (Linux, started from the main
    thread: the kernel signals when the *thread* that started the child ends, and only the main thread
    lives as long as the process), else ``command`` unchanged."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return list(command)
    program = command[0]
    if os.sep not in program:  # looked up here, so a missing program raises here as Popen would
        env = popen_args.get("env")
        found = shutil.which(program, path=(env if env is not None else os.environ).get("PATH"))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no such program on PATH", program)
        program = found
    # -I -S: the trampoline's interpreter reads no PYTHON* variables, site or user packages (~10 ms);
    # the command gets the environment unchanged
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), program, *command[1:]]


def spawn_child(
    command: Sequence[str], *, die_with_parent: bool = False, **popen_args: Any
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(command, **popen_args)`` in a session of its own (a terminal's Ctrl-C does not
    reach it before its owner stops it; its process group can be signalled as a whole), bound to this
    process once :func:`reap_children_on_exit` was called.

    ``die_with_parent``: the kernel SIGKILLs the child when this process dies (the death-signal trampoline)
    even without :func:`reap_children_on_exit` — for a node's own helper processes (intake processes),
    whose node keeps its own signal handling and reaps them itself on a graceful stop."""
    if _reaping or die_with_parent:
        if popen_args.get("shell") or "executable" in popen_args:
            raise ValueError("spawn_child binds an argv command: no shell=, no executable=")
        command = _bound_command(command, popen_args)
    # no preexec_fn: Popen starts the child with vfork/posix_spawn and runs no Python in it
    process: subprocess.Popen[Any] = subprocess.Popen(command, start_new_session=True, **popen_args)
    if _reaping:
        with _bound_lock:
            _bound[:] = [child for child in _bound if child.returncode is None]  # drop reaped ones
            _bound.append(process)
    return process


def run_child(
    command: Sequence[str], *, timeout: float | None = None, check: bool = False, **popen_args: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` for a long-running child (a benchmark's measuring process), started by
    :func:`spawn_child`; on a timeout or any exception (the signal handlers' SystemExit too) its whole
    process group is killed and reaped before the exception goes on."""
    if popen_args.pop("capture_output", False):
        popen_args["stdout"] = popen_args["stderr"] = subprocess.PIPE
    with spawn_child(command, **popen_args) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    code = process.returncode
    if check and code:
        raise subprocess.CalledProcessError(code, list(command), stdout, stderr)
    return subprocess.CompletedProcess(list(command), code, stdout, stderr)


def spawn_logged(
    command: Sequence[str],
    log_path: Path,
    *,
    banner: str,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` with stdout and stderr appended to ``log_path`` after a ``banner`` line.

    The child leads its own session, so a Ctrl-C in the terminal that started it (a test run, ``kraft
    cluster up``) does not reach it before its owner stops it, and its process group can be signalled
    as a whole.  Python children run unbuffered so the log is current when a failure quotes it.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    with log_path.open("ab") as log:
        log.write(f"{banner}\n".encode())
        log.flush()
        return spawn_child(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env
        )


def reap(
    process: subprocess.Popen[bytes], timeout_s: float = 10.0, kill_wait_s: float | None = None
) -> int | None:
    """Wait for an already signalled process; SIGKILL it if it has not exited within ``timeout_s``.

    Returns its exit code, or None if it outlived SIGKILL by ``kill_wait_s`` (default ``timeout_s``): an
    uninterruptible sleep, nothing more can be done from here.
    """
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.wait(timeout=timeout_s if kill_wait_s is None else kill_wait_s)
    return None


def log_tail(log_path: Path, lines: int) -> str:
    """The last ``lines`` lines of ``log_path`` (for failure messages); a note when there is no log."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return f"(no log at {log_path})"
    return "\n".join(text.splitlines()[-lines:])
