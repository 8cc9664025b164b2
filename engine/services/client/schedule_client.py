"""The client's side of schedules: build the commands, read the schedules' status.

Every check that can fail is made here, before anything is sent (a bad cron expression, no
interval, an unknown overlap policy, a name run ids cannot hold), so the user sees a
:class:`ScheduleSpecError` at once; the processor checks again for plain producers and
answers a refusal. A schedule's row has a status record like an instance (RUNNING while
active, SUSPENDED while paused) whose custom status is the schedule's description, so
``describe`` and ``list`` read the status view like ``get`` does.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from engine.core.errors import ScheduleSpecError
from engine.core.history import RuntimeStatus
from engine.core.messages import CommandOutcome, InstanceStatus, ScheduleCommand
from engine.core.payloads import from_payload, to_payload
from engine.core.schedules import (
    DEFAULT_CATCH_UP_WINDOW_MS,
    SCHEDULE_PREFIX,
    OverlapPolicy,
    ScheduleOp,
    ScheduleSpec,
    check_name,
    check_spec,
    parse_duration,
    schedule_id,
)
from engine.services.client.workflow_client import WorkflowClient
from engine.services.time_zones import resolve_zone

Duration = timedelta | float | str


def duration_ms(value: Duration, what: str) -> int:
    """A duration given as a timedelta, seconds, or text (``30s``, ``1h``), in ms."""
    if isinstance(value, str):
        return parse_duration(value, what)
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ScheduleSpecError(f"{what} must be a timedelta, seconds or text like '30s'")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return int(seconds * 1000)


def _epoch_ms(when: datetime | None) -> int:
    if when is None:
        return 0
    if when.tzinfo is None:
        raise ScheduleSpecError(f"{when} has no time zone; pass an aware datetime (UTC)")
    return int(when.timestamp() * 1000)


def overlap_policy(value: OverlapPolicy | str) -> OverlapPolicy:
    try:
        return OverlapPolicy(str(value).upper())
    except ValueError:
        names = ", ".join(p.value for p in OverlapPolicy)
        raise ScheduleSpecError(f"overlap policy {value!r} is not one of {names}") from None


class ScheduleClient:
    """Schedule commands and reads on top of a :class:`WorkflowClient`."""

    def __init__(self, client: WorkflowClient) -> None:
        self.client = client

    def create(
        self,
        name: str,
        workflow: Any,
        input: Any = None,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        version: str = "",
        overlap: OverlapPolicy | str = OverlapPolicy.SKIP,
        catch_up_window: Duration | None = None,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        timezone: str = "UTC",
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        """Create a schedule (ScheduleAlreadyExistsError if the name is taken); a cron
        expression reads the wall clock of ``timezone`` (an IANA name)."""
        window = DEFAULT_CATCH_UP_WINDOW_MS
        if catch_up_window is not None:
            window = duration_ms(catch_up_window, "the catch-up window")
        spec = ScheduleSpec(
            workflow=self.client.registry.workflow_name(workflow),
            cron=cron or "",
            every_ms=0 if every is None else duration_ms(every, "the interval"),
            version=version,
            input=None if input is None else to_payload(input),
            overlap=overlap_policy(overlap),
            catch_up_window_ms=window,
            start_at_ms=_epoch_ms(start_at),
            end_at_ms=_epoch_ms(end_at),
            timezone=timezone,
        )
        check_spec(spec)
        resolve_zone(timezone)  # an unknown name fails here, before anything is sent
        return self._send(name, ScheduleOp.CREATE, request_id, wait, spec=spec)

    def pause(self, name: str, reason: str = "", **options: Any) -> CommandOutcome | None:
        return self._send(name, ScheduleOp.PAUSE, reason=reason, **options)

    def resume(self, name: str, **options: Any) -> CommandOutcome | None:
        return self._send(name, ScheduleOp.RESUME, **options)

    def delete(self, name: str, **options: Any) -> CommandOutcome | None:
        return self._send(name, ScheduleOp.DELETE, **options)

    def trigger(self, name: str, **options: Any) -> CommandOutcome | None:
        return self._send(name, ScheduleOp.TRIGGER, **options)

    def _send(
        self,
        name: str,
        op: ScheduleOp,
        request_id: str | None = None,
        wait: bool = True,
        *,
        spec: ScheduleSpec | None = None,
        reason: str = "",
    ) -> CommandOutcome | None:
        command = ScheduleCommand(
            instance_id=schedule_id(check_name(name)),
            op=op,
            spec=spec,
            request_id=request_id or uuid.uuid4().hex,
            reason=reason,
        )
        return self.client.send(command, wait=wait)

    def describe(self, name: str) -> dict[str, Any] | None:
        """The schedule's description (None: no such schedule)."""
        return _described(self.client.get(schedule_id(check_name(name))))

    def list(self) -> list[dict[str, Any]]:
        """Every schedule, by name."""
        self.client.view.wait_current(self.client.ready_timeout_s)
        found = [_described(s) for s in self.client.view.snapshot() if is_schedule_status(s)]
        return sorted((d for d in found if d is not None), key=lambda d: str(d["name"]))


def is_schedule_status(status: InstanceStatus) -> bool:
    return status.instance_id.startswith(SCHEDULE_PREFIX)


def _described(status: InstanceStatus | None) -> dict[str, Any] | None:
    if status is None:
        return None
    described = from_payload(status.custom_status)
    if not isinstance(described, dict):
        return None
    described["state"] = "PAUSED" if status.status is RuntimeStatus.SUSPENDED else "ACTIVE"
    described["input"] = from_payload(status.input)
    return described


class ScheduleMethods:
    """The schedule methods of ``Client`` and ``TestEngine`` (one definition for both)."""

    def _schedule_client(self) -> ScheduleClient:
        raise NotImplementedError

    def create_schedule(
        self, name: str, workflow: Any, input: Any = None, **options: Any
    ) -> CommandOutcome | None:
        """Start ``workflow`` at every fire time of ``cron=`` (five fields, in ``timezone=``,
        an IANA name, default UTC) or ``every=`` (a timedelta, seconds or '30s');
        ``overlap=`` SKIP, BUFFER_ONE or ALLOW_ALL, ``catch_up_window=``,
        ``start_at=``/``end_at=``, ``version=``. Raises
        ScheduleSpecError before sending a bad definition, ScheduleAlreadyExistsError
        when the name is taken."""
        return self._schedule_client().create(name, workflow, input, **options)

    def pause_schedule(self, name: str, reason: str = "", **options: Any) -> CommandOutcome | None:
        """No fire time starts a run until resumed (ScheduleNotFoundError: no such schedule)."""
        return self._schedule_client().pause(name, reason, **options)

    def resume_schedule(self, name: str, **options: Any) -> CommandOutcome | None:
        """Go on from the next fire time; the fire times while paused are not run."""
        return self._schedule_client().resume(name, **options)

    def delete_schedule(self, name: str, **options: Any) -> CommandOutcome | None:
        """Remove the schedule; the runs it started go on."""
        return self._schedule_client().delete(name, **options)

    def trigger_schedule(self, name: str, **options: Any) -> CommandOutcome | None:
        """Start a run now (``NAME/trigger-<time>``), under the overlap policy."""
        return self._schedule_client().trigger(name, **options)

    def describe_schedule(self, name: str) -> dict[str, Any] | None:
        """The schedule's definition and counters (None: no such schedule)."""
        return self._schedule_client().describe(name)

    def list_schedules(self) -> list[dict[str, Any]]:
        return self._schedule_client().list()
