"""Durable tasks: timers, activities, child workflows, event waits and conditions.

Each task journals its decisions through its generation (seen as a :class:`TaskHost`) and
registers itself under its task id, so that inbound events (results, timer fires) find their
waiting point. Methods
marked *apply* run while inbound events are applied and only change state; methods marked
*run* run on the driver and may journal decisions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Generator
from typing import Any, NoReturn, Protocol, TypeVar

from engine.core.errors import (
    ActivityFailedError,
    ChildWorkflowFailedError,
    CodecError,
    NonDeterminismError,
    WorkflowTimeoutError,
)
from engine.core.failure import FailureDetails
from engine.core.history import (
    ActivityCancelRequested,
    ChildWorkflowCreated,
    EventBody,
    ExecutionStarted,
    ParentClosePolicy,
    TaskScheduled,
    TimerCancelled,
    TimerCreated,
)
from engine.core.messages import ActivityTask
from engine.core.payloads import Payload
from engine.core.typed import convert
from engine.runtime.actions import (
    AbandonAttempt,
    CancelActivity,
    CancelTimer,
    CreateTimer,
    ScheduleActivity,
    StartChild,
    close_children,
)
from engine.runtime.activity_options import ActivityOptions
from engine.runtime.cancel import cancelled_error
from engine.runtime.failures import raised_from
from engine.runtime.fastjson import decode
from engine.runtime.journal import Journal
from engine.runtime.retry import RetryPolicy
from engine.runtime.tasks import FAILED, PENDING, ReadyQueue, Task, Waiter

B = TypeVar("B", bound=EventBody)


class TaskHost(ReadyQueue, Protocol):
    """What durable tasks need from their generation: its journal, its task tables and the
    ready queue (the generation implements it; this module does not import it)."""

    next_task_id: int

    @property
    def journal(self) -> Journal: ...

    @property
    def number(self) -> int: ...

    @property
    def instance_id(self) -> str: ...

    @property
    def started(self) -> ExecutionStarted: ...

    @property
    def closing(self) -> bool: ...

    @property
    def tasks(self) -> dict[int, Task[Any]]: ...

    @property
    def timers(self) -> dict[int, TimerTask]: ...

    @property
    def children(self) -> dict[int, ChildTask]: ...

    @property
    def conditions(self) -> list[ConditionTask]: ...

    @property
    def event_waiters(self) -> dict[str, OrderedDict[EventWait, None]]: ...

    @property
    def claims(self) -> dict[int, EventWait]: ...

    def offer_event(self, arrival: int, name: str, payload: Payload | None) -> None: ...

    def jitter_draw(self, task_id: int, attempt: int) -> float: ...

    def command(self, body: B) -> B | None: ...

    def refuse(self) -> NoReturn: ...

    def diverged(self, attempted: EventBody) -> NonDeterminismError: ...


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


class TimerTask(Task[None]):
    """A durable timer; ``owner`` (if any) is told when it fires."""

    __slots__ = ("_gen", "_owner", "fire_at_ms", "task_id")

    def __init__(self, gen: TaskHost, fire_at_ms: int, owner: Any = None) -> None:
        super().__init__()
        self._gen = gen
        self._owner = owner
        task_id = gen.next_task_id
        gen.next_task_id = task_id + 1
        self.task_id = task_id
        journal = gen.journal
        if gen.closing:
            gen.refuse()
        if not journal.replaying:
            journal.append(TimerCreated(task_id, fire_at_ms))
            journal.actions.append(CreateTimer(task_id, fire_at_ms, generation=gen.number))
        else:
            recorded = journal.match_timer(task_id)
            if recorded is None:
                raise gen.diverged(TimerCreated(task_id, fire_at_ms))
            fire_at_ms = recorded.fire_at_ms  # the recorded time stays in force
        self.fire_at_ms = fire_at_ms
        gen.tasks[task_id] = self
        gen.timers[task_id] = self

    def fire(self) -> None:
        """*apply*: the timer fired."""
        del self._gen.timers[self.task_id]
        self.set_result(None)
        if self._owner is not None:
            self._owner.timer_fired(self)

    def _cancel_hook(self) -> None:
        """*run*: journal the cancellation and drop the timer row."""
        gen = self._gen
        del gen.timers[self.task_id]
        if gen.command(TimerCancelled(self.task_id)) is None:
            gen.journal.actions.append(
                CancelTimer(self.task_id, self.fire_at_ms, generation=gen.number)
            )


def _cancel_if_pending(timer: TimerTask | None) -> None:
    if timer is not None and not timer.done():
        timer.cancel()


def _decoded(task: Task[Any], payload: Payload | None, result_type: Any = None) -> None:
    try:
        value = convert(decode(payload), result_type)
    except CodecError as exc:
        task.set_exception(exc)
    else:
        task.set_result(value)


RUNNING = 0
BACKOFF = 1
FINISHED = 2


class ActivityCall(Task[Any]):
    """An activity call: attempts, start-to-close timeouts and retries with backoff."""

    __slots__ = (
        "_backoff",
        "_close_timer",
        "_gen",
        "_options",
        "_policy",
        "_timeout",
        "_timeout_ms",
        "attempt",
        "deadline_ms",
        "heartbeat_details",
        "input",
        "name",
        "phase",
        "result_type",
        "task_id",
    )

    def __init__(
        self,
        gen: TaskHost,
        name: str,
        input: Payload | None,
        policy: RetryPolicy,
        options: ActivityOptions,
    ) -> None:
        self._state = PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._waiters: list[Waiter] | None = None
        self._gen = gen
        self.name = name
        self.input = input
        self._policy = policy
        self._options = options
        #: The workflow's own per-attempt timer (0: none; see engine.runtime.activity_options).
        self._timeout_ms = options.attempt_timer_ms
        self._timeout: TimerTask | None = None
        self._backoff: TimerTask | None = None
        self._close_timer: TimerTask | None = None
        #: When the whole call must be over (schedule-to-close), epoch ms; 0: never.
        self.deadline_ms = 0
        #: The last heartbeat details a failed attempt reported, for the next attempt.
        self.heartbeat_details: Payload | None = None
        task_id = gen.next_task_id
        gen.next_task_id = task_id + 1
        self.task_id = task_id
        self.attempt = 1
        self.phase = RUNNING
        #: The annotation the result is converted to (see engine.core.typed); None: plain.
        self.result_type: Any = None
        gen.tasks[task_id] = self
        if options.schedule_to_close_ms:
            close = TimerTask(gen, gen.journal.now_ms + options.schedule_to_close_ms, self)
            self._close_timer, self.deadline_ms = close, close.fire_at_ms
        self._start_attempt()

    @property
    def task_queue(self) -> str:
        return self._options.task_queue

    def _start_attempt(self) -> None:
        """*run*: schedule the current attempt (and its timeout timer)."""
        gen = self._gen
        journal = gen.journal
        if gen.closing:
            gen.refuse()
        task_id, name, input, attempt = self.task_id, self.name, self.input, self.attempt
        replaying = journal.replaying
        if not replaying:
            journal.append(TaskScheduled(task_id, name, input, attempt, self._timeout_ms))
        elif not journal.match_activity(task_id, name, input, attempt):
            raise gen.diverged(TaskScheduled(task_id, name, input, attempt, self._timeout_ms))
        self.phase = RUNNING
        if self._timeout_ms:
            self._timeout = TimerTask(gen, gen.journal.now_ms + self._timeout_ms, self)
        if not replaying:  # after its timer, whose fire time bounds the attempt's deadline
            journal.actions.append(self._schedule_action())

    def _attempt_deadline_ms(self) -> int:
        """When the workflow stops waiting for this attempt (0: never): its own timer or
        the call's schedule-to-close, whichever comes first."""
        ends = [t for t in (self.deadline_ms, self._timeout and self._timeout.fire_at_ms) if t]
        return min(ends) if ends else 0

    def _schedule_action(self) -> ScheduleActivity:
        o = self._options
        return ScheduleActivity(
            self.task_id,
            self.name,
            self.input,
            self.attempt,
            o.start_to_close_ms,
            generation=self._gen.number,
            task_queue=o.task_queue,
            schedule_to_start_ms=o.schedule_to_start_ms,
            deadline_ms=self._attempt_deadline_ms(),
            heartbeat_timeout_ms=o.heartbeat_timeout_ms,
            heartbeat_details=self.heartbeat_details,
        )

    def reissue(self) -> ScheduleActivity | None:
        """The task of the attempt that runs now, to send again for a new run built from
        this history (a reset); None between attempts or once finished."""
        return self._schedule_action() if self.phase == RUNNING and not self.done() else None

    def check_result(self, attempt: int) -> str | None:
        """*apply*: why a result for ``attempt`` cannot be applied (None if it can)."""
        if self.phase == RUNNING and attempt == self.attempt:
            return None
        if self.phase == FINISHED:
            how = "was cancelled" if self.cancelled() else "has already completed"
            return f"activity task {self.task_id} ({self.name!r}) {how}"
        return (
            f"attempt {attempt} of activity task {self.task_id} ({self.name!r}) is stale: "
            f"the current attempt is {self.attempt}"
            + (" (its predecessor failed; a retry is pending)" if self.phase == BACKOFF else "")
        )

    def completed(self, output: Payload | None) -> None:
        """*apply*: the current attempt succeeded."""
        self.phase = FINISHED
        if self._timeout is not None:
            self._drop_timeout()
        self._drop_close_timer()
        _decoded(self, output, self.result_type)

    def failed(self, failure: FailureDetails, details: Payload | None = None) -> None:
        """*apply*: the current attempt failed; retry (after a backoff) or give up.
        ``details``: its last heartbeat details, which the next attempt starts from."""
        if details is not None:
            self.heartbeat_details = details
        if self._policy.should_retry(self.attempt, failure):
            self.phase = BACKOFF
            self._gen.ready.append(self._begin_backoff)
            return
        self._give_up(failure)

    def _give_up(self, failure: FailureDetails) -> None:
        self.phase = FINISHED
        self._drop_timeout()
        self._drop_close_timer()
        backoff, self._backoff = self._backoff, None
        if backoff is not None and not backoff.done():
            self._gen.ready.append(backoff.cancel)
        message = (
            f"activity {self.name!r} failed after {self.attempt} attempt(s): "
            f"{failure.type}: {failure.message}"
        )
        self.set_exception(raised_from(ActivityFailedError(message, failure), failure))

    def _drop_timeout(self) -> None:
        timeout = self._timeout
        if timeout is not None and not timeout.done():
            self._gen.ready.append(timeout.cancel)
        self._timeout = None

    def _drop_close_timer(self) -> None:
        close = self._close_timer
        if close is not None and not close.done():
            self._gen.ready.append(close.cancel)
        self._close_timer = None

    def _begin_backoff(self) -> None:
        """*run*: cancel the failed attempt's timeout, start the backoff timer."""
        if self.phase != BACKOFF:
            return
        _cancel_if_pending(self._timeout)
        self._timeout = None
        draw = self._gen.jitter_draw(self.task_id, self.attempt)
        delay = self._policy.delay_ms(self.attempt, draw)
        if delay > 0:
            self._backoff = TimerTask(self._gen, self._gen.journal.now_ms + delay, self)
        else:
            self._next_attempt()

    def _next_attempt(self) -> None:
        """*run*: the backoff is over."""
        if self.phase == BACKOFF:
            self.attempt += 1
            self._start_attempt()

    def timer_fired(self, timer: TimerTask) -> None:
        """*apply*: the start-to-close timeout or the backoff timer fired."""
        if timer is self._timeout:
            self._timeout = None
            if self.phase == RUNNING:
                self.abandon(
                    f"the workflow's timeout of {_seconds(self._timeout_ms)} for attempt "
                    f"{self.attempt} passed"
                )
                self.failed(
                    FailureDetails(
                        "ActivityTimeoutError",
                        f"activity {self.name!r} attempt {self.attempt} did not finish within "
                        f"its start-to-close timeout of {_seconds(self._timeout_ms)}",
                        "",
                        True,
                    )
                )
        elif timer is self._backoff:
            self._backoff = None
            if self.phase == BACKOFF:
                self._gen.ready.append(self._next_attempt)
        elif timer is self._close_timer:
            self._close_timer = None
            if self.phase == RUNNING:
                self.abandon("the call's schedule-to-close timeout passed")
            if self.phase != FINISHED:
                self._give_up(
                    FailureDetails(
                        "ActivityTimeoutError",
                        f"activity {self.name!r} did not complete within its schedule-to-close "
                        f"timeout of {_seconds(self._options.schedule_to_close_ms)} (attempt "
                        f"{self.attempt})",
                        "",
                        False,
                    )
                )

    def _cancel_hook(self) -> None:
        """*run*: stop waiting; a running attempt gets a cancellation request (in history,
        and a ``CancelActivity`` action), and its late result will be rejected as stale."""
        running = self.phase == RUNNING
        self.phase = FINISHED
        _cancel_if_pending(self._timeout)
        _cancel_if_pending(self._backoff)
        _cancel_if_pending(self._close_timer)
        if not running:
            return  # between attempts (a retry backoff): nothing runs on a worker
        gen = self._gen
        if gen.command(ActivityCancelRequested(self.task_id, self.attempt)) is None:
            call = ActivityTask(
                gen.instance_id,
                generation=gen.number,
                task_id=self.task_id,
                run_id=gen.started.run_id,
            )
            key = call.idempotency_key  # the same key the worker's attempt has
            gen.journal.actions.append(
                CancelActivity(self.task_id, self.name, self.attempt, key, generation=gen.number)
            )
            self.abandon("the workflow cancelled the call")

    def abandon(self, reason: str) -> None:
        """The workflow stops waiting for the running attempt without its result: report
        it (an ``AbandonAttempt`` action), so that its worker is told. Nothing on replay:
        the worker was told when it happened."""
        gen = self._gen
        journal = gen.journal
        if not journal.replaying:
            journal.actions.append(
                AbandonAttempt(
                    self.task_id, self.attempt, self.task_queue, reason, generation=gen.number
                )
            )


