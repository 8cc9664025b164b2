"""Heartbeats of activity attempts that complete later, timed by the processor.

While a worker runs an attempt, it times the heartbeats itself (in memory, no record per
beat). An attempt whose body called ``complete_later()`` has left its worker, so its
heartbeat timeout moves here, to the owner of the instance: the worker's note that it let
go (an ``ActivityResult`` with ``heartbeat_timeout_ms``, sent for calls that have one) arms
a deadline in the attempt's row (``heartbeat_rows``), each heartbeat the holder of the
task token sends (``Client.heartbeat_activity``: an ``ActivityResult`` with ``heartbeat``
on the commands topic) moves it and keeps its details, and a durable timer fails the
attempt once the deadline passes - a ``TaskFailed`` with the last details, which the
runtime judges like any result (a stale one is dropped), and the retry policy follows, as
after a worker's heartbeat timeout. The row and the timer are on the changelogs, so a
restart or a takeover keeps timing.

A heartbeat is answered: accepted, or refused with ``StaleTaskTokenError`` when the
instance does not wait for that attempt (ended, another run or generation, a finished or
retried call), so whoever holds a stale token learns to stop. Only the processor knows
which attempt is current; a cold instance is replayed to learn it (a parked one, which
does not replay, is judged by its rows).
"""

from __future__ import annotations

import logging

from engine.core import errors
from engine.core.failure import FailureDetails
from engine.core.history import Inbound, RuntimeStatus, TaskFailed
from engine.core.messages import ActivityResult
from engine.core.payloads import Payload
from engine.services.processor import cancels, keys, runs
from engine.services.processor.batch import Batch
from engine.services.processor.command_outcomes import Verdict, accepted, refused, send_outcome
from engine.services.processor.heartbeat_rows import LaterAttempt, read, rows, write
from engine.services.processor.state import Loaded
from engine.services.watchdog import REPLAY_EVENTS_PER_BUDGET

__all__ = ["HEARTBEAT_TIMER", "fire", "last_details", "on_handed_over", "on_heartbeat"]

log = logging.getLogger("engine.processor")

#: Timer task id of a heartbeat deadline (the instance's rows say which attempts are due).
HEARTBEAT_TIMER = -9
#: The command name a heartbeat's answer carries.
KIND = "ActivityHeartbeat"

_LIVE = (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED)


def on_handed_over(b: Batch, msg: ActivityResult, now_ms: int) -> None:
    """The worker let go of an attempt that completes later: time its heartbeats from now
    (keeping the details of heartbeats that came before this note). A note of an attempt
    the instance no longer waits for (finished by token before the note came, or retried)
    is dropped: it must not take the row of the attempt that is current."""
    item = b.load(msg.instance_id)
    row = read(b.tables, msg.instance_id, msg.task_id)
    stale = _note_stale(b, item, msg, row)
    if stale is not None:
        b.counters.reject(msg.KIND)
        log.info("hand-over note of %s ignored: %s", _what(msg), stale)
        return
    kept = row.details if row is not None and _same(row, msg) else None
    details = msg.details if msg.details is not None else kept
    deadline = now_ms + msg.heartbeat_timeout_ms
    attempt = LaterAttempt(
        msg.generation, msg.attempt, msg.run_id, deadline, msg.heartbeat_timeout_ms, details
    )
    _arm(b, msg.instance_id, msg.task_id, attempt)


def _note_stale(
    b: Batch, item: Loaded, msg: ActivityResult, row: LaterAttempt | None
) -> str | None:
    meta = item.meta
    stale = _stale(meta.status, meta.generation, meta.run_id, msg)
    if stale is not None:
        return stale
    if row is not None and row.generation == msg.generation and row.attempt > msg.attempt:
        return f"attempt {row.attempt} of the call is current"
    open_ = _open_attempts(b, item)
    waiting = None if open_ is None else open_.get(msg.task_id)
    if open_ is not None and (waiting is None or waiting[1] != msg.attempt):
        return "the instance no longer waits for it"
    return None


def on_heartbeat(b: Batch, msg: ActivityResult, now_ms: int) -> None:
    """A heartbeat by task token: move the attempt's deadline, keep its details, answer."""
    verdict = _heartbeat(b, msg, now_ms)
    b.counters.outcome(KIND, verdict.result.value.lower())
    if msg.request_id:
        send_outcome(b, msg.instance_id, msg.request_id, KIND, verdict, now_ms)


