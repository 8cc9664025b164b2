"""A schedule notices its runs failing.

A run that parks (a bug, or a workflow name the processors do not know), a start that is
refused, or a run whose workflow is not registered (parking off) pauses its schedule with
the reason in its description, instead of letting the overlap policy skip every later
fire time behind it; ``schedule resume`` takes it back. The Kafka side is
tests/integration/test_schedules_kafka.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from engine import Registry, WorkflowContext
from engine.config.settings import Settings
from engine.core.history import RuntimeStatus
from engine.core.schedules import run_id
from engine.testing import TestEngine

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def build_registry(buggy: bool) -> Registry:
    registry = Registry()

    @registry.workflow(name="report")
    async def report(ctx: WorkflowContext, what: str) -> str:
        if buggy:
            raise KeyError("nmae")
        return f"report {what}"

    @registry.workflow(name="slow-report")
    async def slow_report(ctx: WorkflowContext, seconds: float) -> str:
        await ctx.sleep(seconds)
        return "done"

    return registry


def engine(buggy: bool = False, **settings: Any) -> TestEngine:
    return TestEngine(build_registry(buggy), partitions=3, start=T0, settings=Settings(**settings))


def _at(minutes: float) -> int:
    return int((T0 + timedelta(minutes=minutes)).timestamp() * 1000)


def _described(env: TestEngine, name: str) -> dict[str, Any]:
    found = env.describe_schedule(name)
    assert found is not None
    return found


def test_a_run_that_parks_pauses_its_schedule_until_it_is_resumed() -> None:
    with engine(buggy=True) as env:
        env.create_schedule("daily", "report", "sales", every="1m")
        env.advance(timedelta(seconds=30))
        first = run_id("daily", _at(0))
        assert env.get(first) is not None and env.get(first).status is RuntimeStatus.PARKED  # type: ignore[union-attr]
        described = _described(env, "daily")
        assert described["state"] == "PAUSED" and described["next_fire_ms"] == 0
        assert "PARKED" in described["note"] and first in described["note"]
        assert "KeyError" in described["note"] and "schedule resume daily" in described["note"]
        env.advance(timedelta(minutes=5))
        assert _described(env, "daily")["started"] == 1  # no fire time skipped behind it silently
        env.deploy(build_registry(buggy=False))
        env.retry(first)
        assert env.wait_for_completion(first).output == "report sales"
        answer = env.resume_schedule("daily")
        assert answer is not None and "resumed" in answer.reason
        env.advance(timedelta(minutes=2))
        described = _described(env, "daily")
        assert (described["state"], described["note"]) == ("ACTIVE", "")
        assert described["started"] == 3 and described["running"] == []


def test_a_workflow_name_with_a_typo_pauses_the_schedule() -> None:
    with engine() as env:
        env.create_schedule("typo", "reprot", "x", every="1m")
        env.advance(timedelta(seconds=30))
        described = _described(env, "typo")
        assert described["state"] == "PAUSED" and "NotRegisteredError" in described["note"]


def test_an_unregistered_workflow_pauses_the_schedule_with_parking_off() -> None:
    with engine(park_workflow_errors=False) as env:
        env.create_schedule("typo", "reprot", "x", every="1m")
        env.advance(timedelta(seconds=30))
        state = env.get(run_id("typo", _at(0)))
        assert state is not None and state.status is RuntimeStatus.FAILED
        described = _described(env, "typo")
        assert described["state"] == "PAUSED" and "did not start" in described["note"]
        assert described["running"] == []


def test_a_refused_start_pauses_the_schedule() -> None:
    with engine() as env:
        taken = run_id("clash", _at(1))
        env.start("report", "earlier", instance_id=taken)  # the run id of fire time 1 already ran
        env.run()
        env.create_schedule("clash", "report", "x", every="1m")
        env.advance(timedelta(minutes=1, seconds=30))
        described = _described(env, "clash")
        assert described["state"] == "PAUSED"
        assert "did not start" in described["note"] and taken in described["note"]
        assert "REJECT_DUPLICATE" in described["note"]