class ChildTask(Task[Any]):
    """A child workflow. Cancelling it (a when_any loser, a cancelled fiber) stops waiting
    and applies its parent-close policy to the running child right away."""

    __slots__ = ("_gen", "instance_id", "name", "policy", "result_type", "task_id")

    def __init__(
        self,
        gen: TaskHost,
        name: str,
        input: Payload | None,
        instance_id: str | None,
        version: str,
        policy: ParentClosePolicy = ParentClosePolicy.TERMINATE,
    ) -> None:
        super().__init__()
        self._gen = gen
        self.name = name
        self.result_type: Any = None
        task_id = gen.next_task_id
        gen.next_task_id = task_id + 1
        self.task_id = task_id
        if instance_id is None:
            instance_id = f"{gen.instance_id}:{gen.number}:{task_id}"
        body = ChildWorkflowCreated(task_id, name, instance_id, input, version, policy)
        recorded = gen.command(body)
        if recorded is None:
            gen.journal.actions.append(
                StartChild(
                    task_id, instance_id, name, version, input, policy, generation=gen.number
                )
            )
        else:
            instance_id = recorded.instance_id
            policy = recorded.parent_close_policy  # the recorded policy stays in force
        self.instance_id = instance_id
        self.policy = policy
        gen.tasks[task_id] = self
        gen.children[task_id] = self

    def _cancel_hook(self) -> None:
        """*run*: nobody waits for the child any more: apply its parent-close policy."""
        gen = self._gen
        del gen.children[self.task_id]
        if not gen.journal.replaying:
            reason = f"parent {gen.instance_id} stopped waiting for it (cancelled)"
            gen.journal.actions.extend(
                close_children([(self.instance_id, self.policy)], reason, gen.number)
            )

    def completed(self, output: Payload | None) -> None:
        """*apply*"""
        del self._gen.children[self.task_id]
        if self._state == PENDING:
            _decoded(self, output, self.result_type)

    def failed(self, failure: FailureDetails) -> None:
        """*apply*"""
        del self._gen.children[self.task_id]
        if self._state == PENDING:
            message = (
                f"child workflow {self.name!r} ({self.instance_id}) failed: "
                f"{failure.type}: {failure.message}"
            )
            self.set_exception(raised_from(ChildWorkflowFailedError(message, failure), failure))


