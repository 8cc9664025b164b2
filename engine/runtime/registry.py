"""Registration of workflows and activities, and the ``@workflow`` / ``@activity`` decorators.

A history names its workflow and activities by string, so the code that runs them is found
by name (and, for workflows, version) in a :class:`Registry`. A start without a version
runs the name's default version (:mod:`engine.runtime.versions`); a replay runs exactly the
version its history recorded. The module-level decorators
register into :data:`default_registry`; explicit ``Registry()`` instances keep tests and
multi-tenant processes apart. Decorators return the function unchanged, so decorated
functions stay plain, directly testable Python.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, overload

from engine.core.activity_info import current_activity, heartbeat, is_cancelled
from engine.core.concurrency import check_limit
from engine.core.errors import NotRegisteredError, RegistrationError
from engine.core.task_queues import DEFAULT_TASK_QUEUE, check_task_queue
from engine.runtime.versions import newest, version_key

F = TypeVar("F", bound=Callable[..., Any])

WorkflowFn = Callable[..., Coroutine[Any, Any, Any]]

_WORKFLOW_ATTR = "__turnstile_workflow__"
_ACTIVITY_ATTR = "__turnstile_activity__"
_QUEUE_ATTR = "__turnstile_task_queue__"


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A registered workflow: ``fn(ctx, input)`` (or ``fn(ctx)`` when it takes no input)."""

    name: str
    version: str
    fn: WorkflowFn
    takes_input: bool = True
    #: Exception types that fail the instance on purpose (others park it:
    #: docs/how-to/handle-failures.md).
    failure_types: tuple[type[BaseException], ...] = ()
    #: At most this many running instances per concurrency key its starts name (0: none).
    max_concurrency_per_key: int = 0
    #: Registered with ``default=True``: starts that name no version run this one.
    default: bool = False
    #: Finished instances are purged this long after they end (0: the namespace's
    #: ``retention_ms`` setting decides).
    retention_ms: int = 0
    #: One generation's history sizes (events) at which a continue-as-new is suggested and
    #: at which the instance fails (0: the settings ``history_events_warn``/``_max``).
    history_events_warn: int = 0
    history_events_max: int = 0
    #: The whole chain of runs (across continue-as-new) and each run end TIMED_OUT this
    #: long after they began (ms; 0: no timeout; a start may give its own).
    execution_timeout_ms: int = 0
    run_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class ActivityDefinition:
    """A registered activity; ``is_async`` tells workers whether to await it."""

    name: str
    fn: Callable[..., Any]
    is_async: bool = False
    #: The task queue its attempts go to when the call names none.
    task_queue: str = DEFAULT_TASK_QUEUE
    #: At most this many attempts at once on each worker (0: only the worker's limit).
    max_concurrency: int = 0


def _timeout_ms(name: str, what: str, value: timedelta | float | None) -> int:
    """A workflow timeout in ms: a timedelta or seconds, > 0 (None: no timeout)."""
    if value is None:
        return 0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise RegistrationError(
            f"{what} of workflow {name!r} must be a timedelta or a number of seconds > 0, "
            f"got {value!r}; leave it out for no timeout"
        )
    return max(1, round(seconds * 1000))


def _retention_ms(name: str, retention: timedelta | float | None) -> int:
    """``@workflow(retention=...)`` in ms: a timedelta or seconds, > 0 (None: not set)."""
    if retention is None:
        return 0
    seconds = retention.total_seconds() if isinstance(retention, timedelta) else retention
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise RegistrationError(
            f"retention of workflow {name!r} must be a timedelta or a number of seconds "
            f"> 0, got {retention!r}; leave it out to use the namespace's retention_ms"
        )
    return max(1, int(seconds * 1000))