def _heartbeat(b: Batch, msg: ActivityResult, now_ms: int) -> Verdict:
    item = b.load(msg.instance_id)
    meta = item.meta
    if not meta.exists:
        return refused(errors.InstanceNotFoundError, f"no instance {msg.instance_id}")
    stale = _stale(meta.status, meta.generation, meta.run_id, msg)
    row = read(b.tables, msg.instance_id, msg.task_id)
    if stale is None:
        stale = _not_waited_for(b, item, msg, row)
    if stale is not None:
        return refused(errors.StaleTaskTokenError, f"{_what(msg)} is stale: {stale}")
    if row is None or not _same(row, msg):
        row = LaterAttempt(msg.generation, msg.attempt, msg.run_id)
    details = msg.details if msg.details is not None else row.details
    deadline = now_ms + row.timeout_ms if row.timeout_ms > 0 else 0
    beat = LaterAttempt(row.generation, row.attempt, row.run_id, deadline, row.timeout_ms, details)
    _arm(b, msg.instance_id, msg.task_id, beat)
    return accepted()


def _stale(
    status: RuntimeStatus | None, generation: int, run_id: str, msg: ActivityResult
) -> str | None:
    """Why the instance, as its row shows it, does not wait for ``msg``'s attempt."""
    if status not in _LIVE:
        return f"the instance is {status.value if status else 'unknown'} and waits for nothing"
    if runs.is_other_run_id(run_id, msg.run_id):
        return f"the token is for run {msg.run_id}; the instance id now runs run {run_id}"
    if msg.generation != generation:
        return (
            f"the token is for generation {msg.generation}; the instance moved on to "
            f"generation {generation} (continue-as-new or reset)"
        )
    return None


def _not_waited_for(
    b: Batch, item: Loaded, msg: ActivityResult, row: LaterAttempt | None
) -> str | None:
    """Why the instance does not wait for the attempt (None: it does), from its open
    attempts (a cold instance is replayed to know them; one that does not replay is judged
    by its row: the worker's note named the attempt)."""
    open_ = _open_attempts(b, item)
    if open_ is None:
        if row is not None and _same(row, msg):
            return None
        return "the instance does not replay now (parked?); retry the heartbeat after its fix"
    waiting = open_.get(msg.task_id)
    if waiting is None:
        return "its call is finished or cancelled"
    if waiting[1] != msg.attempt:
        return f"the call is at attempt {waiting[1]} now (a retry has its own token)"
    return None


def _open_attempts(b: Batch, item: Loaded) -> dict[int, tuple[int, int, str]] | None:
    if item.open_attempts is not None:
        return item.open_attempts
    if item.meta.parked is not None:
        return None
    meta = item.meta
    try:
        if item.execution is None:
            history = b.tables.history(meta.instance_id, meta.generation_start)
            b.env.watchdog.run(
                lambda: b.replay(item, history),
                f"the replay of {meta.instance_id!r} for a heartbeat",
                scale=len(history) / REPLAY_EVENTS_PER_BUDGET,
            )
    except Exception as exc:  # its code does not replay
        item.execution = None
        log.info("%s: not replayed to judge a heartbeat: %s", meta.instance_id, exc)
        return None
    assert item.execution is not None
    cancels.before_turn(b, item, item.execution)
    return item.open_attempts


def last_details(b: Batch, msg: ActivityResult) -> Payload | None:
    """The details of the last heartbeat by task token of the attempt ``msg`` fails (for
    a ``fail_activity``, which knows none): None when it had none."""
    row = read(b.tables, msg.instance_id, msg.task_id)
    return row.details if row is not None and _same(row, msg) else None


def fire(b: Batch, item: Loaded, now_ms: int) -> None:
    """A heartbeat timer fired: fail the instance's attempts past their deadline (the
    runtime drops the failure of one it no longer waits for); their rows go."""
    meta = item.meta
    for task_id, row in rows(b.tables, meta.instance_id):
        if row.deadline_ms == 0 or row.deadline_ms > now_ms:
            continue
        b.tables.put(keys.heartbeat_key(meta.instance_id, task_id), None)
        if meta.status not in _LIVE or runs.is_other_run_id(meta.run_id, row.run_id):
            continue
        if row.generation != meta.generation:
            continue
        failure = FailureDetails(
            "ActivityTimeoutError",
            f"activity task {task_id} (attempt {row.attempt}), completed later by task "
            f"token, got no heartbeat for {row.timeout_ms} ms, its heartbeat timeout; it is "
            f"retried per its retry policy, from its last heartbeat details",
        )
        body = TaskFailed(task_id, failure, row.attempt, row.details)
        item.inbox.append(Inbound(body, row.generation))


def _arm(b: Batch, instance_id: str, task_id: int, row: LaterAttempt) -> None:
    write(b.tables, instance_id, task_id, row)
    if row.deadline_ms:
        timer = keys.TimerKey(row.deadline_ms, instance_id, row.generation, HEARTBEAT_TIMER)
        b.tables.put_timer(timer)


def _same(row: LaterAttempt, msg: ActivityResult) -> bool:
    return (
        row.generation == msg.generation
        and row.attempt == msg.attempt
        and (not runs.is_other_run_id(row.run_id, msg.run_id))
    )


def _what(msg: ActivityResult) -> str:
    return f"attempt {msg.attempt} of activity task {msg.task_id} of {msg.instance_id}"
