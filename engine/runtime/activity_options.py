"""How one activity call may run: its task queue and its four timeouts.

The names are Temporal's, and mean what users of it expect:

- *start-to-close*: how long one attempt may run once a worker started it. Enforced by the
  worker from the moment it starts the attempt (a sync activity is abandoned, or with
  ``--executor process`` its process is killed; an async one is cancelled). When the call
  names none, :data:`DEFAULT_START_TO_CLOSE_S` applies; ``0`` turns it off.
- *schedule-to-start*: how long an attempt may wait on its queue for a worker. A worker
  that takes it later fails it without running it.
- *schedule-to-close*: how long the whole call may take, every attempt and backoff
  included; past it the call fails for good.
- *heartbeat*: how long an attempt may go without a heartbeat.

The workflow keeps its own durable timers as a backstop for when no worker reports (none
serves the queue, or one died): per attempt, ``schedule-to-start + start-to-close`` from
scheduling when the call names a start-to-close, and one schedule-to-close timer for the
call. Only the timeouts the call names become timers (and history events); the default
start-to-close lives in the task record alone, so histories recorded before it existed
replay unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from engine.core.task_queues import DEFAULT_TASK_QUEUE, check_task_queue

__all__ = ["DEFAULT_START_TO_CLOSE_S", "ActivityOptions", "activity_options"]

#: The start-to-close timeout of a call that names none: 10 minutes.
DEFAULT_START_TO_CLOSE_S = 600.0

Duration = float | timedelta | None


@dataclass(frozen=True, slots=True)
class ActivityOptions:
    """One call's queue and timeouts in milliseconds (0: none)."""

    task_queue: str = DEFAULT_TASK_QUEUE
    #: What the worker enforces per attempt (the default when the call named none).
    start_to_close_ms: int = round(DEFAULT_START_TO_CLOSE_S * 1000)
    #: Whether the call named its start-to-close (only then does the workflow time it too).
    start_to_close_named: bool = False
    schedule_to_start_ms: int = 0
    schedule_to_close_ms: int = 0
    heartbeat_timeout_ms: int = 0

    @property
    def attempt_timer_ms(self) -> int:
        """The workflow's per-attempt backstop timer, from scheduling (0: none)."""
        if self.start_to_close_named and self.start_to_close_ms > 0:
            return self.schedule_to_start_ms + self.start_to_close_ms
        if self.schedule_to_start_ms and not self.start_to_close_named:
            return self.schedule_to_start_ms + self.start_to_close_ms
        return 0


def _ms(value: Duration, what: str) -> int | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"{what} must not be negative (got {seconds}s)")
    return round(seconds * 1000)


def activity_options(
    task_queue: str,
    *,
    timeout: Duration = None,
    start_to_close: Duration = None,
    schedule_to_start: Duration = None,
    schedule_to_close: Duration = None,
    heartbeat_timeout: Duration = None,
) -> ActivityOptions:
    """Validate a call's options (seconds or timedeltas; ``timeout`` is the older name of
    ``start_to_close``). Calls without timeouts share one options object per task queue:
    replaying a long history makes this call once per activity."""
    if (
        timeout is None
        and start_to_close is None
        and schedule_to_start is None
        and schedule_to_close is None
        and heartbeat_timeout is None
    ):
        shared = _DEFAULTS.get(task_queue)
        if shared is None:
            shared = _build(task_queue, None, None, None, None, None)
            if len(_DEFAULTS) < _MAX_SHARED:
                _DEFAULTS[task_queue] = shared
        return shared
    return _build(
        task_queue, timeout, start_to_close, schedule_to_start, schedule_to_close, heartbeat_timeout
    )


#: Options without timeouts, by task queue (few queues; bounded all the same).
_DEFAULTS: dict[str, ActivityOptions] = {}
_MAX_SHARED = 1024


def _build(
    task_queue: str,
    timeout: Duration,
    start_to_close: Duration,
    schedule_to_start: Duration,
    schedule_to_close: Duration,
    heartbeat_timeout: Duration,
) -> ActivityOptions:
    if timeout is not None and start_to_close is not None:
        raise ValueError("pass start_to_close or timeout (its older name), not both")
    named = _ms(start_to_close if start_to_close is not None else timeout, "start_to_close")
    return ActivityOptions(
        task_queue=check_task_queue(task_queue),
        start_to_close_ms=round(DEFAULT_START_TO_CLOSE_S * 1000) if named is None else named,
        start_to_close_named=named is not None,
        schedule_to_start_ms=_ms(schedule_to_start, "schedule_to_start") or 0,
        schedule_to_close_ms=_ms(schedule_to_close, "schedule_to_close") or 0,
        heartbeat_timeout_ms=_ms(heartbeat_timeout, "heartbeat_timeout") or 0,
    )
