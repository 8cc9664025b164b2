"""One generation of an instance: its fibers, waiting points and decisions.

A generation runs from an ExecutionStarted to the instance's end or to a continue-as-new.
Task ids, uuids and the seeded random generator all restart with each generation, so
everything here is rebuilt from that generation's history alone.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import CoroutineType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from engine.core.errors import (
    InlineStepFailedError,
    NonDeterminismError,
    QueryFailedError,
    WorkflowRuntimeError,
)
from engine.core.failure import failure_from_exception
from engine.core.history import (
    CustomStatusSet,
    EventBody,
    EventSent,
    ExecutionStarted,
    InlineStepCompleted,
    InlineStepFailed,
    PatchMarker,
    RecordPublished,
    TagsUpserted,
    UpdateCompleted,
)
from engine.core.payloads import Payload
from engine.core.tags import merged_tags
from engine.runtime.actions import PublishRecord, RunInlineStep, SendEvent, SetCustomStatus
from engine.runtime.cancel import cancelled_error, is_cancelled
from engine.runtime.driver import Fiber
from engine.runtime.durable import (
    RUNNING,
    ActivityCall,
    ChildTask,
    ConditionTask,
    EventWait,
    TimerTask,
)
from engine.runtime.failures import raised_from
from engine.runtime.fastjson import decode, encode
from engine.runtime.journal import Journal
from engine.runtime.steps import StepContext, run_step
from engine.runtime.tasks import Task, completed_task, failed_task

if TYPE_CHECKING:
    from engine.runtime.registry import Registry

B = TypeVar("B", bound=EventBody)


#: Why a query handler cannot decide anything (what ``refuse`` raises while one runs).
QUERY_READ_ONLY = (
    "a query handler is read-only: it may read the workflow's state, but not schedule "
    "activities, timers, child workflows or steps, wait, send or publish, continue as new, "
    "or set the custom status or tags (do that in the workflow, or use an event)"
)


@dataclass(frozen=True, slots=True)
class UpdateHandler:
    """An update's handler and optional validator (``ctx.set_update_handler``), each
    called with the update's argument if it takes a parameter (with nothing otherwise);
    ``engine.runtime.updates`` runs them."""

    fn: Callable[..., Any]
    validator: Callable[..., Any] | None = None


class ContinueAsNewRequested(BaseException):
    """Unwinds workflow code after ``ctx.continue_as_new``; never catch it."""


class Generation:
    """Per-generation runtime state, shared by the context, the tasks and the handlers."""

    __slots__ = (
        "arrivals",
        "cancel_every_fiber",
        "cancel_reason",
        "children",
        "claims",
        "closing",
        "code_started",
        "conditions",
        "continue_input",
        "continue_requested",
        "custom_status",
        "event_buffers",
        "event_waiters",
        "fatal",
        "fibers",
        "halt",
        "instance_id",
        "journal",
        "main",
        "next_task_id",
        "number",
        "orphaned",
        "patches",
        "queries",
        "query_refused",
        "querying",
        "ready",
        "registry",
        "rng",
        "run_inline_steps",
        "started",
        "tags",
        "tasks",
        "timers",
        "update_ids",
        "updates",
        "uuid_counter",
    )

    def __init__(
        self,
        journal: Journal,
        registry: Registry,
        instance_id: str,
        number: int,
        started: ExecutionStarted,
    ) -> None:
        self.journal = journal
        self.registry = registry
        self.instance_id = instance_id
        self.number = number
        self.started = started
        self.ready: deque[Callable[[], object]] = deque()
        #: The fibers that have not finished (a finished one leaves at once).
        self.fibers: dict[Fiber[Any], None] = {}
        #: Spawned fibers that failed while nothing awaited them (checked after each run).
        self.orphaned: deque[Fiber[Any]] = deque()
        self.tasks: dict[int, Task[Any]] = {}
        self.timers: dict[int, TimerTask] = {}
        self.children: dict[int, ChildTask] = {}
        self.next_task_id = 0
        self.event_buffers: dict[str, deque[tuple[int, Payload | None]]] = {}
        #: The waits for each event name, oldest first (an ordered set: a wait that times
        #: out or is cancelled leaves it without a scan of the others).
        self.event_waiters: dict[str, OrderedDict[EventWait, None]] = {}
        self.arrivals = 0
        #: Set by ExecutionCancelRequested: the main coroutine was asked to stop.
        self.cancel_reason: str | None = None
        #: Whether that request cancels every fiber and ends the instance CANCELLED (False
        #: for requests recorded before: the main coroutine alone, ending it FAILED).
        self.cancel_every_fiber = True
        self.claims: dict[int, EventWait] = {}
        self.conditions: list[ConditionTask] = []
        self.halt = False
        self.fatal: BaseException | None = None
        self.continue_requested = False
        self.continue_input: Payload | None = None
        self.main: Fiber[Any] | None = None
        self.closing = False
        #: Whether the generation's code has run at all (an update offered before it has is
        #: held until it has: its first run sets the update handlers).
        self.code_started = False
        self.run_inline_steps = True
        self.uuid_counter = 0
        self.rng: random.Random | None = None
        self.custom_status: Payload | None = None
        #: The instance's tags now: the start's, with every upsert of this generation applied.
        self.tags: dict[str, str] = dict(started.tags)
        #: The answer ``ctx.patched`` gave per patch id in this generation (asked once).
        self.patches: dict[str, bool] = {}
        #: The query handlers the code set (``ctx.set_query_handler``), by name.
        self.queries: dict[str, Callable[..., Any]] = {}
        #: A query handler runs now (``engine.runtime.queries``): every decision is refused,
        #: and ``query_refused`` notes that one was asked for even if the handler caught it.
        self.querying = False
        self.query_refused = False
        #: The update handlers the code set (``ctx.set_update_handler``), by name.
        self.updates: dict[str, UpdateHandler] = {}
        #: Every update accepted in this generation, by update id: None while its handler
        #: runs, then its ``UpdateCompleted`` (so a retry is answered instead of run again);
        #: also those earlier generations completed (``UpdatesCarried``).
        self.update_ids: dict[str, UpdateCompleted | None] = {}

    # --- journaling ---------------------------------------------------------------------------

    def command(self, body: B) -> B | None:
        """Journal a decision (see :meth:`Journal.command`); a mismatch halts the run."""
        if self.closing:
            self.refuse()
        try:
            return self.journal.command(body)
        except NonDeterminismError as err:
            self._fatal(err)
            raise

    def refuse(self) -> NoReturn:
        """Refuse a ctx operation after the generation ended (its code is being closed), or
        while a query handler runs (a query is read-only)."""
        if self.querying:
            self.query_refused = True
            raise QueryFailedError(QUERY_READ_ONLY)
        raise cancelled_error("the workflow generation has ended")

    def diverged(self, attempted: EventBody) -> NonDeterminismError:
        """Record that the code diverged from history at ``attempted``; returns the error."""
        err = self.journal.mismatch(attempted)
        self._fatal(err)
        return err

    def _fatal(self, err: BaseException) -> None:
        if self.fatal is None:
            self.fatal = err
        self.halt = True

    # --- fibers ------------------------------------------------------------------------------

    def start_main(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.main = Fiber(self, coro)
        self.main.add_waiter(self)

    def wakeup(self, task: Task[Any]) -> None:
        """The main coroutine finished: the generation ends."""
        self.halt = True

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Fiber[Any]:
        if self.closing:
            coro.close()
            self.refuse()
        return Fiber(self, coro)

    def unawaited_failure(self) -> BaseException | None:
        """The error of a spawned fiber that failed with nothing awaiting it and whose
        outcome the code has not read since (a cancelled fiber does not count): it fails
        the workflow as if the main coroutine had raised it."""
        orphaned = self.orphaned
        while orphaned:
            fiber = orphaned[0]
            error = fiber.peek_error()
            if fiber.observed or is_cancelled(error) or isinstance(error, ContinueAsNewRequested):
                orphaned.popleft()
                continue
            return error
        return None

    def check_conditions(self) -> None:
        """Evaluate pending ``wait_condition`` predicates in registration order."""
        for condition in list(self.conditions):
            if self.halt:
                return
            if not condition.done():
                condition.evaluate()

    # --- decisions asked for by the context ---------------------------------------------------

    def new_timer(self, fire_at_ms: int) -> TimerTask:
        return TimerTask(self, fire_at_ms)

    def run_inline(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Task[Any]:
        """Run an inline step now (live) or take its recorded outcome (replay)."""
        if self.closing:
            self.refuse()
        task_id = self.next_task_id
        self.next_task_id = task_id + 1
        journal = self.journal
        if journal.replaying:
            try:
                recorded = journal.recorded_inline_step(task_id, name)
            except NonDeterminismError as err:
                self._fatal(err)
                raise
            if isinstance(recorded, InlineStepCompleted):
                return completed_task(decode(recorded.output))
            return failed_task(_inline_error(name, recorded))
        if not self.run_inline_steps:
            return Task()  # left waiting: the step is not in history and may not run now
        return self._execute_inline(task_id, name, fn, args)

    def _step_context(self, task_id: int, name: str) -> StepContext:
        return StepContext(self.instance_id, self.number, task_id, name, self.started.run_id)

    def _execute_inline(
        self, task_id: int, name: str, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> Task[Any]:
        body: InlineStepCompleted | InlineStepFailed
        try:
            value = run_step(self._step_context(task_id, name), fn, args)
            if isinstance(value, CoroutineType):  # not the ABC: this check is on the hot path
                value.close()
                raise WorkflowRuntimeError(
                    f"inline step {name!r} returned a coroutine: ctx.run takes a plain "
                    f"(synchronous) function; use an activity for async work"
                )
            payload = encode(value)
        except Exception as exc:
            body = InlineStepFailed(task_id, name, failure_from_exception(exc))
        else:
            body = InlineStepCompleted(task_id, name, payload)
        self.journal.append(body)
        self.journal.actions.append(RunInlineStep(task_id, name, generation=self.number))
        if isinstance(body, InlineStepCompleted):
            return completed_task(decode(body.output))
        return failed_task(_inline_error(name, body))

    def wait_event(self, name: str, timeout_ms: int | None) -> Task[Any]:
        if self.querying:
            self.refuse()
        buffered = self.event_buffers.get(name)
        if buffered:
            return EventWait(self, name, timeout_ms, buffered.popleft())
        return EventWait(self, name, timeout_ms)

    # --- received events: claimed, buffered, given back ----------------------------------------

    def receive_event(self, name: str, payload: Payload | None) -> None:
        """*apply*: an event arrived; it gets the next arrival number."""
        arrival = self.arrivals
        self.arrivals = arrival + 1
        self.offer_event(arrival, name, payload)

    def offer_event(self, arrival: int, name: str, payload: Payload | None) -> None:
        """Hand an event to the oldest waiter for its name, or buffer it in arrival order
        (a given-back event goes back to its place)."""
        waiters = self.event_waiters.get(name)
        while waiters:
            waiter = waiters.popitem(last=False)[0]
            if not waiter.done():
                waiter.deliver(arrival, payload)
                return
        buffered = self.event_buffers.get(name)
        if buffered is None:
            buffered = self.event_buffers[name] = deque()
        index = len(buffered)
        while index > 0 and buffered[index - 1][0] > arrival:
            index -= 1
        buffered.insert(index, (arrival, payload))

    def wait_condition(self, predicate: Callable[[], object], timeout_ms: int | None) -> Task[None]:
        if self.querying:
            self.refuse()
        if predicate():
            return completed_task(None)
        return ConditionTask(self, predicate, timeout_ms)

    def send_event(self, target: str, name: str, payload: Payload | None) -> None:
        task_id = self.next_task_id
        self.next_task_id = task_id + 1
        if self.command(EventSent(task_id, target, name, payload)) is None:
            self.journal.actions.append(
                SendEvent(task_id, target, name, payload, generation=self.number)
            )

    def publish(self, record: RecordPublished) -> None:
        """Journal a record to publish (its ``task_id`` is replaced by the next one); live,
        the processor produces it in this turn's transaction, on replay nothing is sent."""
        task_id = self.next_task_id
        self.next_task_id = task_id + 1
        body = replace(record, task_id=task_id)
        if self.command(body) is None:
            self.journal.actions.append(
                PublishRecord(
                    task_id,
                    body.topic,
                    body.value,
                    body.key,
                    body.partition,
                    dict(body.headers),
                    body.avro_schema,
                    generation=self.number,
                )
            )

    def set_custom_status(self, payload: Payload | None) -> None:
        recorded = self.command(CustomStatusSet(payload))
        if recorded is None:
            self.journal.actions.append(SetCustomStatus(payload, generation=self.number))
            self.custom_status = payload
        else:
            self.custom_status = recorded.status

    def upsert_tags(self, tags: dict[str, str]) -> None:
        """Merge ``tags`` (checked first: bad ones raise in the workflow code and record
        nothing); in replay the recorded values stay in force."""
        merged = merged_tags(self.tags, tags)
        recorded = self.command(TagsUpserted(dict(tags)))
        self.tags = merged if recorded is None else merged_tags(self.tags, recorded.tags)

    def patched(self, patch_id: str, *, deprecated: bool = False) -> bool:
        """``ctx.patched`` / ``ctx.deprecate_patch``: live, record a marker and answer True;
        on replay, True only where the history recorded the marker. The first answer per
        patch id holds for the rest of the generation, so every call site agrees."""
        if self.closing:
            self.refuse()
        known = self.patches.get(patch_id)
        if known is not None:
            return known
        journal = self.journal
        if not journal.replaying:
            journal.append(PatchMarker(patch_id, deprecated))
            answer = True
        else:
            answer = journal.patch(patch_id) is not None or deprecated
        self.patches[patch_id] = answer
        return answer

    def set_query_handler(self, name: str, handler: Callable[..., Any] | None) -> None:
        """Set (or with None remove) the handler of query ``name`` (engine.runtime.queries
        runs it); not journaled: replay sets it again where the code does."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a query name is a non-empty string, got {name!r}")
        if handler is None:
            self.queries.pop(name, None)
        elif callable(handler):
            self.queries[name] = handler
        else:
            raise TypeError(f"the handler of query {name!r} must be callable, got {handler!r}")

    @contextmanager
    def read_only(self) -> Iterator[None]:
        """Refuse every decision while a query handler or an update's validator runs
        (``refuse`` raises QueryFailedError), and put back the counters reading moves."""
        closing, task_id, uuids = self.closing, self.next_task_id, self.uuid_counter
        rng_state = None if self.rng is None else self.rng.getstate()
        self.closing = self.querying = True
        self.query_refused = False
        try:
            yield
        finally:
            self.closing, self.next_task_id, self.uuid_counter = closing, task_id, uuids
            self.querying = self.query_refused = False
            if self.rng is not None:
                if rng_state is None:
                    self.rng = None
                else:
                    self.rng.setstate(rng_state)

    def set_update_handler(self, name: str, handler: UpdateHandler | None) -> None:
        """Set (or with None remove) the handler of update ``name`` (engine.runtime.updates
        runs it); not journaled: replay sets it again where the code does."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"an update name is a non-empty string, got {name!r}")
        if handler is None:
            self.updates.pop(name, None)
        else:
            self.updates[name] = handler

    def request_continue_as_new(self, payload: Payload | None) -> None:
        if self.closing:
            self.refuse()
        if not self.continue_requested:
            self.continue_requested = True
            self.continue_input = payload
        self.halt = True

    # --- replay-safe values -------------------------------------------------------------------

    def _seed(self, purpose: str) -> bytes:
        text = f"{self.instance_id}\x00{self.number}\x00{purpose}"
        return hashlib.sha256(text.encode()).digest()

    def random(self) -> random.Random:
        if self.rng is None:
            self.rng = random.Random(int.from_bytes(self._seed("random")[:16], "big"))
        return self.rng

    def jitter_draw(self, task_id: int, attempt: int) -> float:
        """A fraction in ``[0, 1)`` for the retry jitter of ``attempt`` of ``task_id``: its own
        seed, so it neither uses nor shifts the workflow's ``ctx.random()`` sequence."""
        return int.from_bytes(self._seed(f"jitter/{task_id}/{attempt}")[:8], "big") / 2**64

    def uuid_bytes(self) -> bytes:
        counter = self.uuid_counter
        self.uuid_counter = counter + 1
        return self._seed(f"uuid/{counter}")[:16]

    # --- the end ------------------------------------------------------------------------------

    def abandon_attempts(self, reason: str) -> None:
        """The generation ends (live): report every activity attempt still running as
        abandoned, so that its worker is told (one pass over the generation's tasks, once)."""
        for task in self.tasks.values():
            if type(task) is ActivityCall and task.phase == RUNNING:
                task.abandon(reason)

    def close(self) -> list[TimerTask]:
        """End the generation: stop all fibers; return the timers still pending."""
        self.closing = True
        self.halt = True
        self.ready.clear()
        for fiber in self.fibers:
            fiber.close()
        pending = list(self.timers.values())
        self.timers.clear()
        return pending

    def unconsumed_events(self) -> list[tuple[str, Payload | None]]:
        """Every received event the code has not read - buffered, or claimed by a waiting
        point whose fiber never resumed - in arrival order (carried to the next run)."""
        entries = [
            (arrival, name, payload)
            for name, buffered in self.event_buffers.items()
            for arrival, payload in buffered
        ]
        entries += [(arrival, wait.name, wait.held) for arrival, wait in self.claims.items()]
        entries.sort(key=lambda entry: entry[0])
        return [(name, payload) for _, name, payload in entries]


def _inline_error(name: str, body: InlineStepFailed) -> InlineStepFailedError:
    failure = body.failure
    message = f"inline step {name!r} failed: {failure.type}: {failure.message}"
    return raised_from(InlineStepFailedError(message, failure), failure)
