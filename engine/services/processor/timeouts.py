"""Workflow timeouts: ``execution_timeout`` (the whole chain of runs, across
continue-as-new) and ``run_timeout`` (each run), from the start or the workflow's
``@workflow(...)``.

Both are durable timers of the timer table, so they survive restarts and takeovers. A run
begins with both armed (:func:`arm_at_begin`); each run a continue-as-new begins arms its
own run timer (:func:`arm_new_run`); a reset arms both again, the execution timeout counted
from the reset (:func:`arm_reset_run`). The run timer is for its generation: a later run makes
it stale like any timer of an older generation. The execution timer outlives the
generations of its chain, so it is matched by its fire time instead: the row keeps the
chain's deadline, and a new start (a new chain) replaces it. When one fires while the
instance still runs, the instance gets an ``ExecutionTerminated`` that names the timeout:
its code stops at once, it ends TIMED_OUT, and its children follow their parent-close
policies, as after a termination.
"""

from __future__ import annotations

from engine.core.errors import TurnstileError
from engine.core.history import ExecutionTerminated, Inbound, RuntimeStatus
from engine.core.instance_row import InstanceRow
from engine.core.messages import StartWorkflow
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.state import Loaded

#: Timer task id of a run's ``run_timeout``.
RUN_TIMEOUT_TIMER = -7
#: Timer task id of a chain's ``execution_timeout``.
EXECUTION_TIMEOUT_TIMER = -8

TIMERS = frozenset({RUN_TIMEOUT_TIMER, EXECUTION_TIMEOUT_TIMER})

_LIVE = (RuntimeStatus.RUNNING, RuntimeStatus.SUSPENDED)


def _defined(b: Batch, meta: InstanceRow) -> tuple[int, int]:
    """The workflow's own (execution, run) timeouts in ms (0, 0 for one this processor
    does not know)."""
    try:
        definition = b.env.registry.get_workflow(meta.name, meta.version)
    except TurnstileError:
        return 0, 0
    return definition.execution_timeout_ms, definition.run_timeout_ms


def arm_at_begin(b: Batch, meta: InstanceRow, msg: StartWorkflow, now_ms: int) -> None:
    """A start began a new chain of runs: set its deadlines (the start's, else the
    workflow's) and the timers that enforce them."""
    own_execution, own_run = _defined(b, meta)
    meta.execution_timeout_ms = msg.execution_timeout_ms or own_execution
    meta.run_timeout_ms = msg.run_timeout_ms or own_run
    _arm_execution(b, meta, now_ms)
    _arm_run(b, meta, now_ms)


def arm_new_run(b: Batch, meta: InstanceRow, previous_generation: int, now_ms: int) -> None:
    """After a turn: a continue-as-new that began the next run arms that run's timer."""
    if meta.generation != previous_generation and meta.status in _LIVE:
        _arm_run(b, meta, now_ms)


def arm_reset_run(b: Batch, meta: InstanceRow, now_ms: int) -> None:
    """A reset began a new run of the chain (its old timers are gone): it gets its own run
    timer, and the chain's execution timeout counts again from the reset, as Temporal
    counts it: kept from the first start, a reset of an instance that timed out would time
    out at once, and resetting is how an operator brings such an instance back. A rerun
    is a new chain, with the workflow's own timeouts."""
    if meta.status not in _LIVE:
        return
    if meta.run_timeout_ms == 0 and meta.execution_deadline_ms == 0:
        arm_at_begin(b, meta, StartWorkflow(meta.instance_id), now_ms)
        return
    if meta.execution_timeout_ms > 0:
        _arm_execution(b, meta, now_ms)
    elif meta.execution_deadline_ms:  # a row from before the timeout was kept: its deadline
        meta.execution_deadline_ms = max(meta.execution_deadline_ms, now_ms)
        _put_execution_timer(b, meta)
    _arm_run(b, meta, now_ms)


def _arm_execution(b: Batch, meta: InstanceRow, now_ms: int) -> None:
    timeout_ms = meta.execution_timeout_ms
    meta.execution_deadline_ms = now_ms + timeout_ms if timeout_ms > 0 else 0
    if meta.execution_deadline_ms:
        _put_execution_timer(b, meta)


def _put_execution_timer(b: Batch, meta: InstanceRow) -> None:
    key = keys.TimerKey(
        meta.execution_deadline_ms, meta.instance_id, meta.generation, EXECUTION_TIMEOUT_TIMER
    )
    b.tables.put_timer(key)


def _arm_run(b: Batch, meta: InstanceRow, now_ms: int) -> None:
    if meta.run_timeout_ms > 0:
        fire_at = now_ms + meta.run_timeout_ms
        b.tables.put_timer(
            keys.TimerKey(fire_at, meta.instance_id, meta.generation, RUN_TIMEOUT_TIMER)
        )


def fire(b: Batch, item: Loaded, timer: keys.TimerKey) -> None:
    """A timeout timer fired: end the instance TIMED_OUT if it is still the run or chain
    the timer was armed for and has not ended (else the timer is stale and does nothing)."""
    meta = item.meta
    if meta.status not in _LIVE:
        return
    if timer.task_id == RUN_TIMEOUT_TIMER:
        if timer.generation != meta.generation:
            return
        which, limit_ms = "run_timeout", meta.run_timeout_ms
    else:
        if timer.fire_at_ms != meta.execution_deadline_ms:
            return
        which, limit_ms = "execution_timeout", 0
    reason = f"its {which} elapsed" + (f" ({limit_ms / 1000:g} s)" if limit_ms else "")
    item.inbox.append(Inbound(ExecutionTerminated(reason, False, which)))