def _history_events(name: str, warn: int, most: int) -> tuple[int, int]:
    """``@workflow(history_events_warn=..., history_events_max=...)``: whole numbers >= 0
    (0: the setting's), the warning size not above the maximum when both are given."""
    for what, value in (("history_events_warn", warn), ("history_events_max", most)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RegistrationError(
                f"{what} of workflow {name!r} must be a whole number of history events "
                f"(0: the setting's), got {value!r}"
            )
    if warn and most and warn > most:
        raise RegistrationError(
            f"history_events_warn={warn} of workflow {name!r} is above its "
            f"history_events_max={most}; the warning must come first"
        )
    return warn, most


def _describe(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", "?")
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


def _takes_input(fn: Callable[..., Any], name: str) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        raise RegistrationError(
            f"workflow {name!r} must accept the workflow context: write it as "
            f"'async def {getattr(fn, '__name__', name)}(ctx, input)'"
        )
    return len(positional) >= 2


class Registry:
    """Workflows by (name, version) and activities by name."""

    __slots__ = ("_activities", "_activity_names", "_defaults", "_workflow_names", "_workflows")

    def __init__(self) -> None:
        self._workflows: dict[tuple[str, str], WorkflowDefinition] = {}
        #: The version a start without one runs, per workflow name (see engine.runtime.versions).
        self._defaults: dict[str, str] = {}
        self._activities: dict[str, ActivityDefinition] = {}
        self._workflow_names: dict[Callable[..., Any], str] = {}
        self._activity_names: dict[Callable[..., Any], str] = {}

    # --- registration -------------------------------------------------------------------------

    @overload
    def workflow(self, fn: F, /) -> F: ...

    @overload
    def workflow(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        version: str = "",
        failure_types: tuple[type[BaseException], ...] = (),
        max_concurrency_per_key: int = 0,
        default: bool = False,
        retention: timedelta | float | None = None,
        history_events_warn: int = 0,
        history_events_max: int = 0,
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
    ) -> Callable[[F], F]: ...

    def workflow(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        version: str = "",
        failure_types: tuple[type[BaseException], ...] = (),
        max_concurrency_per_key: int = 0,
        default: bool = False,
        retention: timedelta | float | None = None,
        history_events_warn: int = 0,
        history_events_max: int = 0,
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
    ) -> F | Callable[[F], F]:
        """Register an ``async def`` workflow; usable bare or as ``@workflow(name=...)``.

        ``failure_types``: exceptions that fail the instance when they escape the code;
        other unexpected exceptions park it until fixed code is deployed
        (docs/how-to/handle-failures.md).
        ``max_concurrency_per_key``: at most this many instances run at once per
        ``concurrency_key`` their starts name; further starts wait, in order, as PENDING.
        ``default``: starts that name no version run this version (else the newest does).
        ``retention`` (a timedelta or seconds): the processor purges a finished instance
        this long after it ended (overrides the namespace's ``retention_ms``).
        ``history_events_warn``/``history_events_max``: one generation's history sizes at
        which ``ctx.continue_as_new_suggested`` turns True and the instance fails
        (override the settings of the same names; 0: the setting's).
        ``execution_timeout``/``run_timeout`` (a timedelta or seconds): the instance ends
        TIMED_OUT when its whole chain of runs (across continue-as-new), or one run, has
        not ended this long after it began (a start's own values win)."""

        def register(f: F) -> F:
            self.add_workflow(
                f,
                name=name,
                version=version,
                failure_types=failure_types,
                max_concurrency_per_key=max_concurrency_per_key,
                default=default,
                retention=retention,
                history_events_warn=history_events_warn,
                history_events_max=history_events_max,
                execution_timeout=execution_timeout,
                run_timeout=run_timeout,
            )
            return f

        return register(fn) if fn is not None else register

    @overload
    def activity(self, fn: F, /) -> F: ...

    @overload
    def activity(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        task_queue: str | None = None,
        max_concurrency: int = 0,
    ) -> Callable[[F], F]: ...

    def activity(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        task_queue: str | None = None,
        max_concurrency: int = 0,
    ) -> F | Callable[[F], F]:
        """Register an activity (sync or async); usable bare or as
        ``@activity(name=..., task_queue=..., max_concurrency=...)``."""

        def register(f: F) -> F:
            self.add_activity(f, name=name, task_queue=task_queue, max_concurrency=max_concurrency)
            return f

        return register(fn) if fn is not None else register

    def add_workflow(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        version: str = "",
        failure_types: tuple[type[BaseException], ...] = (),
        max_concurrency_per_key: int = 0,
        default: bool = False,
        retention: timedelta | float | None = None,
        history_events_warn: int = 0,
        history_events_max: int = 0,
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
    ) -> WorkflowDefinition:
        """Register ``fn`` as a workflow (the non-decorator form)."""
        name = name or getattr(fn, "__name__", "")
        if not name:
            raise RegistrationError("a workflow needs a name: pass name=...")
        if not inspect.iscoroutinefunction(fn):
            raise RegistrationError(
                f"workflow {name!r} ({_describe(fn)}) must be defined with 'async def'"
            )
        existing = self._workflows.get((name, version))
        if existing is not None and existing.fn is not fn:
            raise RegistrationError(
                f"workflow {name!r} version {version!r} is already registered by "
                f"{_describe(existing.fn)}; give {_describe(fn)} another name with "
                f"@workflow(name=...) or another version with @workflow(version=...)"
            )
        limit = check_limit(name, max_concurrency_per_key)
        definition = WorkflowDefinition(
            name,
            version,
            fn,
            _takes_input(fn, name),
            tuple(failure_types),
            limit,
            default,
            _retention_ms(name, retention),
            *_history_events(name, history_events_warn, history_events_max),
            _timeout_ms(name, "execution_timeout", execution_timeout),
            _timeout_ms(name, "run_timeout", run_timeout),
        )
        self._check_default(definition)
        self._workflows[(name, version)] = definition
        self._defaults[name] = self._pick_default(name)
        self._workflow_names[fn] = name
        _set_attr(fn, _WORKFLOW_ATTR, (name, version))
        return definition

    def add_activity(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        task_queue: str | None = None,
        max_concurrency: int = 0,
    ) -> ActivityDefinition:
        """Register ``fn`` as an activity (the non-decorator form); ``task_queue``: the
        queue its attempts go to unless the call names one (default: ``default``);
        ``max_concurrency``: at most this many of its attempts at once per worker."""
        queue = check_task_queue(task_queue or DEFAULT_TASK_QUEUE)
        if not isinstance(max_concurrency, int) or max_concurrency < 0:
            raise RegistrationError(
                f"max_concurrency of activity {name or fn!r} must be a whole number >= 0 "
                f"(0: no limit of its own), got {max_concurrency!r}"
            )
        name = name or getattr(fn, "__name__", "")
        if not name:
            raise RegistrationError("an activity needs a name: pass name=...")
        existing = self._activities.get(name)
        if existing is not None and existing.fn is not fn:
            raise RegistrationError(
                f"activity {name!r} is already registered by {_describe(existing.fn)}; give "
                f"{_describe(fn)} another name with @activity(name=...)"
            )
        is_async = inspect.iscoroutinefunction(fn)
        definition = ActivityDefinition(name, fn, is_async, queue, max_concurrency)
        self._activities[name] = definition
        self._activity_names[fn] = name
        _set_attr(fn, _ACTIVITY_ATTR, name)
        _set_attr(fn, _QUEUE_ATTR, queue)
        return definition

    def _check_default(self, definition: WorkflowDefinition) -> None:
        if not definition.default:
            return
        for (name, version), other in self._workflows.items():
            if name == definition.name and other.default and version != definition.version:
                raise RegistrationError(
                    f"workflow {name!r}: versions {version!r} and {definition.version!r} are "
                    f"both marked default=True; mark only the one that new starts should run"
                )

    def _pick_default(self, name: str) -> str:
        versions = [d for (n, _), d in self._workflows.items() if n == name]
        marked = [d.version for d in versions if d.default]
        return marked[0] if marked else newest(d.version for d in versions)

    # --- lookups ------------------------------------------------------------------------------

    def get_workflow(self, name: str, version: str = "") -> WorkflowDefinition:
        """The workflow a start of (name, version) runs: an empty ``version`` means the
        name's default version (marked ``default=True``, else the newest registered)."""
        if not version:
            default = self._defaults.get(name)
            if default is not None:
                return self._workflows[(name, default)]
        found = self._workflows.get((name, version))
        if found is not None:
            return found
        raise self._not_registered(name, version)

    def recorded_workflow(self, name: str, version: str) -> WorkflowDefinition:
        """The code that replays a history whose ExecutionStarted names (name, version):
        exactly that version; a history that names no version (written by a start that
        was not resolved) runs the default version."""
        found = self._workflows.get((name, version))
        if found is not None:
            return found
        return self.get_workflow(name, version)

    def start_version(self, name: str, version: str = "") -> str:
        """The version a start of (name, version) runs, as history and status record it:
        ``version`` itself, or for an empty one the name's default (an unknown workflow
        keeps what the start said: running it fails and says why)."""
        if version:
            return version
        return self._defaults.get(name, version)

    def default_version(self, name: str) -> str | None:
        """The version a start of ``name`` without a version runs (None: not registered)."""
        return self._defaults.get(name)

    def _not_registered(self, name: str, version: str) -> NotRegisteredError:
        versions = sorted((v for (n, v) in self._workflows if n == name), key=version_key)
        if versions:
            return NotRegisteredError(
                f"workflow {name!r} has no version {version!r} here (registered versions: "
                f"{', '.join(repr(v) for v in versions)}); deploy code that registers it"
            )
        known = ", ".join(sorted({n for (n, _) in self._workflows})) or "none"
        return NotRegisteredError(
            f"no workflow named {name!r} is registered in this process (known: {known}); "
            f"import the module that defines it before starting the processor"
        )

    def get_activity(self, name: str) -> ActivityDefinition:
        """The activity registered under ``name``."""
        found = self._activities.get(name)
        if found is None:
            known = ", ".join(sorted(self._activities)) or "none"
            raise NotRegisteredError(
                f"no activity named {name!r} is registered in this worker (known: {known}); "
                f"import the module that defines it before starting the worker"
            )
        return found

    def has_activity(self, name: str) -> bool:
        return name in self._activities

    def has_workflow(self, name: str, version: str = "") -> bool:
        try:
            self.get_workflow(name, version)
        except NotRegisteredError:
            return False
        return True

    def workflows(self) -> list[WorkflowDefinition]:
        return list(self._workflows.values())

    def activities(self) -> list[ActivityDefinition]:
        return list(self._activities.values())

    def workflow_name(self, workflow: str | Callable[..., Any]) -> str:
        """The registered name of a workflow given by name or by function."""
        if isinstance(workflow, str):
            return workflow
        name = self._workflow_names.get(workflow)
        if name is not None:
            return name
        marker = getattr(workflow, _WORKFLOW_ATTR, None)
        if isinstance(marker, tuple):
            return str(marker[0])
        return str(getattr(workflow, "__name__", workflow))

    def activity_name(self, activity: str | Callable[..., Any]) -> str:
        """The registered name of an activity given by name or by function."""
        if isinstance(activity, str):
            return activity
        name = self._activity_names.get(activity)
        if name is not None:
            return name
        marker = getattr(activity, _ACTIVITY_ATTR, None)
        if isinstance(marker, str):
            return marker
        return str(getattr(activity, "__name__", activity))

    def activity_task_queue(self, activity: str | Callable[..., Any]) -> str:
        """The task queue an activity was registered with: by function (also one registered
        in another registry, through its marker) or by name (if registered here)."""
        if not isinstance(activity, str):
            marker = getattr(activity, _QUEUE_ATTR, None)
            if isinstance(marker, str):
                return marker
        definition = self._activities.get(self.activity_name(activity))
        return definition.task_queue if definition is not None else DEFAULT_TASK_QUEUE

    def task_queues(self) -> list[str]:
        """The task queues of the registered activities, sorted."""
        return sorted({a.task_queue for a in self._activities.values()})


def _set_attr(fn: Callable[..., Any], attr: str, value: object) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # some callables refuse attributes
        setattr(fn, attr, value)


default_registry = Registry()
"""The registry that the module-level ``@workflow`` and ``@activity`` decorators fill."""


@overload
def workflow(fn: F, /) -> F: ...


@overload
def workflow(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    version: str = "",
    failure_types: tuple[type[BaseException], ...] = (),
    max_concurrency_per_key: int = 0,
    default: bool = False,
    retention: timedelta | float | None = None,
    history_events_warn: int = 0,
    history_events_max: int = 0,
    execution_timeout: timedelta | float | None = None,
    run_timeout: timedelta | float | None = None,
) -> Callable[[F], F]: ...


def workflow(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    version: str = "",
    failure_types: tuple[type[BaseException], ...] = (),
    max_concurrency_per_key: int = 0,
    default: bool = False,
    retention: timedelta | float | None = None,
    history_events_warn: int = 0,
    history_events_max: int = 0,
    execution_timeout: timedelta | float | None = None,
    run_timeout: timedelta | float | None = None,
) -> F | Callable[[F], F]:
    """Register an ``async def wf(ctx, input)`` workflow in :data:`default_registry`."""
    if fn is not None:
        return default_registry.workflow(fn)
    return default_registry.workflow(
        name=name,
        version=version,
        failure_types=failure_types,
        max_concurrency_per_key=max_concurrency_per_key,
        default=default,
        retention=retention,
        history_events_warn=history_events_warn,
        history_events_max=history_events_max,
        execution_timeout=execution_timeout,
        run_timeout=run_timeout,
    )


class _Activity:
    """``@activity`` (register an activity in :data:`default_registry`), and what activity
    code calls while it runs: ``activity.heartbeat(details)``, ``activity.is_cancelled()``,
    ``activity.info()`` (the attempt's context: idempotency key, attempt number, the
    previous attempt's ``heartbeat_details``)."""

    heartbeat = staticmethod(heartbeat)
    is_cancelled = staticmethod(is_cancelled)
    info = staticmethod(current_activity)

    @overload
    def __call__(self, fn: F, /) -> F: ...

    @overload
    def __call__(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        task_queue: str | None = None,
        max_concurrency: int = 0,
    ) -> Callable[[F], F]: ...

    def __call__(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        task_queue: str | None = None,
        max_concurrency: int = 0,
    ) -> F | Callable[[F], F]:
        if fn is not None:
            return default_registry.activity(fn)
        return default_registry.activity(
            name=name, task_queue=task_queue, max_concurrency=max_concurrency
        )


activity = _Activity()
"""Register an activity in :data:`default_registry` (``task_queue``: see
docs/how-to/task-queues.md); also ``activity.heartbeat(details)`` and
``activity.is_cancelled()`` for activity code."""
