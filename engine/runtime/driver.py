"""The deterministic coroutine driver: fibers, the ready queue and the step budget.

Workflow coroutines are driven with ``send()`` / ``throw()`` by this module, never by an
asyncio event loop, so that the order in which code runs is a pure function of the history.

Scheduling order (fixed, and the same on replay):

1. A turn first applies its inbound events in the order given (history order on replay).
   Applying an event resolves the task waiting for it; resolving a task appends its waiters
   to the FIFO *ready queue* in the order they started waiting. Nothing runs yet.
2. The driver then pops the head of the ready queue and runs it: a fiber is resumed until
   its next ``await`` of a pending task (or until it finishes); an internal continuation
   (cancelling a timer, scheduling a retry, cancelling ``when_any`` losers) is called.
   Anything resolved meanwhile appends its waiters at the tail.
3. A new fiber (the workflow's main coroutine, ``ctx.spawn``, coroutines passed to
   ``when_all``/``when_any``) is appended at the tail when it is created.
4. After every step, pending ``wait_condition`` predicates are evaluated in the order they
   were registered; a true predicate resolves its task (its waiters go to the tail).
5. The run ends when the ready queue is empty (every fiber waits on something durable),
   or when the instance finishes (the main coroutine returned or raised, or
   ``continue_as_new`` was called): the remaining queue is then dropped.

A bare ``yield`` (what ``asyncio.sleep(0)`` does) re-queues the fiber at the tail. Every
resumption and continuation counts as one step; a turn that takes more steps than the
budget (100,000 by default) fails the instance with :class:`StepBudgetExceededError`
instead of stalling its partition. The budget catches code that spins the scheduler or
keeps spawning work without waiting on anything durable. Code that never reaches the driver
(``while True: pass``, endless awaits of already-resolved tasks) is stopped from outside:
the journal bounds the events one turn may add, and the processor's turn watchdog bounds
its CPU time (both raise a :class:`~engine.runtime.interrupt.TurnInterrupt`, which this
driver lets through instead of failing the thread with it).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Coroutine, Generator, Sequence
from typing import Any, Protocol, TypeVar

from engine.core.errors import StepBudgetExceededError
from engine.runtime.cancel import cancelled_error
from engine.runtime.interrupt import TurnInterrupt
from engine.runtime.tasks import PENDING, ReadyQueue, Task

T = TypeVar("T")


class FiberHost(ReadyQueue, Protocol):
    """What fibers and the driver need from the generation they run in."""

    @property
    def instance_id(self) -> str: ...

    @property
    def fibers(self) -> dict[Fiber[Any], None]: ...

    @property
    def halt(self) -> bool: ...

    @property
    def conditions(self) -> Sequence[object]: ...

    @property
    def orphaned(self) -> deque[Fiber[Any]]: ...

    def check_conditions(self) -> None: ...


DEFAULT_STEP_BUDGET = 100_000


class Fiber(Task[T]):
    """A coroutine running inside one instance; awaitable for its return value."""

    __slots__ = ("_coro", "_gen", "_scheduled", "_throw", "_waiting_on", "_woken_by", "observed")

    def __init__(self, gen: FiberHost, coro: Coroutine[Any, Any, T]) -> None:
        super().__init__()
        self._coro = coro
        self._gen = gen
        self._throw: BaseException | None = None
        self._waiting_on: Task[Any] | None = None
        self._woken_by: Task[Any] | None = None
        #: Whether anything awaited this fiber or read its outcome (see FiberHost.orphaned).
        self.observed = False
        self._scheduled = True
        gen.ready.append(self)
        gen.fibers[self] = None

    def wakeup(self, task: Task[Any]) -> None:
        self._waiting_on = None
        self._woken_by = task  # read when the coroutine resumes, unless cancelled first
        if not self._scheduled:
            self._scheduled = True
            self._gen.ready.append(self)

    def __call__(self) -> None:
        """Run the coroutine up to its next await of a pending task (one driver step)."""
        self._scheduled = False
        self._woken_by = None
        if self._state != PENDING:
            return
        throw = self._throw
        try:
            if throw is None:
                yielded = self._coro.send(None)
            else:
                self._throw = None
                yielded = self._coro.throw(throw)
        except StopIteration as stop:
            del self._gen.fibers[self]
            self.set_result(stop.value)
            return
        except (KeyboardInterrupt, SystemExit, TurnInterrupt):
            raise
        except BaseException as exc:
            del self._gen.fibers[self]
            if self._waiters is None:
                self._gen.orphaned.append(self)  # nobody awaits it: see Generation.orphaned
            else:
                self.observed = True
            self.set_exception(exc)
            return
        if isinstance(yielded, Task):
            if not yielded.done():
                self._waiting_on = yielded
                yielded.add_waiter(self)
                return
        elif yielded is not None:
            self._throw = TypeError(
                f"workflow code awaited {yielded!r}, which the workflow driver cannot wait "
                f"for: await only ctx operations, tasks and coroutines built from them "
                f"(not asyncio futures or other event-loop objects)"
            )
        self._reschedule()

    def _reschedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._gen.ready.append(self)

    def cancel(self) -> bool:
        """Throw ``CancelledError`` into the coroutine at its current ``await``.

        What the fiber waits on is cancelled too when this fiber is its only waiter (so a
        pending timer is journaled as cancelled). The fiber may catch the error and run
        clean-up code, including new durable work, before it finishes.
        """
        if self._state != PENDING:
            return False
        woken = self._woken_by
        if woken is not None:  # resolved but not read yet: an event in it goes back
            self._woken_by = None
            woken.withdraw(self)
        waiting = self._waiting_on
        if waiting is not None:
            if waiting.has_sole_waiter(self) and waiting.cancel():
                return True
            waiting.remove_waiter(self)
            self._waiting_on = None
        self._throw = cancelled_error()
        self._reschedule()
        return True

    def __await__(self) -> Generator[Task[Any], None, T]:
        self.observed = True
        return super().__await__()

    def result(self) -> T:
        self.observed = True
        return super().result()

    def exception(self) -> BaseException | None:
        self.observed = True
        return super().exception()

    def close(self) -> None:
        """Close the coroutine without running it further (the generation has ended)."""
        if self._state == PENDING:
            # clean-up code of an ended workflow may raise anything; nothing can use it
            with contextlib.suppress(BaseException):
                self._coro.close()


def run_ready(gen: FiberHost, budget: int) -> None:
    """Run the ready queue to exhaustion, or until the generation halts.

    Raises :class:`StepBudgetExceededError` after ``budget`` steps.
    """
    ready = gen.ready
    popleft = ready.popleft
    conditions = gen.conditions
    steps = 0
    while ready:
        steps += 1
        if steps > budget:
            raise StepBudgetExceededError(
                f"workflow code of instance {gen.instance_id!r} ran {budget} scheduling "
                f"steps in one turn without waiting on anything durable; it is probably "
                f"looping (awaiting asyncio.sleep(0), or spawning work endlessly). Await "
                f"ctx operations in loops, or raise the step budget if this is intended."
            )
        popleft()()
        if gen.halt:
            return
        if conditions:
            gen.check_conditions()
