"""The activities a test engine's worker runs: the registered ones, the replacements a test
passes, and fakes that last a declared span of engine time (:func:`takes`).

A fake made with ``takes(duration, result)`` runs at once in wall time, but its result is
held by the test engine until the engine's clock reaches the attempt's start plus
``duration``, like a durable timer: a test can say "this call takes ten minutes" and a race
with a one-minute timer is decided in engine time, without waiting and the same way on
every run. While it is held the worker is free, so parallel calls of slow fakes overlap in
engine time as they would on a fleet of workers.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from engine.codec import decode_message, encode_message
from engine.core.activity_info import current_activity
from engine.core.errors import ActivityTimeoutError
from engine.core.failure import failure_from_exception
from engine.core.messages import ActivityCancel, ActivityResult
from engine.runtime.registry import Registry
from engine.services.records import RawRecord
from engine.services.worker.timeouts import run_timeout_s
from engine.services.worker.worker import Outbound

__all__ = ["HeldResults", "Takes", "takes", "worker_registry"]

#: (instance id, generation, task id, attempt): one attempt of one activity call.
Call = tuple[str, int, int, int]


@dataclass(frozen=True, slots=True)
class Takes:
    """A fake activity that lasts ``seconds`` of engine time (see :func:`takes`)."""

    seconds: float
    #: A function called like the activity (its input, and the context if it takes two
    #: arguments; it may raise), or the value to return.
    result: Any = None


def takes(duration: timedelta | float, result: Any = None) -> Takes:
    """A replacement activity (``TestEngine(activities={...: takes(...)})``) that takes
    ``duration`` (a timedelta or seconds) of engine time and then returns ``result``, or,
    when ``result`` is a function, what it returns for the activity's input (or raises).

    The function runs when the attempt starts; its outcome reaches the workflow when the
    engine's clock is ``duration`` past the attempt's scheduling, which costs no wall time
    when nothing else runs. A start-to-close timeout shorter than ``duration`` (the call's, or the
    default ten minutes) times the attempt out at its end instead, as a worker would a
    real activity that slow.
    """
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    if seconds < 0:
        raise ValueError(f"takes() needs a duration of at least 0, got {duration!r}")
    return Takes(seconds, result)


class HeldResults:
    """Results of :func:`takes` fakes, held until their attempt's engine time is over.

    The fake's body tells :meth:`started` (from the worker's thread) when its attempt is
    due to end; the engine passes every result the worker hands out through :meth:`hold`,
    which keeps those of such attempts, and takes them back with :meth:`due`.
    """

    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        #: Attempts started and not finished yet: the engine time they end at, and the
        #: timeout failure that ends them when their start-to-close timeout comes first.
        self._ends: dict[Call, tuple[int, str]] = {}
        self._held: list[tuple[int, int, Call, Outbound]] = []  # a heap by end time
        self._count = 0

    def started(self, seconds: float) -> None:
        """The running attempt (``current_activity()``) ends ``seconds`` after it was
        scheduled, or times out at its start-to-close limit, as the worker would stop it.

        It counts from the scheduling turn's time, not from when this thread got to run
        it: the wall time other activities took before it (the test engine's worker runs
        one at a time) must not make its end differ from run to run."""
        task = current_activity().task
        call = (task.instance_id, task.generation, task.task_id, task.attempt)
        now_ms = task.scheduled_ms or self._clock_ms()
        limit = run_timeout_s(task, now_ms)
        timeout = ""
        if 0 < limit < seconds:
            seconds = limit
            timeout = (
                f"activity {task.name!r} ({task.attempt_label}) did not finish within its timeout"
            )
        with self._lock:
            self._ends[call] = (now_ms + round(seconds * 1000), timeout)

    def hold(self, out: Outbound) -> bool:
        """Keep ``out`` until its attempt's end, if it is the result of a declared one."""
        with self._lock:
            if not self._ends or out.dead or out.requeue_to is not None:
                return False
        result = decode_message(out.value)
        if not isinstance(result, ActivityResult):
            return False
        call = (result.instance_id, result.generation, result.task_id, result.attempt)
        with self._lock:
            ended = self._ends.pop(call, None)
            if ended is None:
                return False
            end, timeout = ended
            if timeout:  # what the worker reports for an attempt it stopped at its limit
                failure = failure_from_exception(ActivityTimeoutError(timeout))
                late = ActivityResult(*call, failure=failure)
                out = replace(out, value=encode_message(late))
            self._count += 1
            heapq.heappush(self._held, (end, self._count, call, out))
        return True

    def cancelled(self, record: RawRecord) -> None:
        """A record on a task queue: if it cancels a held attempt, drop its result, as a
        worker stops a running attempt the workflow no longer waits for."""
        if not self._held or record.value is None:
            return
        message = decode_message(record.value)
        if isinstance(message, ActivityCancel):
            call = (message.instance_id, message.generation, message.task_id, message.attempt)
            self._held = [h for h in self._held if h[2] != call]
            heapq.heapify(self._held)

    def due(self, now_ms: int) -> list[Outbound]:
        """The held results whose attempts have ended by ``now_ms``, in end-time order."""
        out = []
        while self._held and self._held[0][0] <= now_ms:
            out.append(heapq.heappop(self._held)[3])
        return out

    def next_end_ms(self) -> int | None:
        """When the next held result is due (None: nothing is held)."""
        return self._held[0][0] if self._held else None


def worker_registry(
    registry: Registry,
    replacements: Mapping[str | Callable[..., Any], Any],
    held: HeldResults,
) -> Registry:
    """The worker's registry: the activities of ``registry``, some replaced by name, a
    :class:`Takes` replacement by a function that declares its duration to ``held``."""
    if not replacements:
        return registry
    by_name = {registry.activity_name(k): fn for k, fn in replacements.items()}
    out = Registry()
    for definition in registry.activities():
        if definition.name not in by_name:
            out.add_activity(
                definition.fn,
                name=definition.name,
                task_queue=definition.task_queue,
                max_concurrency=definition.max_concurrency,
            )
    for name, fn in by_name.items():
        out.add_activity(_declaring(fn, held) if isinstance(fn, Takes) else fn, name=name)
    return out


def _declaring(fake: Takes, held: HeldResults) -> Callable[..., Any]:
    """A function the worker runs like the fake's own (same signature, so the same
    arguments and input conversion) that first declares the attempt's duration."""
    body = fake.result
    if not callable(body):

        def constant() -> Any:
            held.started(fake.seconds)
            return body

        return constant
    if inspect.iscoroutinefunction(body) or inspect.iscoroutinefunction(
        getattr(body, "__call__", None)  # noqa: B004 - async callable objects
    ):

        @functools.wraps(body)
        async def run_async(*args: Any) -> Any:
            held.started(fake.seconds)
            return await body(*args)

        return run_async

    @functools.wraps(body)
    def run(*args: Any) -> Any:
        held.started(fake.seconds)
        return body(*args)

    return run
