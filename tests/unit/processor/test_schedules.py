"""Schedules on the test engine, with time skipping: a thousand fire times each started once,
the overlap policies, the catch-up window after downtime, pause/resume/trigger/delete, the
typed refusals, and the schedule kept across a restart and a takeover rebuilt from the
changelogs. The Kafka side is tests/integration/test_schedules_kafka.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_message
from engine.core.errors import (
    ScheduleAlreadyExistsError,
    ScheduleDefinitionError,
    ScheduleNotFoundError,
    ScheduleSpecError,
)
from engine.core.history import ExecutionStarted, RuntimeStatus
from engine.core.messages import CommandOutcome, StartWorkflow
from engine.core.schedules import run_id
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import PartitionProcessor
from engine.testing import TestEngine

registry = Registry()
T0 = datetime(2026, 3, 1, tzinfo=UTC)


@registry.workflow(name="report")
async def report(ctx: WorkflowContext, what: str) -> str:
    return f"report {what}"


@registry.workflow(name="slow-report")
async def slow_report(ctx: WorkflowContext, seconds: float) -> str:
    await ctx.sleep(seconds)
    return "done"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=3, start=T0) as engine:
        yield engine


def _described(env: TestEngine, name: str) -> dict[str, Any]:
    found = env.describe_schedule(name)
    assert found is not None
    return found


def _run_starts(env: TestEngine) -> Counter[str]:
    """How often each run id's start was sent (instance-messages), over the whole test."""
    starts: Counter[str] = Counter()
    for record in env.records("instance-messages"):
        assert record.value is not None
        message = decode_message(record.value)
        if isinstance(message, StartWorkflow):
            starts[message.instance_id] += 1
    return starts


def _at(minutes: float) -> int:
    return int((T0 + timedelta(minutes=minutes)).timestamp() * 1000)


def test_a_thousand_fire_times_each_start_exactly_one_run(env: TestEngine) -> None:
    env.create_schedule("hourly", "report", "sales", every="1m", overlap="ALLOW_ALL")
    env.advance(timedelta(minutes=999))
    described = _described(env, "hourly")
    assert described["started"] == 1000
    assert described["skipped_overlap"] == described["skipped_missed"] == 0
    assert described["running"] == []
    expected = {run_id("hourly", _at(m)) for m in range(1000)}
    starts = _run_starts(env)
    assert set(starts) == expected
    assert set(starts.values()) == {1}
    for run in (run_id("hourly", _at(0)), run_id("hourly", _at(999))):
        state = env.get(run)
        assert state is not None and state.output == "report sales"
        assert state.tags == {"schedule": "hourly"}
        started = [e for e in env.history(run) if isinstance(e.body, ExecutionStarted)]
        assert len(started) == 1
    assert len(env.client.list_instances()) == 1000  # the schedule's row is not an instance


def test_skip_leaves_out_the_fire_times_while_a_run_runs(env: TestEngine) -> None:
    env.create_schedule("s", "slow-report", 150, every="1m", overlap="SKIP")
    env.advance(timedelta(minutes=5, seconds=30))
    # fire times 0..5: 0 runs to 2:30, so 1 and 2 are skipped; 3 runs to 5:30, 4 and 5 skipped
    described = _described(env, "s")
    assert described["started"] == 2
    assert described["skipped_overlap"] == 4
    assert set(_run_starts(env)) == {run_id("s", _at(0)), run_id("s", _at(3))}


def test_buffer_one_runs_one_waiting_fire_time_after_the_running_one(env: TestEngine) -> None:
    env.create_schedule("b", "slow-report", 140, every="1m", overlap="BUFFER_ONE")
    env.advance(timedelta(minutes=5, seconds=1))
    # 0 runs 0-2:20; 1 waits (2 is skipped) and runs 2:20-4:40; 3 waits (4 skipped), runs
    # from 4:40; 5 waits
    described = _described(env, "b")
    assert set(_run_starts(env)) == {run_id("b", _at(m)) for m in (0, 1, 3)}
    assert described["skipped_overlap"] == 2
    assert described["buffered_ms"] == _at(5)
    assert described["running"] == [run_id("b", _at(3))]
    started = env.get(run_id("b", _at(1)))
    assert started is not None and started.created == T0 + timedelta(minutes=2, seconds=20)


