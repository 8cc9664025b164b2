"""Interrupts that end a turn from outside the workflow's own control flow.

Workflow code may catch ``Exception`` (or anything) in a loop, so a turn that must stop is
stopped with a :class:`BaseException` the driver never hands to workflow code as a task
failure: it unwinds the code, the turn and :meth:`WorkflowExecution.step`, and the caller
fails the instance with the :class:`~engine.core.errors.WorkflowRuntimeError` it names.
"""

from __future__ import annotations

from engine.core.errors import StepBudgetExceededError, WorkflowRuntimeError

#: History events one turn may add before it is stopped (bounds a runaway turn's memory).
DEFAULT_MAX_TURN_EVENTS = 100_000


class TurnInterrupt(BaseException):
    """Stops the running turn; never catch it in workflow code."""

    def error(self) -> WorkflowRuntimeError:
        """The error to fail the instance with."""
        return WorkflowRuntimeError(str(self) or "the turn was interrupted")


class TurnTimedOut(TurnInterrupt):
    """Raised asynchronously into the turn's thread by the turn watchdog (no arguments: the
    interpreter instantiates it); the watchdog's caller turns it into
    :class:`~engine.core.errors.WorkflowTurnTimeoutError` with the budget."""


class TurnEventsExceeded(TurnInterrupt):
    """The turn added more history events than its bound (an endless ``ctx.run`` loop)."""

    def error(self) -> WorkflowRuntimeError:
        return StepBudgetExceededError(str(self))


def too_many_events(instance_id: str, limit: int) -> TurnEventsExceeded:
    return TurnEventsExceeded(
        f"workflow code of instance {instance_id!r} added {limit} history events in one turn "
        f"without waiting on anything durable; it is probably looping over ctx.run or "
        f"another ctx operation that completes at once. Await an activity or a timer in "
        f"such loops, or continue as new; raise turn_max_events if this is intended."
    )
