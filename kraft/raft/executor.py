"""The one executor of the core's :class:`~kraft.raft.core_output.Output`: the order of its effects.

The asyncio driver (:mod:`kraft.raft.driver`) and the deterministic simulation (``tests/sim/harness.py``)
both run every Output through :func:`execute_output`; they differ only in the :class:`OutputPorts` that
perform each effect (real storage and transport, or an in-memory log and a simulated router).  So the
order below is written once, here, and what the simulation checks is the order production uses.

The order, and why:

1. ``log_ops`` — buffered log writes (append / truncate / snapshot chunk / snapshot install), in order.
   First, because the fetch responses of step 2 read from the log what this Output appended.
2. ``send_now`` — messages that promise nothing durable (fetch requests and responses, ...).
3. ``election_state`` — write ``quorum-state`` and wait until it is durable.
4. ``send_after_persist`` — votes, vote requests, BeginQuorumEpoch: they promise an epoch or a vote, so
   they leave only after step 3 (persist before send; a crash must not let a node vote twice).
5. Notifications: ``installed_snapshot`` (the state machine reloads; first, because a high watermark in
   the same Output may point at the snapshot's end), ``high_watermark`` (deliver committed batches,
   complete pending appends), ``confirmed_read_round`` (wake the ``confirm_leadership`` callers; before
   ``lost_leadership``, since a round confirmed while this node led stays confirmed),
   ``lost_leadership`` (fail the appends and leadership confirmations still pending), ``leader_change``.
6. ``next_deadline_ms`` — when to poll the core next.
7. ``flush`` — make the log durable, then report ``core.on_flushed(end)``: a new input whose Output is
   executed by this same function.  The driver does it before its next round of events, feeding the
   core meanwhile only the inputs whose outputs write nothing (``RaftCore.takes_request_during_flush``
   and siblings: a leader's Fetches — the lease's echoes —, its answers to parked Fetches, a follower's
   echo answers); the simulation completes it a few virtual milliseconds later, with any events in
   between (or, with ``SimNode.driver_ordering``, with the driver's), like a slow disk.  Last, because
   the flush's own Output (a higher high watermark, a later deadline) must supersede this one's, never
   the reverse.

Notifications come before this Output's flush on purpose, on the leader and on a follower alike: a
high watermark never depends on it.  The leader counts itself towards the high watermark only by its
*flushed* end (``LeaderRole.maybe_advance_high_watermark``) and a follower's fetch offset is durable
on it (it fetches the next offset only after flushing), so the leader's high watermark covers only
batches durable on a majority of voters.  A follower raises its high watermark to
``min(leader's high watermark, local end)``; what it then delivers may not be durable *locally* yet, but
it is committed — durable on a majority — so a crash loses only this node's copy, which it fetches
again (its high watermark restarts from its snapshot, its listeners from their snapshot and log).
Waiting for the local fsync would only delay commits by one fsync.  Pending appends and listeners on
the leader likewise wait for nothing but the majority.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kraft.raft.api import LeaderAndEpoch
from kraft.raft.core_output import LogOp, Outbound, Output
from kraft.raft.messages import SnapshotId
from kraft.raft.state import ElectionState


def _no_reader(_read_round: int) -> None:
    """Nobody waits for leadership confirmations on this node."""


@dataclass(frozen=True, slots=True)
class OutputPorts:
    """What performs each effect.  The IO effects are awaitables (the driver runs them in worker
    threads); the others are plain calls that must not block."""

    write_log: Callable[[LogOp], Awaitable[None]]
    """Apply one log op; buffered — durable only after :attr:`flush`."""
    send: Callable[[Outbound], None]
    """Send a request, or answer an inbound request (filling ``read_log`` / ``read_snapshot`` now)."""
    persist_election: Callable[[ElectionState], Awaitable[None]]
    """Write ``quorum-state``; durable when the awaitable completes."""
    load_snapshot: Callable[[SnapshotId], None]
    """A downloaded snapshot replaced the log (the ``InstallSnapshot`` op ran): listeners reload it."""
    commit: Callable[[int], None]
    """The high watermark rose to this offset: deliver committed batches, complete pending appends."""
    fail_pending_appends: Callable[[], None]
    """Leadership is lost: appends not yet committed fail (they may still commit), and so do the
    leadership confirmations not yet confirmed."""
    announce_leader: Callable[[LeaderAndEpoch], None]
    """The known leader or epoch changed."""
    wait_until: Callable[[int], None]
    """Poll the core next at this monotonic time; the Output is applied, except its flush."""
    flush: Callable[[], Awaitable[None]]
    """Make the log durable, then feed ``core.on_flushed(end)`` and execute that Output with
    :func:`execute_output` — at once or later, but never before this call."""
    confirm_read_round: Callable[[int], None] = _no_reader
    """Every leadership-confirmation round up to this one is confirmed (``RaftCore.confirm_leadership``);
    ports whose node never asks for one (the plain Raft simulation) leave the default."""


async def execute_output(out: Output, ports: OutputPorts) -> None:
    """Perform ``out``'s effects in the module's order (see the module docstring for why)."""
    for op in out.log_ops:
        await ports.write_log(op)
    for message in out.send_now:
        ports.send(message)
    if out.election_state is not None:
        await ports.persist_election(out.election_state)
    for message in out.send_after_persist:
        ports.send(message)
    if out.installed_snapshot is not None:
        ports.load_snapshot(out.installed_snapshot)
    if out.high_watermark is not None:
        ports.commit(out.high_watermark)
    if out.confirmed_read_round is not None:
        ports.confirm_read_round(out.confirmed_read_round)
    if out.lost_leadership:
        ports.fail_pending_appends()
    if out.leader_change is not None:
        ports.announce_leader(out.leader_change)
    ports.wait_until(out.next_deadline_ms)
    if out.flush:
        await ports.flush()


def execute_output_now(out: Output, ports: OutputPorts) -> None:
    """:func:`execute_output` without an event loop, for ports whose awaitables complete at once (the
    simulation, unit tests): one ``send`` runs the coroutine to its end, so the run stays synchronous and
    deterministic.  A port that does suspend is a bug in that port, reported as ``RuntimeError``."""
    coroutine = execute_output(out, ports)
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("an effect port suspended: execute_output_now needs ports that complete at once")
