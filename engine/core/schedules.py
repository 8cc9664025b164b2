"""Schedules: what a schedule is and what it decides at each fire time, pure.

A schedule starts a workflow at every fire time of a cron expression or a fixed interval. It is
the engine's own state, kept in the row of a reserved id (:func:`schedule_id`, on the one
partition that owns it) and driven by that partition's durable timers, so it survives
restarts and takeovers. Each fire time starts at most one run, under a deterministic instance
id (:func:`run_id`: the schedule's name and the fire time) with the REJECT_DUPLICATE
policy, so a fire time handled twice can never start two runs. The runs are started as
children of the schedule's row: each run's end comes back to it as a child result, which
is how the overlap policy knows whether a run still runs. The functions here decide; the
processor (``services/processor/schedules.py``) moves the messages and the timers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from enum import StrEnum

from engine.core.cron import parse_cron
from engine.core.errors import ScheduleSpecError
from engine.core.payloads import Payload

#: Ids of the rows that hold schedules; user instance ids may not use it.
SCHEDULE_PREFIX = "~schedules/"
#: Schedule names: they become part of instance ids and CLI arguments.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
#: Fire times one timer may look at before it counts the rest as missed without looking
#: (an every-minute cron after a year of downtime would otherwise take a while).
MAX_FIRE_TIMES_PER_TIMER = 10_000
DEFAULT_CATCH_UP_WINDOW_MS = 3600 * 1000
#: Running runs a description names (the newest; ``running_count`` counts them all).
_DESCRIBED_RUNS = 100


class OverlapPolicy(StrEnum):
    """What a fire time does while the schedule's previous run still runs."""

    #: The fire time is skipped (and counted).
    SKIP = "SKIP"
    #: The fire time waits and starts when the running run ends; at most one waits, further
    #: fire times are skipped.
    BUFFER_ONE = "BUFFER_ONE"
    #: Every fire time starts a run, however many still run.
    ALLOW_ALL = "ALLOW_ALL"


class ScheduleOp(StrEnum):
    """What a :class:`engine.core.messages.ScheduleCommand` asks."""

    CREATE = "CREATE"
    PAUSE = "PAUSE"
    RESUME = "RESUME"
    DELETE = "DELETE"
    TRIGGER = "TRIGGER"


@dataclass(slots=True)
class ScheduleSpec:
    """What the user asked for: when, what to start, and how runs may overlap."""

    workflow: str = ""
    #: A five-field cron expression (in ``timezone``), or "" for an interval schedule.
    cron: str = ""
    #: The interval of an interval schedule (ms; fire times at start_at + k * every).
    every_ms: int = 0
    version: str = ""
    input: Payload | None = None
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    #: Missed fire times younger than this still run after downtime; older ones are skipped.
    catch_up_window_ms: int = DEFAULT_CATCH_UP_WINDOW_MS
    #: No fire time before this / after this (epoch ms; 0: no bound).
    start_at_ms: int = 0
    end_at_ms: int = 0
    #: The IANA time zone whose wall clock the cron expression reads (``Europe/Paris``);
    #: resolved by the service layer (``engine/services/time_zones.py``), not here.
    timezone: str = "UTC"


@dataclass(slots=True)
class ScheduleState:
    """A schedule as its row holds it: the spec and what happened so far."""

    spec: ScheduleSpec = field(default_factory=ScheduleSpec)
    paused: bool = False
    #: Why it was paused (or "").
    note: str = ""
    created_ms: int = 0
    #: The fire time the schedule's timer is set for (0: none left).
    next_fire_ms: int = 0
    #: Ids of the runs it started that have not ended (the overlap policy looks here).
    running: list[str] = field(default_factory=list)
    #: A fire time that waits for the running run to end (BUFFER_ONE; 0: none).
    buffered_ms: int = 0
    started: int = 0
    #: Fire times skipped because a run still ran (SKIP, or BUFFER_ONE with one waiting).
    skipped_overlap: int = 0
    #: Fire times skipped because they were older than the catch-up window when handled.
    skipped_missed: int = 0
    last_fire_ms: int = 0
    last_run_id: str = ""


class Decision(StrEnum):
    START = "START"
    BUFFER = "BUFFER"
    SKIP = "SKIP"


def schedule_id(name: str) -> str:
    """The reserved id whose row holds the schedule ``name``."""
    return f"{SCHEDULE_PREFIX}{name}"


def schedule_name(row_id: str) -> str:
    return row_id.removeprefix(SCHEDULE_PREFIX)


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ScheduleSpecError(
            f"schedule name {name!r} is not usable: use 1-200 letters, digits, '.', '_' or "
            f"'-', starting with a letter or digit (it becomes part of run ids)"
        )
    return name


