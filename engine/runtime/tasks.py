"""Awaitable task objects: what workflow code awaits.

Workflow code runs on the engine's own deterministic driver (see
:mod:`engine.runtime.driver`), not on an asyncio event loop. Everything it awaits is a
:class:`Task`: ``__await__`` yields the task itself to the driver when it is still pending,
and returns its value (or raises its error) once it is resolved. A task resolved before it
is awaited (an inline step, a buffered event) is awaited without any scheduling step at all,
which keeps chains of inline steps cheap.

Resolution happens either while a turn's inbound events are applied (a task result, a timer
firing) or while the code runs. Resolving a task only changes state and queues the waiters;
anything that must be journaled as a decision (cancelling a timer, scheduling a retry) is
deferred to the driver run, so that decisions are always made by the running code in a
fixed order, and replay makes them again in the same order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from engine.runtime.cancel import cancelled_error, is_cancelled

T = TypeVar("T")

PENDING = 0
DONE = 1
FAILED = 2


class ReadyQueue(Protocol):
    """Where work that may run now waits for the driver (a generation's ready queue)."""

    @property
    def ready(self) -> deque[Callable[[], object]]: ...


class Waiter(Protocol):
    """Something that wants to know when a task resolves."""

    def wakeup(self, task: Task[Any]) -> None: ...


class Task(Generic[T]):
    """An awaitable, cancellable unit of workflow work."""

    __slots__ = ("_error", "_state", "_value", "_waiters")

    def __init__(self) -> None:
        self._state = PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._waiters: list[Waiter] | None = None

    def __await__(self) -> Generator[Task[Any], None, T]:
        while self._state == PENDING:
            yield self
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value

    def __repr__(self) -> str:
        state = ("pending", "done", "failed")[self._state]
        return f"<{type(self).__name__} {state}>"

    # --- public, asyncio-like -----------------------------------------------------------------

    def done(self) -> bool:
        return self._state != PENDING

    def cancelled(self) -> bool:
        return is_cancelled(self._error)

    def result(self) -> T:
        """The value; raises the task's error if it failed, RuntimeError if still pending."""
        if self._state == PENDING:
            raise RuntimeError(f"{self!r} is not done yet; await it first")
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value

    def exception(self) -> BaseException | None:
        if self._state == PENDING:
            raise RuntimeError(f"{self!r} is not done yet; await it first")
        return self._error

    def cancel(self) -> bool:
        """Cancel a pending task; returns False when it had already resolved.

        Only call this from running workflow code (cancelling may journal decisions, such as
        a cancelled timer).
        """
        if self._state != PENDING:
            return False
        self._cancel_hook()
        if self._state == PENDING:
            self.set_exception(cancelled_error())
        return True

    # --- runtime side -------------------------------------------------------------------------

    def _cancel_hook(self) -> None:
        """Kind-specific clean-up when cancelled (overridden by durable tasks)."""

    def set_result(self, value: Any) -> None:
        self._state = DONE
        self._value = value
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for waiter in waiters:
                waiter.wakeup(self)

    def set_exception(self, error: BaseException) -> None:
        self._state = FAILED
        self._error = error
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for waiter in waiters:
                waiter.wakeup(self)

    def add_waiter(self, waiter: Waiter) -> None:
        if self._waiters is None:
            self._waiters = [waiter]
        else:
            self._waiters.append(waiter)

    def remove_waiter(self, waiter: Waiter) -> None:
        if self._waiters is not None and waiter in self._waiters:
            self._waiters.remove(waiter)

    def has_sole_waiter(self, waiter: Waiter) -> bool:
        waiters = self._waiters
        return waiters is not None and len(waiters) == 1 and waiters[0] is waiter

    # --- delivery: who read a resolved task's outcome -----------------------------------------

    def peek(self) -> Any:
        """The value of a resolved task without counting it as read (for aggregates)."""
        return self._value

    def peek_error(self) -> BaseException | None:
        """The error of a resolved task without counting it as read."""
        return self._error

    def consume(self) -> None:
        """The workflow code has read this task's outcome (an event task marks its event
        consumed; an aggregate passes it on). Nothing for most tasks."""

    def withdraw(self, by: object) -> None:
        """``by`` (a when_any, a cancelled fiber) will not read this resolved task: a task
        that holds an event nobody else will read gives it back (see ``EventWait``)."""


def completed_task(value: Any) -> Task[Any]:
    """A task that is already resolved with ``value``."""
    task: Task[Any] = Task()
    task.set_result(value)
    return task


def failed_task(error: BaseException) -> Task[Any]:
    """A task that has already failed with ``error``."""
    task: Task[Any] = Task()
    task.set_exception(error)
    return task


class WhenAll(Task[list[Any]]):
    """Resolves with every task's value, in order; fails as soon as one of them fails.

    Like ``asyncio.gather``, a failure does not cancel the other tasks.
    """

    __slots__ = ("_left", "_readers", "_tasks")

    def __init__(self, tasks: list[Task[Any]]) -> None:
        super().__init__()
        self._tasks = tasks
        self._readers: tuple[Waiter, ...] = ()
        left = 0
        for task in tasks:
            if not task.done():
                left += 1
                task.add_waiter(self)
            elif (error := task.exception()) is not None and self._state == PENDING:
                self.set_exception(error)
        self._left = left
        if left == 0 and self._state == PENDING:
            self.set_result([task.peek() for task in tasks])

    def wakeup(self, task: Task[Any]) -> None:
        if self._state != PENDING:
            return
        error = task.exception()
        if error is not None:
            self.set_exception(error)
            return
        self._left -= 1
        if self._left == 0:
            self._readers = tuple(self._waiters or ())
            self.set_result([t.peek() for t in self._tasks])

    def __await__(self) -> Generator[Task[Any], None, list[Any]]:
        while self._state == PENDING:
            yield self
        self.consume()
        if self._error is not None:
            raise self._error
        value: list[Any] = self._value
        return value

    def result(self) -> list[Any]:
        if self._state != PENDING:
            self.consume()
        return super().result()

    def consume(self) -> None:
        """Reading the list reads every value in it."""
        for task in self._tasks:
            task.consume()

    def withdraw(self, by: object) -> None:
        if all(reader is by for reader in self._readers):
            for task in self._tasks:
                task.withdraw(self)

    def _cancel_hook(self) -> None:
        for task in self._tasks:
            if not task.done():
                task.cancel()
            else:
                task.withdraw(self)  # a value that arrived is not lost with the aggregate


class WhenAny(Task[Task[Any]]):
    """Resolves with the first task to finish (the winner) and cancels the others.

    The winner is returned as a task: awaiting it gives its value or raises its error. The
    losers are cancelled by the running code (after the current step), so that pending timers
    among them are journaled as cancelled and cancelled fibers get ``CancelledError``.
    """

    __slots__ = ("_gen", "_readers", "_tasks")

    def __init__(self, gen: ReadyQueue, tasks: list[Task[Any]]) -> None:
        super().__init__()
        if not tasks:
            raise ValueError("when_any needs at least one task")
        self._gen = gen
        self._tasks = tasks
        self._readers: tuple[Waiter, ...] = ()
        for task in tasks:
            if task.done():
                self.set_result(task)
                self._cancel_losers()
                return
        for task in tasks:
            task.add_waiter(self)

    def wakeup(self, task: Task[Any]) -> None:
        if self._state == PENDING:
            # queue the cancellation first, so that it happens before any waiter resumes
            self._gen.ready.append(self._cancel_losers)
            self._readers = tuple(self._waiters or ())
            self.set_result(task)

    def withdraw(self, by: object) -> None:
        """Nobody will look at the winner either: it gives back what it holds."""
        winner = self._value
        if isinstance(winner, Task) and all(reader is by for reader in self._readers):
            winner.withdraw(self)

    def _cancel_losers(self) -> None:
        """Cancel the pending losers; a loser resolved in the winner's turn (an event that
        arrived in the same batch) gives its event back for a later wait."""
        winner = self._value
        for task in self._tasks:
            if task is winner:
                continue
            if task.done():
                task.withdraw(self)
            else:
                task.cancel()

    def _cancel_hook(self) -> None:
        for task in self._tasks:
            if not task.done():
                task.cancel()