class EventWait(Task[Any]):
    """Waiting for the next external event of one name, with an optional timeout.

    Delivery bookkeeping: an event handed to a wait is *claimed* (listed in the
    generation's ``claims`` under its arrival number) until the code reads it (``await``,
    ``result()``: *consumed*). A claimed event is carried over by a continue-as-new, and a
    wait that will not be read (a when_any loser, a fiber cancelled before it resumed)
    gives its event back (:meth:`withdraw`): to the next waiter for the name, else to the
    buffer at its arrival position. ``buffered`` builds a wait that claims an event
    already in the buffer.
    """

    __slots__ = ("_gen", "_payload", "_readers", "_timeout_ms", "_timer", "arrival", "name")

    def __init__(
        self,
        gen: TaskHost,
        name: str,
        timeout_ms: int | None,
        buffered: tuple[int, Payload | None] | None = None,
    ) -> None:
        super().__init__()
        self._gen = gen
        self.name = name
        self._timeout_ms = timeout_ms
        self._timer: TimerTask | None = None
        self.arrival = -1
        self._payload: Payload | None = None
        self._readers: tuple[Any, ...] = ()
        if buffered is not None:
            self._claim(*buffered)
            return
        waiting = gen.event_waiters.get(name)
        if waiting is None:
            gen.event_waiters[name] = OrderedDict(((self, None),))
        else:
            waiting[self] = None
        if timeout_ms is not None:
            self._timer = TimerTask(gen, gen.journal.now_ms + timeout_ms, self)

    def deliver(self, arrival: int, payload: Payload | None) -> None:
        """*apply*: the event arrived."""
        timer = self._timer
        if timer is not None and not timer.done():
            self._gen.ready.append(timer.cancel)
        self._claim(arrival, payload)

    @property
    def held(self) -> Payload | None:
        """The payload of the event this wait claimed."""
        return self._payload

    def _claim(self, arrival: int, payload: Payload | None) -> None:
        self.arrival = arrival
        self._payload = payload
        self._readers = tuple(self._waiters or ())
        self._gen.claims[arrival] = self
        _decoded(self, payload)

    def __await__(self) -> Generator[Task[Any], None, Any]:
        while self._state == PENDING:
            yield self
        self.consume()
        if self._error is not None:
            raise self._error
        return self._value

    def result(self) -> Any:
        if self._state != PENDING:
            self.consume()
        return super().result()

    def consume(self) -> None:
        """The code read the event: it is no longer claimed (never carried or given back)."""
        arrival = self.arrival
        if arrival >= 0:
            self.arrival = -1
            claims = self._gen.claims
            if claims.get(arrival) is self:
                del claims[arrival]

    def withdraw(self, by: object) -> None:
        """Give the event back unless a reader other than ``by`` will still read it; the
        wait then counts as cancelled."""
        arrival = self.arrival
        if arrival < 0 or any(reader is not by for reader in self._readers):
            return
        self.consume()
        self._value = None
        self._state = FAILED
        self._error = cancelled_error()
        self._gen.offer_event(arrival, self.name, self._payload)

    def _unlist(self) -> None:
        waiting = self._gen.event_waiters.get(self.name)
        if waiting is not None:
            waiting.pop(self, None)

    def timer_fired(self, timer: TimerTask) -> None:
        """*apply*: the timeout fired first."""
        if self._state == PENDING:
            self._unlist()
            self.set_exception(
                WorkflowTimeoutError(
                    f"no event {self.name!r} arrived within {_seconds(self._timeout_ms or 0)}"
                )
            )

    def _cancel_hook(self) -> None:
        self._unlist()
        _cancel_if_pending(self._timer)


