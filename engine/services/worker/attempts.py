"""One running activity attempt as the worker sees it: its outcome (settled once), its
heartbeats, and how to stop it early.

An attempt ends exactly once, by whichever comes first: the activity returns or raises, its
start-to-close timeout, a missed heartbeat, or a cancellation. Stopping an attempt settles
it at once and then asks its executor to stop the body: an async activity's task is
cancelled (``CancelledError`` inside it), a child process is killed, and a sync activity on
a thread - which cannot be stopped from outside - sees ``activity.is_cancelled()`` become
true and its next ``activity.heartbeat()`` raise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.core.activity_info import AttemptControl
from engine.core.failure import FailureDetails
from engine.core.messages import ActivityTask
from engine.core.payloads import Payload

__all__ = ["CANCELLED_TYPE", "Attempt", "OnDone", "cancelled_failure"]

#: ``on_done(output, failure, details)``: details are the last heartbeat's, on failures.
OnDone = Callable[[Payload | None, FailureDetails | None, Payload | None], None]

#: The failure type of an attempt that was cancelled (recorded as such, not as a failure).
CANCELLED_TYPE = "ActivityCancelled"


def cancelled_failure(task: ActivityTask, reason: str) -> FailureDetails:
    return FailureDetails(
        CANCELLED_TYPE,
        f"activity {task.name!r} ({task.attempt_label}) was cancelled: {reason}",
        retryable=False,
    )


class Attempt:
    """A running attempt: settle it once, stop it early, watch its heartbeats."""

    def __init__(self, task: ActivityTask, on_done: OnDone) -> None:
        self.task = task
        self.control = AttemptControl()
        self._on_done = on_done
        self._lock = threading.Lock()
        self._settled = False
        self._stopper: Callable[[], object] | None = None

    def bind(self, stopper: Callable[[], object]) -> None:
        """How the executor stops the body (cancel its task, kill its process)."""
        self._stopper = stopper

    @property
    def settled(self) -> bool:
        """Whether the outcome was reported (a timeout or a stop may come first)."""
        return self._settled

    def settle(self, output: Payload | None, failure: FailureDetails | None) -> bool:
        """Report the outcome, unless one was reported already (then False)."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
        details = self.control.details if failure is not None else None
        self._on_done(output, failure, details)
        return True

    def stop(self, failure: FailureDetails) -> None:
        """End the attempt now with ``failure`` and stop its body."""
        self.control.cancel(failure.message)
        if self.settle(None, failure) and self._stopper is not None:
            self._stopper()

    def heartbeat_overdue(self) -> FailureDetails | None:
        """The timeout failure when the attempt went past its heartbeat timeout."""
        limit_ms = self.task.heartbeat_timeout_ms
        if limit_ms <= 0:
            return None
        silent = self.control.silent_for()
        if silent * 1000 <= limit_ms:
            return None
        return FailureDetails(
            "ActivityTimeoutError",
            f"activity {self.task.name!r} ({self.task.attempt_label}) sent no heartbeat for "
            f"{silent:.1f}s, past its heartbeat timeout of {limit_ms} ms; it is retried per "
            f"its retry policy, from its last heartbeat details",
        )
