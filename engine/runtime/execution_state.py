"""The state of one workflow execution, and what it shows to the outside.

:class:`ExecutionState` holds everything a :class:`~engine.runtime.executor.WorkflowExecution`
knows about its instance (the journal, the current generation, status, output, failure,
the generation a continue-as-new asked for) and answers the questions the processor asks
between turns: its metadata for the status topic, its pending timers and running
children, the work a reset asks for again. Advancing it (replay, turns, running the code)
is the executor's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from engine.core.errors import WorkflowRuntimeError
from engine.core.failure import FailureDetails
from engine.core.history import (
    ChildWorkflowCreated,
    ExecutionStarted,
    HistoryEvent,
    ParentClosePolicy,
    RuntimeStatus,
)
from engine.core.messages import InstanceStatus
from engine.core.payloads import Payload
from engine.runtime.actions import Action, CreateTimer, StartChild
from engine.runtime.continuation import Continuation, count_by_name
from engine.runtime.driver import DEFAULT_STEP_BUDGET
from engine.runtime.durable import ActivityCall
from engine.runtime.generation import Generation
from engine.runtime.interrupt import DEFAULT_MAX_TURN_EVENTS
from engine.runtime.journal import Journal
from engine.runtime.registry import Registry, WorkflowDefinition

#: The statuses in which the current generation runs no more code.
ENDED = frozenset({s for s in RuntimeStatus if s.is_terminal} | {RuntimeStatus.CONTINUED_AS_NEW})


class ExecutionState:
    """What one execution holds and shows: its status, its current generation, the
    metadata the processor publishes and the work it waits for.

    :class:`~engine.runtime.executor.WorkflowExecution` advances it (replay and turns);
    this part only reads, so the processor, queries and resets can look at an execution
    without going through the code that changes it.
    """

    __slots__ = (
        "_broken",
        "_budget",
        "_continuation",
        "_created_ms",
        "_failure",
        "_gen",
        "_journal",
        "_last_updated_ms",
        "_output",
        "_registry",
        "_run_inline",
        "_started",
        "_status",
        "_turn_open",
        "code_error",
        "definition",
        "instance_id",
    )

    def __init__(
        self,
        registry: Registry,
        instance_id: str,
        *,
        step_budget: int = DEFAULT_STEP_BUDGET,
        start_sequence: int = 0,
        generation: int = 0,
        max_turn_events: int = DEFAULT_MAX_TURN_EVENTS,
    ) -> None:
        """``start_sequence`` and ``generation`` place a brand-new run after an older
        history of the same instance id (restart under an ID-reuse policy); replay sets
        both from the history instead. ``max_turn_events`` bounds the history events one
        turn may add (see :mod:`engine.runtime.interrupt`)."""
        if step_budget < 1:
            raise ValueError("step_budget must be at least 1")
        self._registry = registry
        self.instance_id = instance_id
        self._budget = step_budget
        self._journal = Journal(instance_id, start_sequence, generation, max_turn_events)
        self._gen: Generation | None = None
        self._started: ExecutionStarted | None = None
        self._status = RuntimeStatus.PENDING
        self._output: Payload | None = None
        self._failure: FailureDetails | None = None
        self._created_ms = 0
        self._last_updated_ms = 0
        self._turn_open = False
        self._run_inline = True
        self._broken: BaseException | None = None
        #: The next generation, between a continue-as-new and the turn that begins it.
        self._continuation: Continuation | None = None
        #: The exception that escaped the workflow code and failed the run (for parking).
        self.code_error: BaseException | None = None
        self.definition: WorkflowDefinition | None = None

    def close(self) -> None:
        """Drop the code's coroutines (the processor evicts the instance from memory).

        ``finally`` blocks of suspended coroutines run now, with every ctx operation
        refused, instead of at some garbage collection later. Called on deletion too.
        """
        gen = getattr(self, "_gen", None)  # None also when __init__ failed early
        if gen is not None and not gen.closing:
            gen.close()

    def __del__(self) -> None:
        # at interpreter shutdown, modules may already be gone: never raise from here
        with contextlib.suppress(Exception):
            self.close()

    # --- properties ---------------------------------------------------------------------------

    @property
    def status(self) -> RuntimeStatus:
        return self._status

    @property
    def generation(self) -> int:
        return self._journal.generation

    @property
    def next_sequence(self) -> int:
        return self._journal.next_sequence

    @property
    def name(self) -> str:
        return self._started.name if self._started is not None else ""

    @property
    def version(self) -> str:
        return self._started.version if self._started is not None else ""

    @property
    def input(self) -> Payload | None:
        """The current generation's input."""
        return self._started.input if self._started is not None else None

    @property
    def continuation(self) -> Continuation | None:
        """The generation a continue-as-new asked for, until a turn begins it."""
        return self._continuation

    @property
    def started(self) -> ExecutionStarted | None:
        """The current generation's ExecutionStarted (parent, tags, request id)."""
        return self._started

    @property
    def output(self) -> Payload | None:
        return self._output

    @property
    def failure(self) -> FailureDetails | None:
        return self._failure

    @property
    def custom_status(self) -> Payload | None:
        gen = self._gen
        return gen.custom_status if gen is not None else None

    @property
    def tags(self) -> dict[str, str]:
        """The instance's tags: the start's with the current generation's upserts."""
        gen = self._gen
        return dict(gen.tags) if gen is not None else {}

    @property
    def created_ms(self) -> int:
        """When the earliest generation this execution has seen started."""
        return self._created_ms

    @property
    def last_updated_ms(self) -> int:
        return self._last_updated_ms

    @property
    def running_children(self) -> list[str]:
        """Instance ids of this generation's children whose result has not arrived."""
        gen = self._gen
        return [] if gen is None else [child.instance_id for child in gen.children.values()]

    @property
    def running_children_policies(self) -> list[tuple[str, ParentClosePolicy]]:
        """This generation's running children with their parent-close policies."""
        gen = self._gen
        return [] if gen is None else [(c.instance_id, c.policy) for c in gen.children.values()]

    @property
    def pending_timers(self) -> dict[int, int]:
        """Pending timers of the current generation: task id -> fire time (epoch ms)."""
        gen = self._gen
        if gen is None or self._status in ENDED:
            return {}
        return {task_id: timer.fire_at_ms for task_id, timer in gen.timers.items()}

    def open_work(self) -> list[Action]:
        """What the current generation waits for from outside, as the actions that ask for
        it: the running attempt of each activity, each pending timer, each running child.
        A reset sends them again for its new run: nothing was sent for that generation."""
        gen = self._gen
        if gen is None or self._status in ENDED:
            return []
        work: list[Action] = []
        for task in gen.tasks.values():
            if isinstance(task, ActivityCall):
                attempt = task.reissue()
                if attempt is not None:
                    work.append(attempt)
        work += [
            CreateTimer(t.task_id, t.fire_at_ms, generation=gen.number) for t in gen.timers.values()
        ]
        created = {
            e.body.task_id: e.body
            for e in self._journal.events
            if isinstance(e.body, ChildWorkflowCreated)
        }
        for task_id, child in gen.children.items():
            body = created.get(task_id)
            if body is not None:
                work.append(
                    StartChild(
                        task_id,
                        child.instance_id,
                        body.name,
                        body.version,
                        body.input,
                        child.policy,
                        generation=gen.number,
                    )
                )
        return work

    @property
    def history(self) -> Sequence[HistoryEvent]:
        """The current generation's events, from its ExecutionStarted (read-only)."""
        return self._journal.events

    def metadata(self) -> InstanceStatus:
        """The instance's metadata, as published on the status topic."""
        started = self._started
        return InstanceStatus(
            instance_id=self.instance_id,
            name=self.name,
            version=self.version,
            status=self._status,
            generation=self._journal.generation,
            created_ms=self._created_ms,
            last_updated_ms=self._last_updated_ms,
            input=self.input,
            output=self._output,
            custom_status=self.custom_status,
            failure=self._failure,
            parent_instance_id=started.parent_instance_id if started else None,
            tags=self.tags,
            request_id=started.request_id if started else "",
        )

    @property
    def current_generation(self) -> Generation | None:
        """The running generation's state; None before ExecutionStarted."""
        return self._gen

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise WorkflowRuntimeError(
                f"execution of {self.instance_id!r} is unusable after an earlier error "
                f"({type(self._broken).__name__}: {self._broken}); rebuild it from history"
            ) from self._broken

    def unconsumed_by_name(self) -> dict[str, int]:
        """How many received events of each name the code has not read yet (for a
        generation that waits to begin: the events carried into it). The processor hands
        events it keeps over only while a name's count is below ``EVENT_WINDOW``."""
        if self._continuation is not None:
            return count_by_name(self._continuation.carried)
        if self._gen is not None and self._status not in ENDED:
            return count_by_name(self._gen.unconsumed_events())
        return {}
