"""The workflow context: everything workflow code may do.

Workflow code must be deterministic: given the same history it must ask for the same things
in the same order. The context is the only door to the outside world, and everything it
returns is either recorded in history or derived from it (time from the turn's start,
random numbers and uuids seeded by instance and generation), so replaying the code gives
the same values.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, MutableMapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from engine.core.history import ParentClosePolicy
from engine.core.typed import return_type
from engine.runtime.activity_options import activity_options
from engine.runtime.durable import ActivityCall, ChildTask
from engine.runtime.fastjson import encode as _payload
from engine.runtime.generation import ContinueAsNewRequested
from engine.runtime.publishing import publish_request
from engine.runtime.retry import DEFAULT_RETRY, NO_RETRY, RetryPolicy
from engine.runtime.tasks import Task, WhenAll, WhenAny, completed_task
from engine.runtime.updates import update_handler

if TYPE_CHECKING:
    from engine.runtime.generation import Generation

T = TypeVar("T")

_LOGGER = logging.getLogger("engine.workflow")


def _to_ms(seconds: float | timedelta, what: str) -> int:
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if seconds < 0:
        raise ValueError(f"{what} must not be negative (got {seconds}s)")
    return round(seconds * 1000)


def _close_policy(value: ParentClosePolicy | str) -> ParentClosePolicy:
    try:
        return ParentClosePolicy(value)
    except ValueError:
        choices = ", ".join(p.value for p in ParentClosePolicy)
        raise ValueError(f"parent_close_policy must be one of {choices} (got {value!r})") from None


def _patch_id(patch_id: str) -> str:
    if not isinstance(patch_id, str) or not patch_id:
        raise ValueError(
            f"a patch id is a non-empty string, e.g. ctx.patched('fix-42'), got {patch_id!r}"
        )
    return patch_id


def _optional_ms(seconds: float | timedelta | None, what: str) -> int | None:
    return None if seconds is None else _to_ms(seconds, what)


class ReplaySafeLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter that drops records while the workflow code is being replayed."""

    def __init__(self, logger: logging.Logger, ctx: WorkflowContext) -> None:
        super().__init__(logger, {})
        self._ctx = ctx

    def isEnabledFor(self, level: int) -> bool:
        return not self._ctx.is_replaying and self.logger.isEnabledFor(level)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(kwargs.get("extra") or {})
        extra.setdefault("instance_id", self._ctx.instance_id)
        extra.setdefault("generation", self._ctx.generation)
        kwargs["extra"] = extra
        return msg, kwargs


