"""What an activity knows about the attempt it is running: ``current_activity()``.

An activity body runs at least once - a worker that crashes after running it but before
committing its result will see the task again, and a retry follows an attempt that timed
out even if it did its work - so code with side effects needs a key that stays the same
across redeliveries and retries of one call to hand to external systems (a payment API's
idempotency key, a unique constraint); the attempt number is a separate field. The worker
sets a context variable around each call, so the activity does not have to declare a
parameter for it; it works the same for sync activities (run in a thread) and async ones
(run on the worker's event loop).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from engine.core.errors import TurnstileError
from engine.core.messages import ActivityTask

__all__ = ["ActivityContext", "activity_scope", "current_activity", "in_activity"]


@dataclass(frozen=True, slots=True)
class ActivityContext:
    """The attempt an activity body is running for."""

    task: ActivityTask
    worker_id: str = ""

    @property
    def instance_id(self) -> str:
        return self.task.instance_id

    @property
    def generation(self) -> int:
        return self.task.generation

    @property
    def task_id(self) -> int:
        return self.task.task_id

    @property
    def attempt(self) -> int:
        return self.task.attempt

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def idempotency_key(self) -> str:
        """``instance/generation/task id``: the same for every attempt of this call (and
        every redelivery); see :attr:`attempt` for which attempt runs."""
        return self.task.idempotency_key


_CURRENT: contextvars.ContextVar[ActivityContext | None] = contextvars.ContextVar(
    "turnstile_activity", default=None
)


def current_activity() -> ActivityContext:
    """The context of the activity attempt running in this thread or task.

    Raises :class:`TurnstileError` outside an activity (for example in a unit test that calls
    the function directly: wrap the call in :func:`activity_scope`).
    """
    info = _CURRENT.get()
    if info is None:
        raise TurnstileError(
            "current_activity() was called outside an activity; it is only available while "
            "a worker runs the activity (tests can use engine.core.activity_info.activity_scope)"
        )
    return info


def in_activity() -> bool:
    """Whether this code runs inside an activity attempt."""
    return _CURRENT.get() is not None


@contextmanager
def activity_scope(info: ActivityContext) -> Iterator[ActivityContext]:
    """Make ``info`` the current activity for the duration of the block."""
    token = _CURRENT.set(info)
    try:
        yield info
    finally:
        _CURRENT.reset(token)
