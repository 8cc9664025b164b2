"""Sync activities in child processes, so that a start-to-close timeout really stops them.

A thread cannot be stopped, so by default a sync activity past its timeout is only
abandoned (:mod:`engine.services.worker.threads`): its thread runs on, using CPU and
whatever it holds. With ``run worker --executor process`` each sync attempt runs in a fresh
child process (the ``spawn`` start method: forking a process that runs Kafka client threads
is unsafe) and is killed at its timeout, or when the worker shuts down. The price is a
process start per attempt (tens to a few hundred milliseconds) and that the activity, its
input and its result must be picklable: a module-level function, importable by name.

The child sends back an encoded outcome (a payload or failure details), so what it returns
is converted the same way as in a thread.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from engine.core.activity_info import ActivityContext, AttemptControl, activity_scope
from engine.core.errors import ActivityTimeoutError, CodecError
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.payloads import Payload, seal, to_payload

__all__ = ["Encoded", "ProcessExecutor"]

log = logging.getLogger("engine.worker")

#: How long a killed child may take to go away before the worker stops waiting for it.
_REAP_S = 5.0


@dataclass(frozen=True, slots=True)
class Encoded:
    """An outcome a child process already encoded."""

    output: Payload | None = None
    failure: FailureDetails | None = None


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat the child forwards to the worker (its details, encoded)."""

    details: Payload | None = None


def _child(
    fn: Callable[..., Any], args: tuple[Any, ...], info: ActivityContext, out: Connection
) -> None:
    """Runs in the child: the activity, then its encoded outcome down the pipe. Its
    heartbeats go down the same pipe; the worker decides about timeouts and cancellation
    (by killing the child)."""
    control = AttemptControl()
    control.forward = lambda details: out.send(Beat(details))
    info = replace(info, control=control)
    try:
        with activity_scope(info):
            value = fn(*args)
        try:
            outcome = Encoded(output=to_payload(value))
        except CodecError as exc:
            outcome = Encoded(failure=failure_from_exception(exc, retryable=False))
    except BaseException as exc:  # everything is reported to the parent
        outcome = Encoded(failure=failure_from_exception(exc))
    out.send(outcome)
    out.close()


class ProcessExecutor:
    """Starts one child process per sync attempt and kills it at its timeout."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._live: set[Any] = set()
        self._closed = False
        #: Children killed at their timeout (for tests and logs).
        self.killed = 0

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        info: ActivityContext,
        timeout_s: float,
        what: str,
    ) -> tuple[Future[Any], Callable[[], None]]:
        """Run ``fn(*args)`` in a child; the future's result is an :class:`Encoded`, or it
        fails with :class:`ActivityTimeoutError` once the child was killed at its timeout.
        Also returns how to kill the child early (a cancelled or heartbeat-less attempt);
        its heartbeats are recorded in ``info.control``."""
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        receive, send = self._context.Pipe(duplex=False)
        control = info.control
        sent = replace(info, control=None)  # the child makes its own, forwarding beats
        child = self._context.Process(
            target=_child, args=(fn, args, sent, send), name=f"turnstile-{info.name}", daemon=True
        )
        with self._lock:
            if self._closed:
                raise RuntimeError("the activity process executor is shut down")
            child.start()
            self._live.add(child)
        send.close()  # the child holds the sending end now
        threading.Thread(
            target=self._wait,
            args=(child, receive, future, timeout_s, what, control),
            name=f"activity-process-{child.pid}",
            daemon=True,
        ).start()
        return future, child.kill

    def _wait(
        self,
        child: Any,
        receive: Connection,
        future: Future[Any],
        timeout_s: float,
        what: str,
        control: AttemptControl | None,
    ) -> None:
        try:
            ready, outcome = _outcome(receive, timeout_s, control)
            if outcome is None and not ready:
                self._kill(child, what, timeout_s)
                future.set_exception(
                    ActivityTimeoutError(
                        f"{what} did not finish within its timeout of {timeout_s:g}s; its "
                        f"process (pid {child.pid}) was killed"
                    )
                )
                return
            child.join(_REAP_S)
            if outcome is None:
                outcome = Encoded(
                    failure=FailureDetails(
                        "ActivityProcessDied",
                        f"{what} ended its process without a result (exit code "
                        f"{child.exitcode}); it is retried per the call's retry policy",
                    )
                )
            future.set_result(outcome)
        finally:
            receive.close()
            with self._lock:
                self._live.discard(child)

    def _kill(self, child: Any, what: str, timeout_s: float) -> None:
        child.kill()
        child.join(_REAP_S)
        self.killed += 1
        log.warning("%s passed its timeout of %gs; its process was killed", what, timeout_s)

    def shutdown(self) -> None:
        """Kill the children still running (their tasks are redelivered)."""
        with self._lock:
            self._closed = True
            live = list(self._live)
        for child in live:
            child.kill()


def _outcome(
    receive: Connection, timeout_s: float, control: AttemptControl | None
) -> tuple[bool, Encoded | None]:
    """Read beats until the outcome arrives: (True, outcome), (True, None) when the child
    died without one, (False, None) at the timeout."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    while True:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            return False, None
        if not receive.poll(wait):
            return False, None
        try:
            message = receive.recv()
        except (EOFError, OSError):  # the child died before it sent anything
            return True, None
        if isinstance(message, Beat):
            if control is not None:  # sealed here: a spawned child has no codec chain
                details = message.details
                control.record(None if details is None else seal(details))
            continue
        return True, message if isinstance(message, Encoded) else None