def test_allow_all_lets_runs_overlap(env: TestEngine) -> None:
    env.create_schedule("a", "slow-report", 150, every="1m", overlap="ALLOW_ALL")
    env.advance(timedelta(minutes=2))
    described = _described(env, "a")
    assert len(described["running"]) == described["running_count"] == 3


def test_after_downtime_only_the_fire_times_inside_the_catch_up_window_run(env: TestEngine) -> None:
    env.create_schedule("c", "report", "x", every="1m", catch_up_window="5m", overlap="ALLOW_ALL")
    env.run()
    env.clock.advance_to(_at(30))  # the processors were down for 30 minutes
    env.run()
    described = _described(env, "c")
    caught_up = {run_id("c", _at(m)) for m in range(25, 31)}
    assert set(_run_starts(env)) == {run_id("c", _at(0))} | caught_up
    assert described["skipped_missed"] == 24  # the fire times 1..24 were older than 5 minutes
    assert described["next_fire_ms"] == _at(31)


def test_catch_up_follows_the_overlap_policy(env: TestEngine) -> None:
    env.create_schedule("k", "slow-report", 600, every="1m", catch_up_window="10m")
    env.run()
    env.clock.advance_to(_at(0.5))
    env.run()
    env.clock.advance_to(_at(20))
    env.run()
    described = _described(env, "k")
    # fire time 0 runs (to 10:00, which is in the past now: it ends in this wait too)
    assert described["skipped_missed"] == 9  # 1..9
    assert described["started"] + described["skipped_overlap"] == 12  # 0 and 10..20


def test_a_cron_schedule_fires_at_its_minutes(env: TestEngine) -> None:
    env.create_schedule("q", "report", "q", cron="15,45 * * * *")
    env.advance(timedelta(hours=2))
    expected = {run_id("q", _at(m)) for m in (15, 45, 75, 105)}
    assert set(_run_starts(env)) == expected


def test_start_and_end_bound_the_fire_times(env: TestEngine) -> None:
    env.create_schedule(
        "w",
        "report",
        "w",
        every="10m",
        start_at=T0 + timedelta(minutes=30),
        end_at=T0 + timedelta(minutes=50),
    )
    env.advance(timedelta(hours=3))
    assert set(_run_starts(env)) == {run_id("w", _at(m)) for m in (30, 40, 50)}
    assert _described(env, "w")["next_fire_ms"] == 0


def test_pause_resume_and_trigger(env: TestEngine) -> None:
    env.create_schedule("p", "report", "p", every="1m")
    env.advance(timedelta(minutes=2))
    env.pause_schedule("p", "maintenance")
    paused = _described(env, "p")
    assert (paused["state"], paused["note"], paused["next_fire_ms"]) == ("PAUSED", "maintenance", 0)
    env.advance(timedelta(minutes=10))
    assert _described(env, "p")["started"] == 3
    outcome = env.trigger_schedule("p")
    assert outcome is not None and "started p/trigger-" in outcome.reason
    env.run()
    env.resume_schedule("p")
    env.advance(timedelta(minutes=2))
    assert _described(env, "p")["started"] == 7  # 0, 1, 2, the trigger, 12, 13, 14
    assert run_id("p", _at(12), triggered=True) in _run_starts(env)


def test_delete_removes_the_schedule_and_its_timer(env: TestEngine) -> None:
    env.create_schedule("d", "slow-report", 90, every="1m")
    env.advance(timedelta(seconds=30))
    env.delete_schedule("d")
    assert env.describe_schedule("d") is None
    env.advance(timedelta(minutes=5))
    assert set(_run_starts(env)) == {run_id("d", _at(0))}
    first = env.get(run_id("d", _at(0)))
    assert first is not None and first.status is RuntimeStatus.COMPLETED  # ran on its own
    env.create_schedule("d", "report", "again", every="1m")  # the name is free again


