"""The timeouts a worker enforces on an activity attempt (see
``engine.runtime.activity_options`` for what each one means).

Pure functions of the task record and the wall clock, so the worker, its tests and the
process executor agree on them: whether an attempt may still start when a worker takes it,
and how long it may then run.
"""

from __future__ import annotations

from engine.core.failure import FailureDetails
from engine.core.messages import ActivityTask

__all__ = ["TIMEOUT_TYPE", "not_startable", "run_timeout_s"]

#: The failure type of every activity timeout (retry policies may name it).
TIMEOUT_TYPE = "ActivityTimeoutError"


def not_startable(task: ActivityTask, now_ms: int) -> FailureDetails | None:
    """Why the attempt must not start now (None: it may): the workflow has stopped waiting
    for it (its deadline passed), or it waited on its queue past its schedule-to-start
    timeout (final, as in Temporal: a retry would wait on the same queue)."""
    if task.deadline_ms and now_ms >= task.deadline_ms:
        return FailureDetails(
            TIMEOUT_TYPE,
            f"activity {task.name!r} ({task.attempt_label}) was not started: the workflow "
            f"stopped waiting for this attempt at {task.deadline_ms} (epoch ms), before a "
            f"worker took it",
        )
    waited = now_ms - task.scheduled_ms
    if task.schedule_to_start_ms and task.scheduled_ms and waited > task.schedule_to_start_ms:
        return FailureDetails(
            TIMEOUT_TYPE,
            f"activity {task.name!r} ({task.attempt_label}) waited {waited} ms on task queue "
            f"{task.task_queue!r}, past its schedule-to-start timeout of "
            f"{task.schedule_to_start_ms} ms: run more workers for that queue, or raise "
            f"schedule_to_start",
            retryable=False,
        )
    return None


def run_timeout_s(task: ActivityTask, now_ms: int) -> float:
    """How long the attempt may run from now (0: no limit): its start-to-close timeout,
    shortened to the call's deadline."""
    limits = [task.timeout_ms] if task.timeout_ms > 0 else []
    if task.deadline_ms:
        limits.append(max(task.deadline_ms - now_ms, 1))
    return min(limits) / 1000 if limits else 0.0
