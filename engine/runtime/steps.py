"""What an inline step (``ctx.run``) knows about itself while it runs: ``current_step()``.

An inline step runs in the processor, inside the turn that asked for it, and its result is
recorded in that turn's history. The result is recorded once, but the body runs *at least*
once: a turn that is redone before its transaction committed (an aborted transaction, a
crash of the replica, an instance isolated after a refused record) runs the code again, and
the step with it, since its first result was never recorded. So a step with a side effect
(a call out, a row written) needs what an activity has: a key that is the same on every
re-run of the step and differs between steps (:func:`engine.core.idempotency.call_key`:
instance, run id, generation, task id). The runtime sets a context variable around the body, so the
function does not have to declare a parameter for it, as ``activity.info()`` works for
activities. On replay the recorded result is used and the body does not run at all.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine.core.errors import TurnstileError
from engine.core.idempotency import call_key

__all__ = ["StepContext", "current_step", "in_step", "run_step", "step_scope"]


@dataclass(frozen=True, slots=True)
class StepContext:
    """The inline step whose body is running."""

    instance_id: str
    generation: int
    task_id: int
    name: str
    #: The run id of the start that began the run ("": a run from before run ids).
    run_id: str = ""

    @property
    def idempotency_key(self) -> str:
        """``instance/run id/generation/task id``: the same every time this step's body
        runs (a redone turn gives it the same task id), different for every other step and
        call of the workflow, and for a later run of a reused instance id."""
        return call_key(self.instance_id, self.run_id, self.generation, self.task_id)


_CURRENT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "turnstile_step", default=None
)


def current_step() -> StepContext:
    """The inline step running in this thread.

    Raises :class:`TurnstileError` outside a step body (a unit test that calls the
    function directly can wrap the call in :func:`step_scope`).
    """
    info = _CURRENT.get()
    if info is None:
        raise TurnstileError(
            "current_step() was called outside an inline step; it is only available while "
            "ctx.run runs the step's function (tests can use engine.runtime.steps.step_scope)"
        )
    return info


def in_step() -> bool:
    """Whether this code runs inside an inline step's body."""
    return _CURRENT.get() is not None


@contextmanager
def step_scope(info: StepContext) -> Iterator[StepContext]:
    """Make ``info`` the current step for the duration of the block."""
    token = _CURRENT.set(info)
    try:
        yield info
    finally:
        _CURRENT.reset(token)


def run_step(info: StepContext, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` with ``info`` as the current step (the runtime's way in: no
    context manager object on the inline step's path)."""
    token = _CURRENT.set(info)
    try:
        return fn(*args)
    finally:
        _CURRENT.reset(token)