def test_refusals_are_typed(env: TestEngine) -> None:
    env.create_schedule("r", "report", "r", every="1m")
    with pytest.raises(ScheduleAlreadyExistsError, match="exists already"):
        env.create_schedule("r", "report", "r", every="5m")
    for op in (env.pause_schedule, env.resume_schedule, env.delete_schedule):
        with pytest.raises(ScheduleNotFoundError, match="no schedule 'nope'"):
            op("nope")
    with pytest.raises(ScheduleDefinitionError, match="rows of schedules"):
        env.start("report", "x", instance_id="~schedules/r")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cron": "*/5 * * *"}, "has 4 fields"),
        ({"cron": "0 25 * * *"}, "outside the hour"),
        ({"every": "5 minutes"}, "not a duration"),
        ({"every": "500ms"}, "below 1s"),
        ({}, "exactly one of"),
        ({"cron": "* * * * *", "every": "1m"}, "exactly one of"),
        ({"every": "1m", "overlap": "SOMETIMES"}, "not one of"),
    ],
)
def test_a_bad_definition_is_refused_before_anything_is_sent(
    env: TestEngine, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ScheduleSpecError, match=match):
        env.create_schedule("bad", "report", **options)
    with pytest.raises(ScheduleSpecError, match="not usable"):
        env.create_schedule("bad/name", "report", every="1m")
    assert env.records("commands") == []


def test_a_repeated_create_is_answered_once(env: TestEngine) -> None:
    first = env.create_schedule("once", "report", "x", every="1m", request_id="req-1")
    again = env.create_schedule("once", "report", "x", every="1m", request_id="req-1")
    assert first is not None and again is not None
    assert again.duplicate and again.result is first.result


def _rebuild_from_changelogs(env: TestEngine) -> None:
    """Every partition rebuilt from its changelog topics alone (a takeover)."""
    stores = {p: MemoryPartitionStore() for p in env.processors}
    for topic in ("state-changelog", "timer-changelog"):
        for record in env.records(topic):
            assert record.key is not None
            stores[record.partition].write({record.key: record.value})
    for p, old in list(env.processors.items()):
        env.processors[p] = PartitionProcessor(p, stores[p], old.env)


def test_the_schedule_survives_a_restart_and_a_takeover(env: TestEngine) -> None:
    env.create_schedule("t", "slow-report", 90, every="1m", overlap="BUFFER_ONE")
    env.advance(timedelta(minutes=1, seconds=10))
    env.deploy(registry)  # the processors forget their hot rows
    env.advance(timedelta(minutes=1))
    _rebuild_from_changelogs(env)
    env.advance(timedelta(minutes=5))
    starts = _run_starts(env)
    assert set(starts.values()) == {1}
    described = _described(env, "t")
    assert described["started"] == len(starts)
    assert (
        described["started"] + described["skipped_overlap"] + bool(described["buffered_ms"]) == 8
    )  # fire times 0..7


def test_an_input_over_the_workflow_input_limit_is_refused() -> None:
    from engine.config.settings import Settings

    with TestEngine(registry, settings=Settings(max_workflow_input_bytes=100)) as small:
        with pytest.raises(ScheduleDefinitionError, match="max_workflow_input_bytes"):
            small.create_schedule("big", "report", "x" * 200, every="1m")
        assert small.describe_schedule("big") is None


def test_two_triggers_in_one_batch_start_one_run_and_say_so() -> None:
    with TestEngine(registry, partitions=3, start=T0) as env:
        env.create_schedule("t", "slow-report", 5, every="1h", start_at=T0 + timedelta(hours=1))
        first = env.trigger_schedule("t", wait=False, request_id="trigger-1")
        second = env.trigger_schedule("t", wait=False, request_id="trigger-2")
        assert first is None and second is None
        env.run()  # both commands in one batch, at the same time
        answers = {}
        for record in env.records("command-outcomes"):
            assert record.value is not None
            outcome = decode_message(record.value)
            assert isinstance(outcome, CommandOutcome)
            answers[outcome.request_id] = outcome.reason
        run = run_id("t", env.clock.now_ms(), triggered=True)
        assert answers["trigger-1"] == f"started {run}"
        assert answers["trigger-2"] == f"already started {run} by another trigger at the same time"
        assert _described(env, "t")["started"] == 1
        env.advance(timedelta(seconds=10))
        assert env.wait_for_completion(run).output == "done"
        assert _described(env, "t")["running"] == []  # nothing left that blocks later fire times
