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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from engine.core.errors import ActivityCancelledError, TurnstileError
from engine.core.messages import ActivityTask
from engine.core.payloads import Payload, from_payload, to_payload
from engine.core.task_tokens import TaskToken

__all__ = [
    "ActivityCompletesLater",
    "ActivityContext",
    "AttemptControl",
    "activity_scope",
    "current_activity",
    "heartbeat",
    "in_activity",
    "is_cancelled",
]


class ActivityCompletesLater(Exception):
    """Raised by :meth:`ActivityContext.complete_later`: the attempt stays open after the
    activity body returns, and whoever holds its task token finishes it with
    ``Client.complete_activity`` or ``Client.fail_activity``. The worker reports nothing
    for the attempt (it only commits the task); let it propagate."""


class AttemptControl:
    """What activity code and the worker share while one attempt runs: the last heartbeat
    (time and details) and whether the attempt was cancelled.

    ``heartbeat`` only writes memory under a lock - the worker reads it between polls, so
    heartbeats cost no record, let alone a transaction, whatever their rate. A heartbeat
    after a cancellation raises :class:`ActivityCancelledError` (how a sync activity learns
    that the workflow stopped waiting).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.last_beat = clock()
        self.beats = 0
        self.details: Payload | None = None
        #: Why the attempt was cancelled ("": it was not).
        self.cancelled = ""
        #: Called with each beat's payload (the process executor forwards it to the parent).
        self.forward: Callable[[Payload | None], None] | None = None

    def beat(self, details: Any = None) -> None:
        payload = None if details is None else to_payload(details)
        self.record(payload)
        if self.forward is not None:
            self.forward(payload)
        if self.cancelled:
            raise ActivityCancelledError(
                f"the attempt was cancelled ({self.cancelled}); let this error end it"
            )

    def record(self, payload: Payload | None) -> None:
        with self._lock:
            self.last_beat = self._clock()
            self.beats += 1
            if payload is not None:
                self.details = payload

    def silent_for(self) -> float:
        """Seconds since the last heartbeat (or the start)."""
        with self._lock:
            return self._clock() - self.last_beat

    def cancel(self, reason: str) -> None:
        self.cancelled = reason or "cancelled"


@dataclass(frozen=True, slots=True)
class ActivityContext:
    """The attempt an activity body is running for."""

    task: ActivityTask
    worker_id: str = ""
    control: AttemptControl | None = None

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

    @property
    def heartbeat_details(self) -> Any:
        """The details of the previous attempt's last heartbeat (None on a first attempt
        or when it sent none): the checkpoint to resume from."""
        return from_payload(self.task.heartbeat_details)

    @property
    def task_token(self) -> str:
        """The opaque string naming this attempt, for :meth:`complete_later`: hand it to
        whoever finishes the attempt (``Client.complete_activity(token, result)``)."""
        t = self.task
        return TaskToken(t.instance_id, t.run_id, t.generation, t.task_id, t.attempt).encode()

    def complete_later(self) -> NoReturn:
        """End the activity body without finishing the attempt: the worker reports no
        result, and the holder of :attr:`task_token` finishes it, exactly once, with
        ``Client.complete_activity`` or ``Client.fail_activity`` from any process. Hand the
        token out first; this raises :class:`ActivityCompletesLater`, so nothing after the
        call runs. The worker's start-to-close and heartbeat timeouts end with the body:
        name ``start_to_close`` (the workflow's own timer) or ``schedule_to_close`` on the
        call to bound how long the workflow waits."""
        raise ActivityCompletesLater(
            f"activity {self.name!r} completes later, by task token; let this propagate"
        )

    def heartbeat(self, details: Any = None) -> None:
        """Report progress (``details``: a JSON-encodable checkpoint, kept for the next
        attempt); raises :class:`ActivityCancelledError` once the attempt is cancelled."""
        if self.control is not None:
            self.control.beat(details)

    def is_cancelled(self) -> bool:
        """Whether the workflow stopped waiting for this attempt (or it timed out)."""
        return self.control is not None and bool(self.control.cancelled)


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


def heartbeat(details: Any = None) -> None:
    """``current_activity().heartbeat(details)``: from sync and async activities alike."""
    current_activity().heartbeat(details)


def is_cancelled() -> bool:
    """``current_activity().is_cancelled()``."""
    return current_activity().is_cancelled()


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
