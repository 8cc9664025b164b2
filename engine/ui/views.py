"""What the dashboard shows, as plain data: filtered pages of instances (the filter and
the paging are ``engine.services.client.listing``, shared with the client and the CLI) and
an instance's pending work read off its history. Pure functions, so they are tested
without a broker."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from engine.core.errors import ConfigurationError
from engine.core.history import (
    ActivityCancelRequested,
    ChildWorkflowCompleted,
    ChildWorkflowCreated,
    ChildWorkflowFailed,
    ContinuedAsNew,
    HistoryEvent,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCancelled,
    TimerCreated,
    TimerFired,
)
from engine.core.messages import InstanceStatus
from engine.services.client.listing import InstanceFilter, PageCollector

__all__ = ["MAX_PAGE", "InstanceFilter", "Page", "filter_from_query", "pending_work", "select"]

#: The largest page the dashboard serves; a bigger ``limit`` is refused, not silently cut.
MAX_PAGE = 500


def filter_from_query(query: Mapping[str, str]) -> InstanceFilter:
    """Parse URL query parameters; bad values raise ConfigurationError saying the fix."""
    statuses = frozenset(_status(s) for s in query.get("status", "").split(",") if s)
    tags: tuple[tuple[str, str], ...] = ()
    if query.get("tag"):
        key, sep, value = query["tag"].partition("=")
        if not sep or not key:
            raise ConfigurationError(f"tag filter {query['tag']!r}: write it as key=value")
        tags = ((key, value),)
    return InstanceFilter(
        statuses=statuses,
        name=query.get("name", "").strip(),
        version=query.get("version", "").strip(),
        tags=tags,
        created_after_ms=_time_ms(query.get("created_after", ""), "created_after"),
        created_before_ms=_time_ms(query.get("created_before", ""), "created_before"),
    )


def _status(text: str) -> RuntimeStatus:
    try:
        return RuntimeStatus(text.strip().upper())
    except ValueError:
        known = ", ".join(s.value for s in RuntimeStatus)
        raise ConfigurationError(f"unknown status {text!r}; use one of {known}") from None


def _time_ms(text: str, name: str) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text.strip()).timestamp() * 1000)
    except ValueError:
        raise ConfigurationError(
            f"{name} {text!r} is not a time; write it as ISO 8601 (2026-01-31T12:00:00+00:00)"
        ) from None


@dataclass(frozen=True)
class Page:
    """One page of matching instances, newest first, and the counts shown above it."""

    items: list[InstanceStatus]
    total: int
    limit: int
    #: instances per status among those the other filters pick (the status filter aside)
    by_status: dict[str, int]
    #: where the next page starts (None: this is the last page)
    next_page_token: str | None


def select(
    statuses: Iterable[InstanceStatus],
    wanted: InstanceFilter,
    limit: int,
    page_token: str | None = None,
) -> Page:
    """The instances ``wanted`` picks, newest first, after ``page_token``, at most
    ``limit``; one pass that holds one page (``listing.PageCollector``) and the counts."""
    if not 1 <= limit <= MAX_PAGE:
        raise ConfigurationError(f"limit {limit} is out of range; ask for 1 to {MAX_PAGE}")
    any_status = replace(wanted, statuses=frozenset())
    collector = PageCollector(wanted, limit, page_token)
    by_status: dict[str, int] = {}
    total = 0
    for s in statuses:
        if any_status.matches(s):
            by_status[s.status.value] = by_status.get(s.status.value, 0) + 1
            if not wanted.statuses or s.status in wanted.statuses:
                total += 1
                collector.add(s)
    page = collector.page()
    return Page(page.items, total, limit, by_status, page.next_page_token)


def pending_work(events: Sequence[HistoryEvent]) -> dict[str, list[dict[str, Any]]]:
    """The current run's activities and timers still open, and every child with its state.

    Only events of the latest generation count: continuing as new starts with nothing open.
    """
    generation = max((e.generation for e in events), default=0)
    current = [e for e in events if e.generation == generation]
    tasks: dict[int, dict[str, Any]] = {}
    timers: dict[int, dict[str, Any]] = {}
    children: dict[int, dict[str, Any]] = {}
    for event in current:
        _fold(event, tasks, timers, children)
    return {
        "activities": list(tasks.values()),
        "timers": list(timers.values()),
        "children": list(children.values()),
    }


def _fold(
    event: HistoryEvent,
    tasks: dict[int, dict[str, Any]],
    timers: dict[int, dict[str, Any]],
    children: dict[int, dict[str, Any]],
) -> None:
    body = event.body
    if isinstance(body, TaskScheduled):
        tasks[body.task_id] = {
            "task_id": body.task_id,
            "name": body.name,
            "attempt": body.attempt,
            "scheduled_ms": event.timestamp_ms,
        }
    elif isinstance(body, TaskCompleted | TaskFailed | ActivityCancelRequested):
        tasks.pop(body.task_id, None)
    elif isinstance(body, TimerCreated):
        timers[body.task_id] = {"task_id": body.task_id, "fire_at_ms": body.fire_at_ms}
    elif isinstance(body, TimerFired | TimerCancelled):
        timers.pop(body.task_id, None)
    elif isinstance(body, ChildWorkflowCreated):
        children[body.task_id] = {
            "task_id": body.task_id,
            "name": body.name,
            "instance_id": body.instance_id,
            "state": "RUNNING",
        }
    elif isinstance(body, ChildWorkflowCompleted | ChildWorkflowFailed):
        child = children.get(body.task_id)
        if child is not None:
            child["state"] = "COMPLETED" if isinstance(body, ChildWorkflowCompleted) else "FAILED"
    elif isinstance(body, ContinuedAsNew):
        tasks.clear()
        timers.clear()
