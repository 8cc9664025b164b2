"""Threads for sync activities that a hung activity cannot take away from the worker.

Python cannot stop a thread, so an activity that hangs keeps its thread forever. With a
fixed pool, ``concurrency`` hung activities would stop every activity of the worker. Here
every sync activity runs on a daemon thread of an elastic set: at its start-to-close
timeout the run is *abandoned* - it reports a timeout failure at once (the worker counts it
as finished, so another task can start on another thread) and whatever it returns later is
dropped. Daemon threads never hold up the process's exit, so SIGTERM ends a worker within
its grace period whatever its activities do.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from engine.core.errors import ActivityTimeoutError

log = logging.getLogger("engine.worker")

Job = tuple[int, Future[Any], Callable[[], Any]]


class AbandoningThreads:
    """Runs callables on reusable daemon threads; a run past its deadline is abandoned."""

    def __init__(self, name: str = "activity") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._ids = itertools.count(1)
        #: Runs with a deadline that have not settled: id -> (deadline, future, what).
        self._deadlines: dict[int, tuple[float, Future[Any], str]] = {}
        self._wake = threading.Condition(self._lock)
        self._watcher: threading.Thread | None = None
        self._closed = False
        #: Runs abandoned at their timeout whose threads have not returned yet.
        self.abandoned = 0

    def submit(self, fn: Callable[[], Any], timeout_s: float, what: str) -> Future[Any]:
        """Run ``fn()``; the future fails with :class:`ActivityTimeoutError` after
        ``timeout_s`` seconds (no deadline when ``timeout_s <= 0``)."""
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        job_id = next(self._ids)
        with self._lock:
            if self._closed:
                raise RuntimeError("the activity threads are shut down")
            if timeout_s > 0:
                self._deadlines[job_id] = (time.monotonic() + timeout_s, future, what)
                self._ensure_watcher()
                self._wake.notify()
            start_thread = self._idle == 0
            if start_thread:
                self._threads += 1
            else:
                self._idle -= 1
        self._jobs.put((job_id, future, fn))
        if start_thread:
            threading.Thread(
                target=self._work, name=f"{self._name}-{self._threads}", daemon=True
            ).start()
        return future

    def shutdown(self) -> None:
        """Stop the idle threads; busy ones finish (or hang) on their own, as daemons."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
            self._wake.notify()
        for _ in range(idle):
            self._jobs.put(None)

    # --- threads ----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job_id, future, fn = job
            error: BaseException | None = None
            value: Any = None
            try:
                value = fn()
            except BaseException as exc:
                error = exc
            with self._lock:  # free before settling, so the next task can reuse this thread
                self._deadlines.pop(job_id, None)
                closed = self._closed
                if closed:
                    self._threads -= 1
                else:
                    self._idle += 1
            self._settle(future, value, error)
            if closed:
                return

    def _settle(self, future: Future[Any], value: Any, error: BaseException | None) -> None:
        try:
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
        except InvalidStateError:  # abandoned at its deadline: the late outcome is dropped
            with self._lock:
                self.abandoned -= 1
            log.info("an abandoned activity run returned at last; its outcome is dropped")

    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch, name=f"{self._name}-deadlines", daemon=True
            )
            self._watcher.start()

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                for job_id, (deadline, future, what) in list(self._deadlines.items()):
                    if deadline <= now:
                        del self._deadlines[job_id]
                        if not future.done():
                            self._abandon(future, what)
                soonest = min((d for d, _, _ in self._deadlines.values()), default=None)
                self._wake.wait(None if soonest is None else max(soonest - now, 0.001))

    def _abandon(self, future: Future[Any], what: str) -> None:
        self.abandoned += 1  # its thread stays busy; a new one serves the next task
        log.warning(
            "%s passed its start-to-close timeout and is abandoned (%d abandoned runs still "
            "hold a thread)",
            what,
            self.abandoned,
        )
        try:
            future.set_exception(ActivityTimeoutError(f"{what} did not finish within its timeout"))
        except InvalidStateError:  # finished in the same instant
            self.abandoned -= 1
