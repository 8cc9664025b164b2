"""Retention: the processor purges finished instances itself, a set time after they end.

When a batch ends an instance (COMPLETED, FAILED, TERMINATED, ...), :func:`arm_ended` sets a
timer (task id :data:`RETENTION_TIMER`, for the instance's generation) at the end plus the
retention: the workflow's own ``@workflow(retention=...)``, else the namespace's
``retention_ms`` setting (0: kept until purged). When it fires and the instance is still
that ended generation (a new run moved the generation on, so the timer is stale), the
instance is purged exactly as ``turnstile purge`` does: row, history rows, timers and
status go; the history topic keeps its events under its own retention. The timer is a
row of the timer table like any other, so it survives restarts and takeovers.
"""

from __future__ import annotations

from engine.core.errors import TurnstileError
from engine.core.instance_row import InstanceRow
from engine.services.processor import keys
from engine.services.processor.batch import Batch

#: Timer task id of an ended instance's purge.
RETENTION_TIMER = -4


def retention_of(b: Batch, meta: InstanceRow) -> int:
    """How long the ended instance is kept (ms; 0: until purged)."""
    try:
        own = b.env.registry.get_workflow(meta.name, meta.version).retention_ms
    except TurnstileError:
        own = 0  # a workflow this processor does not know: the namespace's setting
    return own or b.env.retention_ms


def arm_ended(b: Batch, now_ms: int) -> None:
    """Set the purge timer of every instance this batch ended (the state machine calls
    it before the batch closes)."""
    for item in b.ended():
        meta = item.meta
        keep_ms = retention_of(b, meta)
        if keep_ms > 0:
            b.origin = meta.instance_id
            key = keys.TimerKey(
                now_ms + keep_ms, meta.instance_id, meta.generation, RETENTION_TIMER
            )
            b.tables.put_timer(key)
    b.origin = ""
