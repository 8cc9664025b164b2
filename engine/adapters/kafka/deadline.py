"""Deadlines the engine enforces itself on librdkafka's blocking transactional calls.

Why: librdkafka does not always honour the timeout it is given. ``send_offsets_to_transaction``
can block for good when the group coordinator stops answering (its coordinator requests carry
a timeout that nothing checks: librdkafka issues #5456 and #5511, not fixed in 2.16.x, the
newest release of confluent-kafka). A thread stuck in such a call stops polling, keeps its
partitions through rebalances, and - since the call never returns to Python - a process whose
main thread is stuck there cannot even run its SIGTERM handler.

So every blocking transactional call runs on a helper thread and the caller waits for it at
most until the call's own timeout plus a grace period. The wait is a timed wait on a lock,
which signal handlers interrupt, so SIGTERM is noticed meanwhile. Past the deadline the call
is abandoned together with the producer it runs on (it is never touched again: destroying a
librdkafka handle that another thread is inside is not safe) and :class:`CallDeadlineExceeded`
tells the caller to make a new producer, whose ``init_transactions`` fences the stuck one on
the broker. Abandoned calls are bounded: when more of them pile up than ``max_abandoned``, or
the new producer's own initialisation gets stuck, the process ends itself with a log line that
names the call, so that its supervisor restarts it - never a silent hang.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, NoReturn, TypeVar

from engine.core.errors import BrokerError

__all__ = [
    "STUCK_EXIT_CODE",
    "CallDeadlineExceeded",
    "DeadlineCaller",
    "close_within",
    "end_process_stuck",
    "ends_process_if_stuck",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Exit status of a process that ended itself because a Kafka call would not return
#: (EX_TEMPFAIL: a restart is expected to help).
STUCK_EXIT_CODE = 75


class CallDeadlineExceeded(BrokerError):
    """A blocking Kafka call did not return within its deadline; it was abandoned together
    with the client it runs on. Make a new client (for a producer: one with the same
    ``transactional.id``, which fences the stuck one) and redo the work."""


def end_process_stuck(reason: str) -> NoReturn:
    """End the process at once: a Kafka call is stuck and no new client can be trusted.

    ``os._exit`` rather than ``sys.exit``: interpreter shutdown would wait for (or try to
    destroy) the client that the stuck thread is inside. Local state stays consistent, as
    after a SIGKILL: nothing is applied before its transaction committed.
    """
    log.critical("%s; ending the process so that its supervisor restarts it", reason)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # best effort before exiting
            handler.flush()
    sys.stderr.flush()
    os._exit(STUCK_EXIT_CODE)


class _Job(Generic[T]):
    def __init__(self, call: Callable[[], T]) -> None:
        self.call = call
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.call()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class _CallThread:
    """One daemon thread that runs submitted jobs in order until it is retired."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: _Job[Any]) -> None:
        self._jobs.put(job)

    def retire(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.run()


class DeadlineCaller:
    """Runs blocking calls of one client under deadlines the engine enforces."""

    def __init__(
        self,
        name: str,
        *,
        grace_s: float = 5.0,
        max_abandoned: int = 2,
        on_stuck: Callable[[str], NoReturn] = end_process_stuck,
    ) -> None:
        self.name = name
        self.grace_s = grace_s
        self.max_abandoned = max_abandoned
        self.on_stuck = on_stuck
        self.abandoned = 0
        self._thread: _CallThread | None = None
        self._calls = 0

    def call(self, what: str, timeout_s: float, fn: Callable[[], T]) -> T:
        """``fn()`` (a librdkafka call given ``timeout_s``), or :class:`CallDeadlineExceeded`
        once ``timeout_s + grace_s`` passed without it returning."""
        if self._thread is None:
            self._calls += 1
            self._thread = _CallThread(f"kafka-call-{self.name}-{self._calls}")
        job: _Job[T] = _Job(fn)
        self._thread.submit(job)
        deadline = timeout_s + self.grace_s
        if job.done.wait(deadline):
            return job.result()
        # The thread stays inside the call; the next call gets a thread of its own.
        self._thread.retire()
        self._thread = None
        self.abandoned += 1
        reason = f"{what} on {self.name} did not return within {deadline:.1f}s"
        if self.abandoned > self.max_abandoned:
            self.on_stuck(f"{reason}, and {self.abandoned} such calls are stuck by now")
        log.error("%s: abandoning it with its producer and starting a new one", reason)
        raise CallDeadlineExceeded(
            f"{reason}; the call was abandoned with its client (librdkafka does not always "
            f"enforce its own timeout)"
        )

    def close(self) -> None:
        """Let the helper thread end (after the job it may still be running)."""
        if self._thread is not None:
            self._thread.retire()
            self._thread = None


def close_within(what: str, close: Callable[[], object], timeout_s: float) -> bool:
    """Close a Kafka client on a helper thread, waiting at most ``timeout_s`` for it.

    ``Producer.close()`` flushes with no timeout and ``Consumer.close()`` leaves the group;
    against a broker that stopped answering either can block far longer than a stop may take.
    A close that does not finish in time is left to finish (or not) on its own daemon thread;
    returns whether it finished.
    """

    def run() -> None:
        try:
            close()
        except Exception as exc:  # the client goes away either way
            log.debug("%s failed (ignored): %s", what, exc)

    thread = threading.Thread(target=run, name=f"close-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("%s did not finish within %.0fs; leaving it behind", what, timeout_s)
        return False
    return True


@contextlib.contextmanager
def ends_process_if_stuck(
    what: str, timeout_s: float, on_stuck: Callable[[str], object] = end_process_stuck
) -> Iterator[None]:
    """End the process (:func:`end_process_stuck`) if the block takes longer than ``timeout_s``.

    For shutdown steps that must run on the calling thread - closing a processor's consumer
    runs its revocation callback, which commits and writes the partitions' tables - and may
    block on a broker that stopped answering.
    """
    watchdog = threading.Timer(
        timeout_s, on_stuck, args=(f"{what} did not finish within {timeout_s:.0f}s",)
    )
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