def check_spec(spec: ScheduleSpec) -> ScheduleSpec:
    """The spec if it can run; :class:`ScheduleSpecError` saying what to fix otherwise."""
    if not spec.workflow:
        raise ScheduleSpecError("a schedule needs the workflow it starts (--workflow NAME)")
    if bool(spec.cron) == bool(spec.every_ms):
        raise ScheduleSpecError(
            "give a schedule exactly one of a cron expression (--cron '*/5 * * * *') or an "
            "interval (--every 30s)"
        )
    if spec.cron:
        parse_cron(spec.cron)
    if spec.every_ms < 0 or 0 < spec.every_ms < 1000:
        raise ScheduleSpecError(f"interval {spec.every_ms} ms is below 1s; use at least 1s")
    if spec.catch_up_window_ms < 0:
        raise ScheduleSpecError("the catch-up window cannot be negative; use 0 to skip all")
    if spec.end_at_ms and spec.end_at_ms <= spec.start_at_ms:
        raise ScheduleSpecError("the schedule ends before it starts: end-at must be later")
    if spec.timezone != "UTC" and not spec.cron:
        raise ScheduleSpecError(
            "a time zone applies to a cron schedule; an interval runs every so many seconds "
            "wherever it is (leave out --timezone, or use --cron)"
        )
    OverlapPolicy(spec.overlap)
    return spec


def next_fire_time(spec: ScheduleSpec, after_ms: int, zone: tzinfo = UTC) -> int:
    """The first fire time strictly after ``after_ms`` (0: none, past ``end_at_ms``); ``zone``
    is ``spec.timezone`` resolved (the caller's job: it reads the tz database)."""
    if spec.every_ms:
        anchor = spec.start_at_ms
        if after_ms < anchor:
            fire = anchor
        else:
            fire = anchor + ((after_ms - anchor) // spec.every_ms + 1) * spec.every_ms
    else:
        fire = parse_cron(spec.cron).next_after(max(after_ms, spec.start_at_ms - 1), zone)
    if spec.end_at_ms and fire > spec.end_at_ms:
        return 0
    return fire


def run_id(name: str, fire_ms: int, *, triggered: bool = False) -> str:
    """The instance id of the run of ``name``'s fire time: ``NAME/2026-12-01T17:05:00Z`` (a
    trigger: ``NAME/trigger-...``), the same every time the fire time is handled."""
    when = datetime.fromtimestamp(fire_ms / 1000, UTC)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if fire_ms % 1000:
        text += f".{fire_ms % 1000:03d}"
    return f"{name}/{'trigger-' if triggered else ''}{text}Z"


@dataclass(frozen=True, slots=True)
class DueFireTimes:
    """What a timer at ``now`` finds: the fire times to handle (in order), how many were
    missed past the catch-up window, and the next fire time after now (0: none)."""

    times: list[int]
    missed: int
    next_ms: int


def due_fire_times(
    spec: ScheduleSpec, first_ms: int, now_ms: int, zone: tzinfo = UTC
) -> DueFireTimes:
    """The fire times from ``first_ms`` up to ``now_ms``: those inside the catch-up window are
    handled, older ones are counted as missed (``zone``: as for :func:`next_fire_time`)."""
    floor = now_ms - spec.catch_up_window_ms
    times: list[int] = []
    missed = 0
    fire = first_ms
    if spec.every_ms and fire and fire < floor:  # jump over the missed ones at once
        skip = (floor - fire + spec.every_ms - 1) // spec.every_ms
        missed, fire = skip, fire + skip * spec.every_ms
        if spec.end_at_ms and fire > spec.end_at_ms:
            return DueFireTimes([], missed, 0)
    looked = 0
    while fire and fire <= now_ms:
        looked += 1
        if fire < floor:
            missed += 1
        else:
            times.append(fire)
        if looked >= MAX_FIRE_TIMES_PER_TIMER and not spec.every_ms:
            # counted no further: past the cap
            fire = next_fire_time(spec, max(fire, floor - 1), zone)
            continue
        fire = next_fire_time(spec, fire, zone)
    return DueFireTimes(times, missed, fire)


def decide(state: ScheduleState) -> Decision:
    """What a fire time does now, by the overlap policy and the runs still running."""
    if not state.running or state.spec.overlap is OverlapPolicy.ALLOW_ALL:
        return Decision.START
    if state.spec.overlap is OverlapPolicy.BUFFER_ONE and not state.buffered_ms:
        return Decision.BUFFER
    return Decision.SKIP


def describe(name: str, state: ScheduleState) -> dict[str, object]:
    """The schedule as plain JSON values (what ``schedule describe`` shows)."""
    spec = state.spec
    return {
        "name": name,
        "workflow": spec.workflow,
        "version": spec.version,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "every_ms": spec.every_ms,
        "overlap": spec.overlap.value,
        "catch_up_window_ms": spec.catch_up_window_ms,
        "start_at_ms": spec.start_at_ms,
        "end_at_ms": spec.end_at_ms,
        "paused": state.paused,
        "note": state.note,
        "created_ms": state.created_ms,
        "next_fire_ms": state.next_fire_ms,
        "running": state.running[-_DESCRIBED_RUNS:],  # the status record stays small
        "running_count": len(state.running),
        "buffered_ms": state.buffered_ms,
        "started": state.started,
        "skipped_overlap": state.skipped_overlap,
        "skipped_missed": state.skipped_missed,
        "last_fire_ms": state.last_fire_ms,
        "last_run_id": state.last_run_id,
    }


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration(text: str, what: str) -> int:
    """``30s``, ``5m``, ``1h``, ``2d``, ``500ms`` in ms; a clear error otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ScheduleSpecError(
            f"{what} {text!r} is not a duration: write a whole number and a unit, e.g. "
            f"30s, 5m, 1h, 2d or 500ms"
        )
    return int(match.group(1)) * _UNITS_MS[match.group(2)]
