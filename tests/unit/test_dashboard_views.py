"""The dashboard's pure logic: filters, paging, and open work read off a history."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.errors import ConfigurationError
from engine.core.failure import FailureDetails
from engine.core.history import (
    ChildWorkflowCompleted,
    ChildWorkflowCreated,
    ContinuedAsNew,
    EventBody,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCreated,
    TimerFired,
)
from engine.core.messages import InstanceStatus
from engine.services.client.listing import InstanceFilter
from engine.ui.views import MAX_PAGE, filter_from_query, pending_work, select


def _status(i: int, **kw: object) -> InstanceStatus:
    base: dict[str, object] = {
        "instance_id": f"i{i}",
        "name": "w",
        "status": RuntimeStatus.RUNNING,
        "created_ms": 1000 + i,
    }
    base.update(kw)
    return InstanceStatus(**base)  # type: ignore[arg-type]


def test_filters_by_status_name_version_tag_and_time() -> None:
    rows = [
        _status(1, name="a", version="1", tags={"team": "x"}),
        _status(2, name="a", version="2", status=RuntimeStatus.COMPLETED),
        _status(3, name="b", tags={"team": "y"}, status=RuntimeStatus.FAILED),
    ]

    def ids(query: dict[str, str]) -> list[str]:
        wanted = filter_from_query(query)
        return [s.instance_id for s in select(rows, wanted, 50).items]

    assert ids({}) == ["i3", "i2", "i1"]  # newest first
    assert ids({"name": "a"}) == ["i2", "i1"]
    assert ids({"name": "a", "version": "2"}) == ["i2"]
    assert ids({"status": "completed,failed"}) == ["i3", "i2"]
    assert ids({"tag": "team=x"}) == ["i1"]
    assert ids({"created_after": "1970-01-01T00:00:01.002+00:00"}) == ["i3", "i2"]
    assert ids({"created_before": "1970-01-01T00:00:01.002+00:00"}) == ["i1"]
    page = select(rows, filter_from_query({"name": "a", "status": "running"}), 50)
    assert [s.instance_id for s in page.items] == ["i1"]
    assert page.by_status == {"RUNNING": 1, "COMPLETED": 1}  # counts ignore the status filter


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"status": "sleepy"}, "unknown status 'sleepy'; use one of PENDING"),
        ({"tag": "team"}, "write it as key=value"),
        ({"created_after": "yesterday"}, "write it as ISO 8601"),
    ],
)
def test_bad_filters_say_how_to_write_them(query: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        filter_from_query(query)


def test_paging_bounds_are_refused_not_clamped() -> None:
    with pytest.raises(ConfigurationError, match=f"1 to {MAX_PAGE}"):
        select([], InstanceFilter(), 0)
    with pytest.raises(ConfigurationError, match=f"1 to {MAX_PAGE}"):
        select([], InstanceFilter(), MAX_PAGE + 1)


@given(st.integers(0, 40), st.integers(1, 20))
def test_pages_cover_every_match_once(count: int, limit: int) -> None:
    rows = [_status(i) for i in range(count)]
    everything = []
    token = None
    while True:
        page = select(rows, InstanceFilter(), limit, token)
        assert page.total == count
        assert len(page.items) <= limit
        everything += page.items
        token = page.next_page_token
        if token is None:
            break
    assert [s.instance_id for s in everything] == [f"i{i}" for i in reversed(range(count))]


def _events(*bodies: tuple[int, EventBody]) -> list[HistoryEvent]:
    return [
        HistoryEvent("i", seq, 1000 + seq, generation, body)
        for seq, (generation, body) in enumerate(bodies, 1)
    ]


def test_pending_work_lists_open_tasks_timers_and_children() -> None:
    failure = FailureDetails("E", "boom")
    events = _events(
        (0, ExecutionStarted("w")),
        (0, TaskScheduled(1, "a")),
        (0, TaskScheduled(2, "b")),
        (0, TaskCompleted(1)),
        (0, TaskScheduled(3, "c")),
        (0, TaskFailed(3, failure)),
        (0, TimerCreated(4, 5000)),
        (0, TimerCreated(5, 6000)),
        (0, TimerFired(4, 5000)),
        (0, ChildWorkflowCreated(6, "kid", "i:6")),
        (0, ChildWorkflowCreated(7, "kid", "i:7")),
        (0, ChildWorkflowCompleted(7)),
    )
    work = pending_work(events)
    assert [a["task_id"] for a in work["activities"]] == [2]
    assert [t["task_id"] for t in work["timers"]] == [5]
    assert [(c["instance_id"], c["state"]) for c in work["children"]] == [
        ("i:6", "RUNNING"),
        ("i:7", "COMPLETED"),
    ]


def test_pending_work_counts_only_the_latest_generation() -> None:
    events = _events(
        (0, ExecutionStarted("w")),
        (0, TaskScheduled(1, "a")),
        (0, ContinuedAsNew(new_generation=1)),
        (1, ExecutionStarted("w")),
        (1, TimerCreated(1, 9000)),
    )
    work = pending_work(events)
    assert work["activities"] == []
    assert [t["fire_at_ms"] for t in work["timers"]] == [9000]