class ConditionTask(Task[None]):
    """Waiting until a predicate over workflow state becomes true."""

    __slots__ = ("_gen", "_timeout_ms", "_timer", "predicate")

    def __init__(
        self, gen: TaskHost, predicate: Callable[[], object], timeout_ms: int | None
    ) -> None:
        super().__init__()
        self._gen = gen
        self.predicate = predicate
        self._timeout_ms = timeout_ms
        self._timer: TimerTask | None = None
        gen.conditions.append(self)
        if timeout_ms is not None:
            self._timer = TimerTask(gen, gen.journal.now_ms + timeout_ms, self)

    def evaluate(self) -> None:
        """*run*: resolve (and stop waiting) if the predicate holds or raises."""
        try:
            holds = bool(self.predicate())
        except Exception as exc:  # the waiter sees the predicate's error
            self._finish()
            self.set_exception(exc)
            return
        if holds:
            self._finish()
            self.set_result(None)

    def _finish(self) -> None:
        if self in self._gen.conditions:
            self._gen.conditions.remove(self)
        _cancel_if_pending(self._timer)

    def timer_fired(self, timer: TimerTask) -> None:
        """*apply*"""
        if self._state == PENDING:
            if self in self._gen.conditions:
                self._gen.conditions.remove(self)
            self.set_exception(
                WorkflowTimeoutError(
                    f"condition did not become true within {_seconds(self._timeout_ms or 0)}"
                )
            )

    def _cancel_hook(self) -> None:
        self._finish()
