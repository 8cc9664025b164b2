"""The executor: replays an instance's history and runs one turn of new events.

:class:`WorkflowExecution` is the stateful form the processor keeps in memory for hot
instances: build it, :meth:`~WorkflowExecution.replay` the current generation's history
once, then feed each turn's new events to :meth:`~WorkflowExecution.step`. :func:`execute`
is the pure-function form, ``(definition, history, new events) -> decisions``.

Turn structure. A turn appends ``TurnStarted(now_ms)`` (only if it accepts at least one
event), then the accepted inbound events in the order given, then the decisions the code
made. One exception: an update offered to a generation whose code has not run yet (it
began in this turn) has the code run first, so its decisions come before the
``UpdateAccepted`` (the code sets the update handlers); when that update is refused and
the run decided nothing, the generation is begun again, its code not run, as replay will
see it (:meth:`WorkflowExecution._offer_code_first`). Replay splits history at the same
boundaries, applies each turn's inbound events and re-runs the code, matching its
decisions against the recorded ones (see :mod:`engine.runtime.journal`). ``ctx.now()`` is
the turn's ``TurnStarted`` time, or the ``ExecutionStarted`` event's timestamp in the turn
that starts a generation.

Statuses. ``PENDING`` until ExecutionStarted is applied (the processor delays delivering
ExecutionStarted while ``scheduled_start_ms`` is in the future); then ``RUNNING``;
``SUSPENDED`` between ExecutionSuspended and ExecutionResumed; finally ``COMPLETED``,
``FAILED``, ``CANCELLED``, ``TERMINATED`` or ``TIMED_OUT``. ``CONTINUED_AS_NEW`` is the
state between two generations: a continue-as-new ends the turn with ``ContinuedAsNew``,
and the next :meth:`step` (any turn, even one with no new events) begins the next
generation before it applies its events: ``TurnStarted``, the new ``ExecutionStarted``,
the updates the run completed (``UpdatesCarried``, bounded: see
:mod:`engine.runtime.continuation`), then the unconsumed events carried over (at most
``continuation.EVENT_WINDOW`` of each name; the rest leave with the ``ContinueAsNew``
action for the processor to hand over later). So one turn runs one generation's code, and
a replay of a generation that ended this way stands ready to begin the next one.

Suspension. While SUSPENDED, inbound events keep being validated, journaled and applied to
the waiting points (a result resolves its task, an event is buffered), but the code does
not run; ExecutionResumed runs it, and it then sees everything that arrived. So the history
alone is the whole state: there is no separate inbox to persist.

Refusals. Events that match no waiting point (unknown task id, result already applied, an
attempt that is no longer current, a timer already fired or cancelled, another generation,
an instance that has ended or not started) are returned in ``TurnResult.rejected``; they
are neither journaled nor applied.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, NoReturn

from engine.core.errors import (
    CodecError,
    HistoryIntegrityError,
    NonDeterminismError,
    NotRegisteredError,
    StepBudgetExceededError,
    WorkflowRuntimeError,
)
from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ContinuedAsNew,
    EventBody,
    EventRaised,
    ExecutionCompleted,
    ExecutionStarted,
    ExecutionTerminated,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TurnStarted,
    UpdateAccepted,
    UpdatesCarried,
)
from engine.core.payloads import Payload
from engine.core.typed import convert, parameter_type
from engine.runtime.actions import (
    CancelTimer,
    CompleteExecution,
    ContinueAsNew,
    Rejected,
    TerminateChildren,
    TurnResult,
    close_children,
)
from engine.runtime.cancel import is_cancelled
from engine.runtime.context import WorkflowContext
from engine.runtime.continuation import Continuation, carried_updates, split_carried
from engine.runtime.driver import DEFAULT_STEP_BUDGET, Fiber, run_ready
from engine.runtime.execution_state import ENDED, ExecutionState
from engine.runtime.fastjson import decode, encode
from engine.runtime.generation import Generation
from engine.runtime.handlers import (
    APPENDED_ENDS,
    INBOUND,
    RECORDED,
    deliver_event,
    on_updates_carried,
    termination_end,
)
from engine.runtime.journal import DECISION_TYPES, describe
from engine.runtime.registry import Registry, WorkflowDefinition
from engine.runtime.updates import on_update_accepted


async def _raise(error: BaseException) -> NoReturn:
    raise error


class WorkflowExecution(ExecutionState):
    """One workflow instance, replayed from history and advanced turn by turn.

    Not thread-safe. After :meth:`replay` or :meth:`step` raises (non-determinism, a corrupt
    history, an interrupt), the execution is broken and keeps raising: rebuild it.
    """

    __slots__ = ()

    # --- replay -------------------------------------------------------------------------------

    def replay(self, history: Sequence[HistoryEvent]) -> None:
        """Rebuild the state from history (a full history is cut to its last generation)."""
        self._check_usable()
        if self._gen is not None or self._journal.events:
            raise WorkflowRuntimeError("replay() needs a fresh WorkflowExecution")
        start = _last_start(history)
        if start < 0:
            if history:
                raise HistoryIntegrityError(
                    f"history of {self.instance_id!r} has no ExecutionStarted event"
                )
            return
        journal = self._journal
        events = list(history[start:]) if start else list(history)
        first = events[0]
        journal.events = events
        journal.generation = first.generation
        journal.now_ms = first.timestamp_ms
        journal.continue_as_new_suggested = False  # the turn that begins a generation
        journal.replaying = True
        try:
            journal.next_sequence = self._replay_events(events, first.sequence)
        except BaseException as exc:
            self._broken = exc
            raise
        finally:
            journal.replaying = False
            journal.new_events = []
            journal.actions = []

    def _replay_events(self, events: list[HistoryEvent], sequence: int) -> int:
        journal = self._journal
        commands_from = -1
        for index, event in enumerate(events):
            if event.sequence != sequence:
                raise HistoryIntegrityError(
                    f"history of {self.instance_id!r} jumps from sequence {sequence - 1} "
                    f"to {event.sequence}: events are missing or out of order"
                )
            sequence += 1
            body = event.body
            kind = type(body)
            if kind in DECISION_TYPES and (
                kind is not ExecutionCompleted or body.status not in APPENDED_ENDS  # type: ignore[attr-defined]
            ):
                if commands_from < 0:
                    commands_from = index
                continue
            if kind is TurnStarted:
                self._replay_turn(commands_from if commands_from >= 0 else index, index)
                commands_from = -1
                journal.now_ms = body.time_ms  # type: ignore[attr-defined]
                journal.continue_as_new_suggested = body.continue_as_new_suggested  # type: ignore[attr-defined]
                continue
            if commands_from >= 0:
                self._replay_turn(commands_from, index)
                commands_from = -1
            if kind is UpdateAccepted and self._code_first():
                self._replay_turn(index, index)  # the code ran before the update (_offer)
            handler = RECORDED.get(kind)
            if handler is None or kind is ExecutionStarted:
                self._apply_recorded(event)
            else:
                reason = handler(self, body)
                if reason is not None:
                    raise _unappliable(event, reason)
        end = len(events)
        self._replay_turn(commands_from if commands_from >= 0 else end, end)
        if events:
            self._last_updated_ms = events[-1].timestamp_ms
        return sequence

    def _replay_turn(self, start: int, end: int) -> None:
        """Re-run the code for one recorded turn and check it decided the same."""
        journal = self._journal
        journal.expect(start, end)
        gen = self._gen
        if gen is not None and gen.ready:
            self._run_code()
        recorded = journal.leftover()
        if recorded is not None:
            raise NonDeterminismError(
                recorded.sequence,
                describe(recorded.body),
                "nothing: the code now waits (or ends) without deciding it",
            )

    def _apply_recorded(self, event: HistoryEvent) -> None:
        body = event.body
        handler = RECORDED.get(type(body))
        if handler is None:
            raise HistoryIntegrityError(
                f"history event #{event.sequence} ({type(body).__name__}) cannot be replayed"
            )
        if type(body) is ExecutionStarted:
            self._journal.generation = event.generation
            self._journal.now_ms = event.timestamp_ms
        reason = handler(self, body)
        if reason is not None:
            raise _unappliable(event, reason)

    # --- a turn -------------------------------------------------------------------------------

    def step(
        self,
        new_events: Sequence[Inbound],
        now_ms: int,
        *,
        run_inline_steps: bool = True,
        continue_as_new_suggested: bool = False,
    ) -> TurnResult:
        """Apply new events, run the code until it waits, and return the turn's decisions.

        A generation that continued as new is begun first (even with no new events).
        ``run_inline_steps=False`` leaves the code waiting at an inline step that is not in
        history instead of running it (for checks that must not cause side effects).
        ``continue_as_new_suggested``: the generation's history has reached the size at
        which the processor suggests a continue-as-new; recorded in the turn's
        ``TurnStarted`` (never in the turn that begins a generation) and answered by
        ``ctx.continue_as_new_suggested``.
        """
        self._check_usable()
        journal = self._journal
        journal.new_events = []
        journal.actions = []
        journal.now_ms = now_ms
        journal.continue_as_new_suggested = continue_as_new_suggested
        self._turn_open = False
        self._run_inline = run_inline_steps
        rejected: list[Rejected] = []
        try:
            if self._continuation is not None:
                self._begin_continuation(self._continuation)
            for inbound in new_events:
                reason = self._offer(inbound)
                if reason is not None:
                    rejected.append(Rejected(inbound, reason))
            if self._turn_open:
                self._last_updated_ms = now_ms
                self._run_code()
        except BaseException as exc:
            self._broken = exc
            raise
        result = TurnResult(
            journal.new_events,
            journal.actions,
            rejected,
            self._status,
            journal.generation,
            journal.next_sequence,
        )
        journal.new_events = []
        journal.actions = []
        return result

    def _offer(self, inbound: Inbound) -> str | None:
        body = inbound.body
        handler = INBOUND.get(type(body))
        if handler is None:
            return (
                f"{type(body).__name__} is not an inbound event (the workflow code decides "
                f"it); offer only results, timer fires, events and instance commands"
            )
        if self._gen is None:
            if type(body) is not ExecutionStarted:
                return "the instance has not started (ExecutionStarted must come first)"
            if inbound.generation is not None:
                self._journal.generation = inbound.generation
        elif self._status in ENDED:
            return f"the instance has ended ({self._status.value})"
        elif inbound.generation is not None and inbound.generation != self._journal.generation:
            return (
                f"the event is for generation {inbound.generation}, but the instance is in "
                f"generation {self._journal.generation}"
            )
        if type(body) is UpdateAccepted and self._code_first():
            return self._offer_code_first(body)
        return handler(self, body)

    def _offer_code_first(self, body: UpdateAccepted) -> str | None:
        """Run the code of a generation that has not run, then offer the update to it.

        Replay runs that code where history shows it ran: at a recorded decision, or at the
        ``UpdateAccepted`` itself. A refused update writes nothing, so when it is refused
        and the code decided nothing, history holds no trace of that run; the generation is
        then rebuilt from its events (:meth:`_restart_code`), as replay will see it, and the
        code runs again at the next update or at the end of the turn."""
        journal = self._journal
        written = len(journal.new_events)
        self._run_code()
        if self._status in ENDED:
            return f"the instance has ended ({self._status.value})"
        reason = on_update_accepted(self, body)
        if reason is not None and len(journal.new_events) == written:
            self._restart_code()
        return reason

    def _restart_code(self) -> None:
        """Begin the current generation again from its start, its code not run, and apply
        the inbound events it has received so far, exactly as replay applies them (the
        generation began in this turn, so all its events are in the journal)."""
        journal = self._journal
        events = journal.events
        start = _last_start(events)
        gen = self._gen
        assert gen is not None and start >= 0
        started = events[start].body
        assert type(started) is ExecutionStarted
        gen.close()
        now_ms = journal.now_ms
        journal.replaying = True
        try:
            self.begin_generation(started)  # the custom status carried into it stays
            for event in events[start + 1 :]:
                if type(event.body) is not TurnStarted:
                    self._apply_recorded(event)
        finally:
            journal.replaying = False
            journal.now_ms = now_ms

    def _code_first(self) -> bool:
        """Whether an update must wait for the generation's code to run first: a generation
        that began in this turn (a start, or the one a continue-as-new asked for) has set
        no update handlers yet, so its code runs up to its first wait before the update is
        offered, and replay runs it at the same point (:meth:`_replay_events`). Histories
        recorded before this rule hold no update offered to code that had not run (one was
        refused then), so they replay unchanged."""
        gen = self._gen
        return gen is not None and not gen.code_started and self._status is RuntimeStatus.RUNNING

    # --- the interface the inbound handlers apply events through (handlers.EventTarget) ------

    def set_suspended(self, suspended: bool) -> None:
        """Apply ExecutionSuspended (True) or ExecutionResumed (False)."""
        self._status = RuntimeStatus.SUSPENDED if suspended else RuntimeStatus.RUNNING

    def journal_inbound(self, body: EventBody) -> None:
        """Journal an accepted inbound event (opening the turn with TurnStarted; the turn
        that begins a generation never suggests a continue-as-new)."""
        journal = self._journal
        if journal.replaying:
            return
        if not self._turn_open:
            self._turn_open = True
            if type(body) is ExecutionStarted:
                journal.continue_as_new_suggested = False
            journal.append(TurnStarted(journal.now_ms, journal.continue_as_new_suggested))
        journal.append(body)

    # --- running the code ---------------------------------------------------------------------

    def begin_generation(self, started: ExecutionStarted) -> None:
        """Start a generation: its state, its context and its main coroutine."""
        journal = self._journal
        if self._started is None:
            self._created_ms = journal.now_ms
        custom = self._gen.custom_status if self._gen is not None else None
        self._started = started
        self._status = RuntimeStatus.RUNNING
        gen = Generation(journal, self._registry, self.instance_id, journal.generation, started)
        gen.custom_status = custom
        self._gen = gen
        gen.start_main(self._main_coroutine(WorkflowContext(gen), started))

    def _main_coroutine(
        self, ctx: WorkflowContext, started: ExecutionStarted
    ) -> Coroutine[Any, Any, Any]:
        try:
            definition = self._registry.recorded_workflow(started.name, started.version)
        except NotRegisteredError as exc:
            if self._journal.replaying:
                raise
            return _raise(exc)
        self.definition = definition
        try:
            value = convert(decode(started.input), parameter_type(definition.fn, 1))
            if definition.takes_input:
                return definition.fn(ctx, value)
            return definition.fn(ctx)
        except (CodecError, TypeError) as exc:
            return _raise(exc)

    def _run_code(self) -> None:
        """Run the current generation until every fiber waits, then settle its end (a
        continue-as-new ends the turn: the next generation runs in the next one)."""
        gen = self._gen
        if gen is None or self._status is not RuntimeStatus.RUNNING:
            return
        gen.run_inline_steps = self._run_inline
        gen.code_started = True
        try:
            run_ready(gen, self._budget)
        except StepBudgetExceededError as exc:
            self.code_error = exc
            self._end(RuntimeStatus.FAILED, None, failure_from_exception(exc))
            return
        if gen.fatal is not None:
            raise gen.fatal
        orphan_error = gen.unawaited_failure()
        if orphan_error is not None:
            self.code_error = orphan_error
            self._end(RuntimeStatus.FAILED, None, failure_from_exception(orphan_error))
            return
        if not gen.halt:
            return  # every fiber waits on something durable
        if gen.continue_requested:
            self._continue_as_new(gen)
            return
        main = gen.main
        if main is not None and main.done():
            self._finish(main)

    def _finish(self, main: Fiber[Any]) -> None:
        error = main.exception()
        gen = self._gen
        cancelled = gen is not None and gen.cancel_reason is not None and is_cancelled(error)
        if cancelled and gen is not None and gen.cancel_reason is not None:
            # the code let the requested cancellation end it (FAILED in old histories)
            failure = FailureDetails("CancelledError", gen.cancel_reason, "", False)
            ended = RuntimeStatus.CANCELLED if gen.cancel_every_fiber else RuntimeStatus.FAILED
            self._end(ended, None, failure)
            return
        if error is not None:
            self.code_error = error
            self._end(RuntimeStatus.FAILED, None, failure_from_exception(error))
            return
        try:
            output = encode(main.result())
        except CodecError as exc:
            self._end(RuntimeStatus.FAILED, None, failure_from_exception(exc))
            return
        self._end(RuntimeStatus.COMPLETED, output, None)

    def _end(
        self, status: RuntimeStatus, output: Payload | None, failure: FailureDetails | None
    ) -> None:
        """The code ended the instance (completed, failed, or ran out of budget)."""
        gen = self._gen
        assert gen is not None and self._started is not None
        journal = self._journal
        recorded = journal.command(ExecutionCompleted(status, output, failure))
        if recorded is not None:
            output, failure = recorded.output, recorded.failure
        self._status, self._output, self._failure = status, output, failure
        children = self.running_children_policies
        self._close_generation(gen, status)
        if recorded is None:
            started = self._started
            reason = f"parent {self.instance_id} ended {status.value}"
            journal.actions.extend(close_children(children, reason, gen.number))
            journal.actions.append(
                CompleteExecution(
                    status,
                    output,
                    failure,
                    started.parent_instance_id,
                    started.parent_generation,
                    started.parent_task_id,
                    generation=gen.number,
                )
            )

    def _close_generation(self, gen: Generation, status: RuntimeStatus) -> None:
        journal = self._journal
        if not journal.replaying:
            gen.abandon_attempts(f"its workflow instance is {status.value}")
        timers = gen.close()
        if not journal.replaying:
            journal.actions.extend(
                CancelTimer(t.task_id, t.fire_at_ms, generation=gen.number) for t in timers
            )

    def apply_termination(self, body: ExecutionTerminated) -> None:
        """Apply ExecutionTerminated: the instance ends TERMINATED (TIMED_OUT when a
        workflow timeout sent it) right away."""
        gen = self._gen
        assert gen is not None and self._started is not None
        status, kind = termination_end(body)
        failure = FailureDetails(kind, body.reason or kind.lower(), "", False)
        children = self.running_children_policies
        self._status, self._output, self._failure = status, None, failure
        journal = self._journal
        if journal.replaying:
            gen.close()
            return
        started = self._started
        journal.append(ExecutionCompleted(status, None, failure))
        journal.actions.append(
            CompleteExecution(
                status,
                None,
                failure,
                started.parent_instance_id,
                started.parent_generation,
                started.parent_task_id,
                generation=gen.number,
            )
        )
        if body.recursive:  # every child, of every generation (the processor adds the older)
            ids = tuple(instance_id for instance_id, _ in children)
            journal.actions.append(
                TerminateChildren(ids, body.reason, every_generation=True, generation=gen.number)
            )
        else:
            reason = f"parent {self.instance_id} was {status.value.lower().replace('_', ' ')}"
            journal.actions.extend(close_children(children, reason, gen.number))
        self._close_generation(gen, status)

    def _continue_as_new(self, gen: Generation) -> None:
        """End ``gen`` with ``ContinuedAsNew``; the next generation waits for the next
        turn (:meth:`_begin_continuation`). Replay of a recorded one ends the same way."""
        journal = self._journal
        new_number = gen.number + 1
        recorded = journal.command(ContinuedAsNew(gen.continue_input, new_number))
        carried, overflow = split_carried(gen.unconsumed_events())
        updates = carried_updates([done for done in gen.update_ids.values() if done is not None])
        children = self.running_children_policies
        self._close_generation(gen, RuntimeStatus.CONTINUED_AS_NEW)
        self._status = RuntimeStatus.CONTINUED_AS_NEW
        started = replace(
            gen.started, input=gen.continue_input, scheduled_start_ms=None, tags=dict(gen.tags)
        )
        self._continuation = Continuation(started, new_number, carried, updates)
        if recorded is not None:
            return
        reason = f"parent {self.instance_id} continued as new without it"
        journal.actions.extend(close_children(children, reason, gen.number))
        journal.actions.append(
            ContinueAsNew(
                gen.continue_input, new_number, generation=gen.number, overflow=tuple(overflow)
            )
        )

    def _begin_continuation(self, continuation: Continuation) -> None:
        """The turn after a continue-as-new: begin the next generation, its start and the
        events carried into it first (the turn's own events follow)."""
        self._continuation = None
        journal = self._journal
        journal.generation = continuation.generation
        journal.events = []
        self.journal_inbound(continuation.started)
        journal.events = journal.events[-1:]  # the generation's events, from its start
        self.begin_generation(continuation.started)
        gen = self._gen
        assert gen is not None
        if continuation.updates:
            on_updates_carried(self, UpdatesCarried(continuation.updates))
        for name, payload in continuation.carried:
            event = EventRaised(name, payload)
            journal.append(event)
            deliver_event(gen, event)


def _unappliable(event: HistoryEvent, reason: str) -> NonDeterminismError:
    return NonDeterminismError(
        event.sequence, describe(event.body), f"no waiting point for it ({reason})"
    )


def _last_start(history: Sequence[HistoryEvent]) -> int:
    for index in range(len(history) - 1, -1, -1):
        if type(history[index].body) is ExecutionStarted:
            return index
    return -1


def as_registry(workflows: Registry | WorkflowDefinition | Callable[..., Any]) -> Registry:
    """A registry from a registry, a workflow definition or a decorated workflow function."""
    if isinstance(workflows, Registry):
        return workflows
    registry = Registry()
    if isinstance(workflows, WorkflowDefinition):
        registry.add_workflow(workflows.fn, name=workflows.name, version=workflows.version)
        return registry
    marker = getattr(workflows, "__turnstile_workflow__", None)
    if isinstance(marker, tuple):
        registry.add_workflow(workflows, name=str(marker[0]), version=str(marker[1]))
    else:
        registry.add_workflow(workflows)
    return registry


def execute(
    workflows: Registry | WorkflowDefinition | Callable[..., Any],
    history: Sequence[HistoryEvent],
    new_events: Sequence[Inbound],
    now_ms: int,
    run_inline_steps: bool = True,
    *,
    instance_id: str | None = None,
    step_budget: int = DEFAULT_STEP_BUDGET,
) -> TurnResult:
    """The executor as a pure function: replay ``history``, then run one turn.

    ``instance_id`` defaults to the history's; it is required for a brand-new instance.
    """
    if instance_id is None:
        if not history:
            raise ValueError("execute() needs instance_id when the history is empty")
        instance_id = history[0].instance_id
    execution = WorkflowExecution(as_registry(workflows), instance_id, step_budget=step_budget)
    execution.replay(history)
    return execution.step(new_events, now_ms, run_inline_steps=run_inline_steps)
