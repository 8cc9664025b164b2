"""Running activity bodies: sync ones on threads (or child processes), async ones on one
event loop, each attempt inside its ``current_activity()`` scope and under its timeouts.

:class:`ActivityRunner` is what the worker state machine (``engine.services.worker.worker``)
hands each attempt to; it reports every run's outcome back through one callback.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from engine.core.activity_info import ActivityContext, activity_scope
from engine.core.errors import (
    ActivityCancelledError,
    BrokerError,
    CodecError,
    PayloadTooLargeError,
    TurnstileError,
)
from engine.core.failure import failure_from_exception
from engine.core.messages import ActivityTask
from engine.core.payloads import Payload, from_payload, seal, to_payload
from engine.core.typed import convert, parameter_type
from engine.services.worker.attempts import Attempt, OnDone, cancelled_failure
from engine.services.worker.processes import Encoded, ProcessExecutor
from engine.services.worker.threads import AbandoningThreads
from engine.services.worker.timeouts import run_timeout_s

__all__ = ["EXECUTORS", "ActivityRunner", "Offload"]

#: Puts a payload of an instance aside (``services.large_payloads.PayloadOffloader``).
Offload = Callable[[str, Payload | None], Payload | None]

#: Where sync activities run: reusable threads (abandoned at their timeout) or one child
#: process per attempt (killed at its timeout; see engine.services.worker.processes).
EXECUTORS = ("thread", "process")


def _arity(fn: Callable[..., Any]) -> int:
    """How many arguments to pass: 0, 1 (the input) or 2 (the input and the context).
    Remembered per function: reading a signature costs more than a short activity."""
    try:
        return _cached_arity(fn)
    except TypeError:  # an unhashable callable object
        return _read_arity(fn)


def _read_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return max(len(positional), 1)
    return min(len(positional), 2)


_cached_arity = functools.lru_cache(maxsize=4096)(_read_arity)


def _arguments(
    fn: Callable[..., Any], task: ActivityTask, info: ActivityContext
) -> tuple[Any, ...]:
    arity = _arity(fn)
    if arity == 0:
        return ()
    value = convert(from_payload(task.input), parameter_type(fn, 0))
    return (value,) if arity == 1 else (value, info)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    )


class ActivityRunner:
    """Runs activities: sync ones on daemon threads (abandoned at their start-to-close
    timeout, see :mod:`engine.services.worker.threads`), async ones on one event loop.

    The event loop lives in a background thread so that thousands of waiting async
    activities cost no threads. Every run ends with one call of ``on_done(output, failure,
    details)`` (from a pool thread, the loop thread or the worker's loop when it stops the
    attempt), unless it was cancelled at shutdown.
    """

    def __init__(self, threads: int, worker_id: str = "", executor: str = "thread") -> None:
        if executor not in EXECUTORS:
            raise TurnstileError(
                f"unknown activity executor {executor!r}; use one of: {', '.join(EXECUTORS)}"
            )
        self.worker_id = worker_id
        self.executor = executor
        self._threads = AbandoningThreads("activity")
        self._processes = ProcessExecutor() if executor == "process" else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Puts a result over ``payload_inline_max_bytes`` on the payloads topic and gives
        #: its reference (``services.large_payloads``; the Kafka worker sets it); None:
        #: every result inline.
        self.offload: Offload | None = None

    def submit(
        self,
        fn: Callable[..., Any],
        task: ActivityTask,
        on_done: OnDone,
        now_ms: int | None = None,
    ) -> Attempt:
        """Start one attempt; ``now_ms`` is the wall clock its timeouts count from. The
        returned :class:`Attempt` settles exactly once through ``on_done``."""
        attempt = Attempt(task, on_done)
        info = ActivityContext(task, self.worker_id, attempt.control)
        args = _arguments(fn, task, info)
        limit = run_timeout_s(task, int(time.time() * 1000) if now_ms is None else now_ms)
        what = f"activity {task.name!r} ({task.attempt_label})"
        if _is_async(fn):
            future: Future[Any] = asyncio.run_coroutine_threadsafe(
                _call_async(fn, args, info, limit), self._event_loop()
            )
            attempt.bind(future.cancel)  # CancelledError inside the activity
        elif self._processes is not None:
            future, kill = self._processes.submit(fn, args, info, limit, what)
            attempt.bind(kill)
        else:  # a thread cannot be stopped: the activity sees is_cancelled() instead
            future = self._threads.submit(lambda: _call_sync(fn, args, info), limit, what)
        offload = self.offload
        future.add_done_callback(lambda f: _finish(f, attempt, offload))
        return attempt

    @property
    def killed(self) -> int:
        """Child processes killed at their timeout (``--executor process``)."""
        return self._processes.killed if self._processes is not None else 0

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="activity-loop", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def shutdown(self) -> None:
        """Stop accepting work; cancel what still runs (its tasks will be redelivered)."""
        self._threads.shutdown()
        if self._processes is not None:
            self._processes.shutdown()
        loop, thread = self._loop, self._loop_thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(_cancel_all, loop)
            thread.join(timeout=5)
            if not loop.is_running():
                loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_soon(loop.stop)


def _call_sync(fn: Callable[..., Any], args: tuple[Any, ...], info: ActivityContext) -> Any:
    with activity_scope(info):
        result = fn(*args)
        if inspect.isawaitable(result):
            raise TypeError(
                f"activity {info.name!r} returned an awaitable from a plain function; "
                f"declare it with 'async def' so the worker runs it on its event loop"
            )
        return result


async def _call_async(
    fn: Callable[..., Any], args: tuple[Any, ...], info: ActivityContext, limit: float
) -> Any:
    with activity_scope(info):
        if limit > 0:
            try:
                return await asyncio.wait_for(fn(*args), limit)
            except TimeoutError:
                raise TimeoutError(
                    f"activity {info.name!r} did not finish within its start-to-close "
                    f"timeout of {limit * 1000:.0f} ms"
                ) from None
        return await fn(*args)


def _finish(future: Future[Any], attempt: Attempt, offload: Offload | None = None) -> None:
    """Settle the attempt with the future's output or failure (never raises)."""
    if future.cancelled():
        return  # stopped (settled already) or shut down (redelivered)
    exc = future.exception()
    if exc is not None:
        if isinstance(exc, asyncio.CancelledError | ActivityCancelledError):
            attempt.settle(None, cancelled_failure(attempt.task, str(exc) or "cancelled"))
            return
        attempt.settle(None, failure_from_exception(exc))
        return
    result = future.result()
    if isinstance(result, Encoded):  # a child process encoded it already
        # ... without this process's codec chain, which a spawned child does not have
        if result.failure is not None or result.output is None:
            attempt.settle(None, result.failure)
        else:
            _settle_output(attempt, seal(result.output), offload)
        return
    try:
        output = to_payload(result)
    except CodecError as codec_error:
        attempt.settle(None, failure_from_exception(codec_error, retryable=False))
        return
    _settle_output(attempt, output, offload)


def _settle_output(attempt: Attempt, output: Payload, offload: Offload | None) -> None:
    """Settle with ``output``, a large one put aside first - here, on the attempt's own
    thread, so that writing its chunks never holds up the worker's Kafka loop. One over
    ``payload_max_bytes`` fails the attempt for good; one whose chunks cannot be written
    fails it to be retried. An attempt that timed out meanwhile writes nothing."""
    if offload is not None and not attempt.settled:
        try:
            kept = offload(attempt.task.instance_id, output)
        except PayloadTooLargeError as exc:
            attempt.settle(None, failure_from_exception(exc, retryable=False))
            return
        except BrokerError as exc:
            attempt.settle(None, failure_from_exception(exc))
            return
        output = kept if kept is not None else output
    attempt.settle(output, None)