class WorkflowContext:
    """Passed as the first argument to every workflow function."""

    __slots__ = ("_gen", "_logger")

    def __init__(self, gen: Generation) -> None:
        self._gen = gen
        self._logger: ReplaySafeLogger | None = None

    # --- identity and replay-safe values ------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self._gen.instance_id

    @property
    def generation(self) -> int:
        return self._gen.number

    @property
    def name(self) -> str:
        return self._gen.started.name

    @property
    def version(self) -> str:
        return self._gen.started.version

    @property
    def parent_instance_id(self) -> str | None:
        return self._gen.started.parent_instance_id

    @property
    def tags(self) -> dict[str, str]:
        """The instance's tags now: the start's, with every ``upsert_tags`` so far."""
        return dict(self._gen.tags)

    @property
    def continue_as_new_suggested(self) -> bool:
        """True once this generation's history is large enough that it should continue as
        new: it reached ``history_events_warn`` events or ``history_bytes_warn`` bytes
        (settings; per workflow ``@workflow(history_events_warn=...)``) before this turn
        began. Past ``history_events_max``/``history_bytes_max`` the instance fails, so a
        long-running loop checks this at a convenient point and calls
        :meth:`continue_as_new` with the state it needs. The answer is recorded in the
        turn's history, so replay gives the same one; it is False in the turn that begins
        a generation."""
        return self._gen.journal.continue_as_new_suggested

    @property
    def is_replaying(self) -> bool:
        """True while the code re-executes turns already in history."""
        return self._gen.journal.replaying

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that stays silent during replay (so each line is logged once)."""
        if self._logger is None:
            self._logger = ReplaySafeLogger(_LOGGER, self)
        return self._logger

    def now(self) -> datetime:
        """The current turn's start time (UTC); the same value on replay."""
        return datetime.fromtimestamp(self._gen.journal.now_ms / 1000, tz=UTC)

    def now_ms(self) -> int:
        """:meth:`now` in milliseconds since the epoch."""
        return self._gen.journal.now_ms

    def new_uuid(self) -> uuid.UUID:
        """A uuid derived from instance, generation and a counter (version 5 layout)."""
        raw = bytearray(self._gen.uuid_bytes())
        raw[6] = (raw[6] & 0x0F) | 0x50
        raw[8] = (raw[8] & 0x3F) | 0x80
        return uuid.UUID(bytes=bytes(raw))

    def random(self) -> random.Random:
        """A ``random.Random`` seeded from instance and generation."""
        return self._gen.random()

    # --- durable operations -------------------------------------------------------------------

    def call_activity(
        self,
        activity: str | Callable[..., Any],
        input: Any = None,
        *,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        timeout: float | timedelta | None = None,
        task_queue: str | None = None,
        start_to_close: float | timedelta | None = None,
        schedule_to_start: float | timedelta | None = None,
        schedule_to_close: float | timedelta | None = None,
        heartbeat_timeout: float | timedelta | None = None,
    ) -> Task[Any]:
        """Schedule an activity; await the task for its result.

        ``retry=None`` makes a single attempt. Timeouts are seconds or timedeltas (see
        :mod:`engine.runtime.activity_options`): ``start_to_close`` bounds one attempt once
        a worker started it (default 10 minutes; 0: none; ``timeout`` is its older name),
        ``schedule_to_start`` its wait on the queue, ``schedule_to_close`` the whole call
        with its retries, ``heartbeat_timeout`` the gap between heartbeats. A timed-out
        attempt fails retryably, except past schedule-to-start or schedule-to-close. When
        the policy gives up, the task raises :class:`ActivityFailedError` with the last
        failure's details. ``task_queue`` names the workers that run it (default: the queue
        the activity was registered with, else ``default``).
        """
        gen = self._gen
        name = activity if type(activity) is str else gen.registry.activity_name(activity)
        options = activity_options(
            task_queue or gen.registry.activity_task_queue(activity),
            timeout=timeout,
            start_to_close=start_to_close,
            schedule_to_start=schedule_to_start,
            schedule_to_close=schedule_to_close,
            heartbeat_timeout=heartbeat_timeout,
        )
        task = ActivityCall(gen, name, _payload(input), retry or NO_RETRY, options)
        if not isinstance(activity, str):
            task.result_type = return_type(activity)  # a dataclass result comes back as one
        return task

    def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Task[Any]:
        """Run ``fn(*args)`` inline, right now, and journal its result.

        For short, synchronous, side-effect-light work (formatting, a lookup, a quick
        computation with non-deterministic inputs). Its result is recorded once and replay
        uses it, but the body runs *at least once*: a turn redone before its transaction
        committed (an aborted transaction, a crashed replica) runs it again. A body with a
        side effect passes ``engine.current_step().idempotency_key`` (the same on every
        re-run of this step) to the system it touches, or belongs in an activity. A failure
        raises :class:`InlineStepFailedError`.
        """
        return self._gen.run_inline(name, fn, args)

    def call_child_workflow(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        instance_id: str | None = None,
        version: str = "",
        parent_close_policy: ParentClosePolicy | str = ParentClosePolicy.TERMINATE,
    ) -> Task[Any]:
        """Start a child workflow; await the task for its result.

        The child's id defaults to ``"{instance_id}:{generation}:{task_id}"``. A child that
        ends FAILED, TERMINATED, CANCELLED or TIMED_OUT raises
        :class:`ChildWorkflowFailedError`.
        ``parent_close_policy`` says what happens to the child while it still runs when
        this workflow stops waiting for it (ends, continues as new, or cancels the task,
        as a when_any does with its losers): ``TERMINATE`` (the default) terminates it,
        ``REQUEST_CANCEL`` asks it to cancel itself (its code gets ``CancelledError``),
        ``ABANDON`` leaves it running.
        """
        name = self._gen.registry.workflow_name(workflow)
        policy = _close_policy(parent_close_policy)
        task = ChildTask(self._gen, name, _payload(input), instance_id, version, policy)
        if not isinstance(workflow, str):
            task.result_type = return_type(workflow)
        return task

    call_sub_workflow = call_child_workflow

    def create_timer(self, fire_at: int | float | datetime | timedelta) -> Task[None]:
        """A durable timer: ``fire_at`` is epoch milliseconds, a datetime, or a delay."""
        if isinstance(fire_at, timedelta):
            fire_at_ms = self._gen.journal.now_ms + _to_ms(fire_at, "timer delay")
        elif isinstance(fire_at, datetime):
            if fire_at.tzinfo is None:
                raise ValueError("create_timer needs a timezone-aware datetime")
            fire_at_ms = round(fire_at.timestamp() * 1000)
        else:
            fire_at_ms = int(fire_at)
        return self._gen.new_timer(fire_at_ms)

    def sleep(self, seconds: float | timedelta) -> Task[None]:
        """A durable timer ``seconds`` from now."""
        return self._gen.new_timer(self._gen.journal.now_ms + _to_ms(seconds, "sleep"))

    def wait_for_event(self, name: str, timeout: float | timedelta | None = None) -> Task[Any]:
        """The next external event called ``name`` (events are buffered per name, in
        arrival order, so one raised before the wait is delivered too).

        With ``timeout`` (seconds) the task raises :class:`WorkflowTimeoutError` when no
        event came in time.
        """
        return self._gen.wait_event(name, _optional_ms(timeout, "event timeout"))

    def send_event(self, instance_id: str, name: str, input: Any = None) -> None:
        """Raise event ``name`` on another instance (fire and forget)."""
        self._gen.send_event(instance_id, name, _payload(input))

    def publish(
        self,
        topic: str,
        value: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        avro_schema: str | Mapping[str, Any] | None = None,
    ) -> Task[None]:
        """Publish a record to the user topic ``topic``, exactly once.

        The record is produced in the transaction that records this turn, so a
        read_committed consumer sees it once, together with the state change; it is
        journaled (``RecordPublished``), so replay never publishes it again. ``value`` is
        written as its bytes when it is ``bytes``, as Avro binary with ``avro_schema`` (the
        schema as JSON text or a dict), and as JSON otherwise. The topic must be declared
        in the ``publish_topics`` setting. Awaiting the task is optional (it is already done).
        """
        self._gen.publish(publish_request(topic, value, key, headers, partition, avro_schema))
        return completed_task(None)

    def when_all(self, tasks: Iterable[Awaitable[Any]]) -> Task[list[Any]]:
        """All results, in order; coroutines are spawned as fibers."""
        return WhenAll([self._task(t) for t in tasks])

    def when_any(self, tasks: Iterable[Awaitable[Any]]) -> Task[Task[Any]]:
        """The first task to finish (await it for its value); the others are cancelled."""
        return WhenAny(self._gen, [self._task(t) for t in tasks])

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Task[T]:
        """Run a coroutine as a fiber of this instance; await the task for its result."""
        if not isinstance(coro, Coroutine):
            raise TypeError(
                f"ctx.spawn takes a coroutine object (call the async function), "
                f"got {type(coro).__name__}"
            )
        return self._gen.spawn(coro)

    def wait_condition(
        self, predicate: Callable[[], object], timeout: float | timedelta | None = None
    ) -> Task[None]:
        """Wait until ``predicate()`` is true; it is re-evaluated after every step.

        With ``timeout`` (seconds) the task raises :class:`WorkflowTimeoutError`.
        """
        return self._gen.wait_condition(predicate, _optional_ms(timeout, "condition timeout"))

    # --- changing code under running instances ----------------------------------------------

    def patched(self, patch_id: str) -> bool:
        """Branch between old and new code for the same workflow version.

        True where the code runs the patched path: on first execution (a ``PatchMarker``
        is recorded in history) and on replay of a history that recorded the marker at
        this point; False when replaying a history recorded before the patch, so running
        instances keep the old path. Every call with the same id in a generation gets the
        same answer. docs/how-to/change-code.md shows the three steps from ``patched``
        through :meth:`deprecate_patch` to removing the call.
        """
        return self._gen.patched(_patch_id(patch_id))

    def deprecate_patch(self, patch_id: str) -> None:
        """The second step after :meth:`patched`: the old path is gone (no instance that
        predates the patch may replay any more). Records a deprecated marker and never
        branches; histories recorded by ``patched`` still replay, and once this call is
        removed too its deprecated markers are skipped on replay."""
        self._gen.patched(_patch_id(patch_id), deprecated=True)

    def continue_as_new(self, input: Any = None) -> NoReturn:
        """End this generation and start the workflow afresh with ``input``.

        The history of the new generation starts empty (bounded history for long-running
        loops); events received but not yet consumed are carried over.
        """
        self._gen.request_continue_as_new(_payload(input))
        raise ContinueAsNewRequested()

    def set_query_handler(self, name: str, handler: Callable[..., Any] | None) -> None:
        """Answer query ``name`` with ``handler(*args)`` (None removes it).

        A handler is a plain function, usually a closure over the workflow's variables,
        that returns a JSON value; ``handle.query(name, *args)`` calls it on the processor
        that owns the instance, against its state as of the last turn, and records
        nothing. It may only read: scheduling, waiting, sending or setting anything raises
        ``QueryFailedError`` to the caller. Handlers stay after the workflow ends, so an
        ended instance answers from its last state.
        """
        self._gen.set_query_handler(name, handler)

    def set_update_handler(
        self,
        name: str,
        fn: Callable[..., Any] | None,
        validator: Callable[..., Any] | None = None,
    ) -> None:
        """Answer update ``name`` with ``fn(arg)`` (None removes it).

        An update changes the workflow's state and returns a JSON value to the caller.
        ``validator(arg)``, if given, runs first, read-only like a query handler: if it
        raises, the update is rejected and nothing is recorded. An accepted update is
        recorded in history and ``fn`` runs as a fiber of the instance (it may be async and
        await activities, timers and events); its return value, or the error it raised,
        is recorded and answered. A retry with the same update id gets the first answer.
        """
        if fn is None:
            self._gen.set_update_handler(name, None)
        else:
            self._gen.set_update_handler(name, update_handler(name, fn, validator))

    def all_updates_finished(self) -> bool:
        """Whether every update accepted in this generation has finished. A generation
        that ends (returns, continues as new) leaves unfinished updates unanswered by the
        code, so wait for this first: ``await ctx.wait_condition(ctx.all_updates_finished)``.
        The updates of a turn are accepted before the code runs (in a generation's first
        turn, once its code has run up to its first wait and set its handlers; one offered
        to a generation that ended meanwhile is refused), so none slips past."""
        return None not in self._gen.update_ids.values()

    def set_custom_status(self, value: Any) -> None:
        """Publish a small JSON value with the instance's metadata."""
        self._gen.set_custom_status(_payload(value))

    def upsert_tags(self, tags: dict[str, str]) -> None:
        """Set search attributes: merged into the instance's tags (``""`` removes a key),
        shown in its status, found by ``list --tag KEY=VALUE`` and kept across
        continue-as-new. Recorded in history, so replay sees the same; bad tags (not str,
        too many, too long) raise InvalidTagsError here."""
        self._gen.upsert_tags(tags)

    # --- helpers ------------------------------------------------------------------------------

    def _task(self, awaitable: Awaitable[Any]) -> Task[Any]:
        if isinstance(awaitable, Task):
            return awaitable
        if isinstance(awaitable, Coroutine):
            return self._gen.spawn(awaitable)
        raise TypeError(
            f"expected a task or a coroutine, got {type(awaitable).__name__}; pass the "
            f"results of ctx operations or coroutine objects"
        )
