"""The deterministic workflow runtime (pure: no I/O, no wall clock).

Authoring API (decorators, registry, context, retry policy) plus the executor that the
processor and the auditing tools use to replay histories and run turns.
"""

from __future__ import annotations

from typing import Any

from engine.runtime.actions import (
    Action,
    CancelTimer,
    CompleteExecution,
    ContinueAsNew,
    CreateTimer,
    PublishRecord,
    Rejected,
    RunInlineStep,
    ScheduleActivity,
    SendEvent,
    SetCustomStatus,
    StartChild,
    TerminateChildren,
    TurnResult,
)
from engine.runtime.context import WorkflowContext
from engine.runtime.driver import DEFAULT_STEP_BUDGET
from engine.runtime.executor import WorkflowExecution, as_registry, execute
from engine.runtime.registry import (
    ActivityDefinition,
    Registry,
    WorkflowDefinition,
    activity,
    default_registry,
    workflow,
)
from engine.runtime.retry import RetryPolicy
from engine.runtime.tasks import Task

__all__ = [
    "DEFAULT_STEP_BUDGET",
    "Action",
    "ActivityDefinition",
    "CancelTimer",
    "CancelledError",
    "CompleteExecution",
    "ContinueAsNew",
    "CreateTimer",
    "PublishRecord",
    "Registry",
    "Rejected",
    "RetryPolicy",
    "RunInlineStep",
    "ScheduleActivity",
    "SendEvent",
    "SetCustomStatus",
    "StartChild",
    "Task",
    "TerminateChildren",
    "TurnResult",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowExecution",
    "activity",
    "as_registry",
    "default_registry",
    "execute",
    "workflow",
]


def __getattr__(name: str) -> Any:
    # ``CancelledError`` is asyncio's; importing asyncio is deferred until someone asks.
    if name == "CancelledError":
        from asyncio import CancelledError

        return CancelledError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
