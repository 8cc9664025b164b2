"""Heartbeats on the in-process engine with the real worker service: a missed heartbeat
times the attempt out, the retry resumes from the last details; heartbeats only write
memory (the Kafka side: tests/integration/test_heartbeats_kafka.py)."""

from __future__ import annotations

import pytest

from engine.codec import decode_message
from engine.core.activity_info import ActivityContext, AttemptControl, activity_scope
from engine.core.errors import ActivityCancelledError
from engine.core.messages import ActivityResult, ActivityTask
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import activity, default_registry
from engine.testing import TestEngine
from tests import heartbeat_workflows as hw


def _engine() -> TestEngine:
    """The processor's registry is the default one (the workflows); the worker runs the
    activities of ``hw.activities``."""
    return TestEngine(
        default_registry, activities={a.name: a.fn for a in hw.activities.activities()}
    )


def test_a_missed_heartbeat_retries_from_the_last_details() -> None:
    with _engine() as env:
        env.start("hb.count", 5, instance_id="c")
        final = env.wait_for_completion("c")
    assert final.output == {"attempt": 2, "resumed_from": 3}
    assert hw.observed["c"] == [("attempt", 1, "from", 0), ("attempt", 2, "from", 3)]


def test_a_sync_activity_that_misses_its_heartbeat_retries_from_the_last_details() -> None:
    with _engine() as env:
        env.start("hb.count_sync", 5, instance_id="s")
        final = env.wait_for_completion("s")
    assert final.output == {"attempt": 2, "resumed_from": 3}
    assert hw.observed["s"] == [("attempt", 1, "from", 0), ("attempt", 2, "from", 3)]


def test_heartbeats_cost_no_records() -> None:
    # 6 + 3 heartbeats over two attempts; only the two attempts' results are records
    with _engine() as env:
        env.start("hb.count", 6, instance_id="quiet")
        env.wait_for_completion("quiet")
        values = [decode_message(r.value) for r in env.records("activity-results") if r.value]
        results = [v for v in values if isinstance(v, ActivityResult)]
        tasks = [r for r in env.records("activity-tasks") if r.value]
    assert len(results) == len(values)
    assert [(r.instance_id, r.attempt) for r in results] == [("quiet", 1), ("quiet", 2)]
    assert results[0].failure is not None and results[0].details is not None
    assert from_payload(results[0].details) == {"at": 3}
    assert len(tasks) == 2


def test_heartbeats_keep_the_latest_details_and_raise_once_cancelled() -> None:
    control = AttemptControl()
    info = ActivityContext(ActivityTask("i", name="a"), control=control)
    with activity_scope(info):
        activity.heartbeat({"at": 1})
        activity.heartbeat()  # no details: the last ones stay
        assert from_payload(control.details) == {"at": 1} and control.beats == 2
        assert not activity.is_cancelled()
        control.cancel("the workflow stopped waiting")
        assert activity.is_cancelled()
        with pytest.raises(ActivityCancelledError, match="stopped waiting"):
            activity.heartbeat({"at": 2})


def test_the_next_attempt_sees_the_previous_details() -> None:
    task = ActivityTask("i", name="a", attempt=2, heartbeat_details=to_payload({"at": 7}))
    assert ActivityContext(task).heartbeat_details == {"at": 7}
    assert ActivityContext(ActivityTask("i", name="a")).heartbeat_details is None
