"""Turnstile: a durable workflow engine for Python, event-sourced on Apache Kafka.

This package is what workflow code imports. It pulls in only the pure core (no Kafka, no
RocksDB, no Avro, no I/O), so workflows and activities can be imported and unit-tested
anywhere::

    from engine import workflow, activity, WorkflowContext

    @activity
    def charge(order): ...

    @workflow
    async def checkout(ctx: WorkflowContext, order):
        return await ctx.call_activity(charge, order)
"""

from __future__ import annotations

from typing import Any

from engine.core.errors import (
    ActivityCancelledError,
    ActivityFailedError,
    ApplicationError,
    ChildWorkflowFailedError,
    InlineStepFailedError,
    InstanceFailedError,
    NonDeterminismError,
    NotRegisteredError,
    RegistrationError,
    StepBudgetExceededError,
    TurnstileError,
    WorkflowFailure,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
)
from engine.core.failure import FailureDetails
from engine.core.history import ParentClosePolicy
from engine.runtime.context import WorkflowContext
from engine.runtime.registry import Registry, activity, default_registry, workflow
from engine.runtime.retry import RetryPolicy
from engine.runtime.steps import StepContext, current_step
from engine.runtime.tasks import Task

#: The release, also the package version (``pyproject.toml`` reads it from here).
__version__ = "0.1.0"

__all__ = [
    "ActivityCancelledError",
    "ActivityFailedError",
    "ApplicationError",
    "CancelledError",
    "ChildWorkflowFailedError",
    "FailureDetails",
    "InlineStepFailedError",
    "InstanceFailedError",
    "NonDeterminismError",
    "NotRegisteredError",
    "ParentClosePolicy",
    "RegistrationError",
    "Registry",
    "RetryPolicy",
    "StepBudgetExceededError",
    "StepContext",
    "Task",
    "TurnstileError",
    "WorkflowContext",
    "WorkflowFailure",
    "WorkflowRuntimeError",
    "WorkflowTimeoutError",
    "__version__",
    "activity",
    "current_step",
    "default_registry",
    "workflow",
]


def __getattr__(name: str) -> Any:
    # ``CancelledError`` is asyncio's own class (what cancelled workflow code receives);
    # asyncio is imported only when someone asks for it.
    if name == "CancelledError":
        from asyncio import CancelledError

        return CancelledError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
