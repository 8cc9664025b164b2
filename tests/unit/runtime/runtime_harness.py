"""An in-memory stand-in for the processor, for runtime tests.

It keeps every instance's execution and full history, runs activities from a registry
(in order, or in an order chosen by a seeded ``random.Random``), keeps durable timers and
advances a fake clock to the next timer when nothing else is left to do. It routes child
starts, child results, events between instances and recursive terminations. With
``cold=True`` every turn rebuilds the execution from history first, as a processor does
after a restart, which checks replay against the live path on every turn.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from engine.core.failure import FailureDetails, failure_from_exception
from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowFailed,
    EventBody,
    EventRaised,
    ExecutionStarted,
    ExecutionTerminated,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TimerFired,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime import actions as act
from engine.runtime.executor import WorkflowExecution
from engine.runtime.registry import Registry

START_MS = 1_700_000_000_000


@dataclass
class Turn:
    inbound: list[Inbound]
    now_ms: int
    result: act.TurnResult


@dataclass
class Instance:
    execution: WorkflowExecution
    history: list[HistoryEvent] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    actions: list[act.Action] = field(default_factory=list)
    rejected: list[act.Rejected] = field(default_factory=list)


class Sim:
    """Plays the processor, the activity workers and the timer service, in memory."""

    def __init__(
        self,
        registry: Registry,
        *,
        rng: random.Random | None = None,
        cold: bool = False,
        hold: frozenset[str] | set[str] = frozenset(),
        max_batch: int | None = None,
        step_budget: int | None = None,
    ) -> None:
        self.registry = registry
        self.rng = rng
        self.cold = cold
        self.hold = set(hold)
        self.max_batch = max_batch
        self.step_budget = step_budget
        self.now_ms = START_MS
        self.instances: dict[str, Instance] = {}
        self.queue: deque[tuple[str, Inbound]] = deque()
        self.activities: list[tuple[str, act.ScheduleActivity]] = []
        self.timers: dict[tuple[str, int, int], int] = {}
        self.held: list[tuple[str, act.ScheduleActivity]] = []
        #: Instances whose next generation waits for a turn (the processor's wake-up).
        self.wakes: deque[str] = deque()

    # --- driving ------------------------------------------------------------------------------

    def start(self, name: str, input: Any = None, instance_id: str = "wf-1", **kw: Any) -> str:
        payload = None if input is None else to_payload(input)
        self._create(instance_id)
        self.send(instance_id, ExecutionStarted(name, payload, **kw))
        return instance_id

    def send(self, instance_id: str, body: EventBody, generation: int | None = None) -> None:
        self.queue.append((instance_id, Inbound(body, generation)))

    def raise_event(self, instance_id: str, name: str, value: Any = None) -> None:
        self.send(instance_id, EventRaised(name, None if value is None else to_payload(value)))

    def run(self, *, max_rounds: int = 1_000_000, timers: bool = True) -> None:
        """Process until nothing is left (or only held activities / timers when disabled)."""
        for _ in range(max_rounds):
            if self.wakes:
                self._turn(self.wakes.popleft())
            elif self.queue:
                self._turn()
            elif self.activities:
                index = self.rng.randrange(len(self.activities)) if self.rng else 0
                self._run_activity(*self.activities.pop(index))
            elif timers and self.timers:
                self._fire_next_timer()
            else:
                return
        raise AssertionError("the simulation did not settle")

    def complete_held(self, output: Any = None) -> None:
        """Complete every held activity attempt with ``output``."""
        held, self.held = self.held, []
        for instance_id, task in held:
            body = TaskCompleted(task.task_id, to_payload(output), task.attempt)
            self.send(instance_id, body, task.generation)

    # --- inspection ---------------------------------------------------------------------------

    def execution(self, instance_id: str = "wf-1") -> WorkflowExecution:
        return self.instances[instance_id].execution

    def history(self, instance_id: str = "wf-1") -> list[HistoryEvent]:
        return self.instances[instance_id].history

    def kinds(self, instance_id: str = "wf-1") -> list[str]:
        return [event.body.KIND for event in self.history(instance_id)]

    def bodies(self, kind: type[EventBody], instance_id: str = "wf-1") -> list[Any]:
        return [e.body for e in self.history(instance_id) if type(e.body) is kind]

    def status(self, instance_id: str = "wf-1") -> RuntimeStatus:
        return self.execution(instance_id).status

    def output(self, instance_id: str = "wf-1") -> Any:
        return from_payload(self.execution(instance_id).output)

    def failure(self, instance_id: str = "wf-1") -> FailureDetails | None:
        return self.execution(instance_id).failure

    def actions(self, instance_id: str = "wf-1") -> list[act.Action]:
        return self.instances[instance_id].actions

    def rejected(self, instance_id: str = "wf-1") -> list[act.Rejected]:
        return self.instances[instance_id].rejected

    # --- internals ----------------------------------------------------------------------------

    def _new_execution(self, instance_id: str) -> WorkflowExecution:
        if self.step_budget is None:
            return WorkflowExecution(self.registry, instance_id)
        return WorkflowExecution(self.registry, instance_id, step_budget=self.step_budget)

    def _create(self, instance_id: str) -> Instance:
        if instance_id not in self.instances:
            self.instances[instance_id] = Instance(self._new_execution(instance_id))
        return self.instances[instance_id]

    def _turn(self, woken: str | None = None) -> None:
        """One turn of the first queued instance (of ``woken``: its wake-up after a
        continue-as-new, which also takes what is queued for it)."""
        instance_id = woken if woken is not None else self.queue[0][0]
        limit = self.max_batch
        if limit is not None and self.rng is not None:
            limit = self.rng.randint(1, limit)
        batch: list[Inbound] = []
        rest: deque[tuple[str, Inbound]] = deque()
        for target, inbound in self.queue:
            if target == instance_id and (limit is None or len(batch) < limit):
                batch.append(inbound)
            else:
                rest.append((target, inbound))
        self.queue = rest
        if instance_id in self.wakes:
            self.wakes.remove(instance_id)  # this turn begins its next generation
        instance = self._create(instance_id)
        if self.cold and instance.history:
            instance.execution = self._new_execution(instance_id)
            instance.execution.replay(instance.history)
        result = instance.execution.step(batch, self.now_ms)
        instance.turns.append(Turn(batch, self.now_ms, result))
        instance.history.extend(result.new_events)
        instance.rejected.extend(result.rejected)
        instance.actions.extend(result.actions)
        for action in result.actions:
            self._route(instance_id, action)

    def _route(self, instance_id: str, action: act.Action) -> None:
        handler = _ROUTES.get(type(action))
        if handler is not None:
            handler(self, instance_id, action)

    def _schedule(self, instance_id: str, action: act.ScheduleActivity) -> None:
        if action.name in self.hold:
            self.held.append((instance_id, action))
        else:
            self.activities.append((instance_id, action))

    def _run_activity(self, instance_id: str, task: act.ScheduleActivity) -> None:
        fn = self.registry.get_activity(task.name).fn
        body: EventBody
        try:
            value = fn(from_payload(task.input))
            if isinstance(value, Coroutine):
                value = _run_sync(value)
            body = TaskCompleted(task.task_id, to_payload(value), task.attempt)
        except Exception as exc:
            failure = dataclasses.replace(failure_from_exception(exc), stack="")
            body = TaskFailed(task.task_id, failure, task.attempt)
        self.send(instance_id, body, task.generation)

    def _fire_next_timer(self) -> None:
        key = min(self.timers, key=lambda k: (self.timers[k], k))
        fire_at = self.timers.pop(key)
        instance_id, generation, task_id = key
        self.now_ms = max(self.now_ms, fire_at)
        self.send(instance_id, TimerFired(task_id, fire_at), generation)

    def _create_timer(self, instance_id: str, action: act.CreateTimer) -> None:
        self.timers[(instance_id, action.generation, action.task_id)] = action.fire_at_ms

    def _cancel_timer(self, instance_id: str, action: act.CancelTimer) -> None:
        self.timers.pop((instance_id, action.generation, action.task_id), None)

    def _start_child(self, instance_id: str, action: act.StartChild) -> None:
        self._create(action.instance_id)
        body = ExecutionStarted(
            action.name,
            action.input,
            action.version,
            parent_instance_id=instance_id,
            parent_generation=action.generation,
            parent_task_id=action.task_id,
        )
        self.send(action.instance_id, body)

    def _send_event(self, instance_id: str, action: act.SendEvent) -> None:
        self.send(action.target_instance_id, EventRaised(action.name, action.input))

    def _complete(self, instance_id: str, action: act.CompleteExecution) -> None:
        parent = action.parent_instance_id
        if parent is None or action.parent_task_id is None:
            return
        body: EventBody
        if action.status is RuntimeStatus.COMPLETED:
            body = ChildWorkflowCompleted(action.parent_task_id, action.output)
        else:
            failure = action.failure or FailureDetails("Failed", action.status.value)
            body = ChildWorkflowFailed(action.parent_task_id, failure)
        self.send(parent, body, action.parent_generation)

    def _terminate_children(self, instance_id: str, action: act.TerminateChildren) -> None:
        for child in action.instance_ids:
            self.send(child, ExecutionTerminated(action.reason, recursive=True))

    def _continue_as_new(self, instance_id: str, action: act.ContinueAsNew) -> None:
        """The next generation begins in a turn of its own; events it is not given at its
        start come back to it later (the processor's backlog, simplified)."""
        self.wakes.append(instance_id)
        for name, payload in action.overflow:
            self.send(instance_id, EventRaised(name, payload))


_ROUTES: dict[type[act.Action], Callable[[Sim, str, Any], None]] = {
    act.ScheduleActivity: Sim._schedule,
    act.CreateTimer: Sim._create_timer,
    act.CancelTimer: Sim._cancel_timer,
    act.StartChild: Sim._start_child,
    act.SendEvent: Sim._send_event,
    act.CompleteExecution: Sim._complete,
    act.TerminateChildren: Sim._terminate_children,
    act.ContinueAsNew: Sim._continue_as_new,
}


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("test activities must not really await anything")


def strip_stacks(events: list[HistoryEvent]) -> list[HistoryEvent]:
    """Events with every failure's stack blanked (stacks name files and lines)."""
    return [dataclasses.replace(e, body=_strip_body(e.body)) for e in events]


def _strip_body(body: EventBody) -> EventBody:
    failure = getattr(body, "failure", None)
    if isinstance(failure, FailureDetails):
        return dataclasses.replace(body, failure=_strip_failure(failure))  # type: ignore[call-arg]
    return body


def _strip_failure(failure: FailureDetails) -> FailureDetails:
    cause = None if failure.cause is None else _strip_failure(failure.cause)
    return dataclasses.replace(failure, stack="", cause=cause)
