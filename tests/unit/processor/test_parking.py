"""Parking: a bug in workflow code (or an unregistered workflow) parks the instance instead
of failing it; a fix deployed later runs it on from where it stood, with every event that
arrived meanwhile. Deliberate failures still fail. All on the in-process test engine."""

from __future__ import annotations

import copy
import io
from typing import Any

import fastavro
import pytest

from engine import ApplicationError, Registry, WorkflowContext
from engine.codec.wire import current_schema
from engine.config.settings import Settings
from engine.core.errors import (
    ActivityFailedError,
    CodecError,
    NonDeterminismError,
    NotRegisteredError,
    StepBudgetExceededError,
    WaitTimeoutError,
)
from engine.core.failure import FailureDetails
from engine.core.history import ExecutionCompleted, RuntimeStatus, TurnStarted
from engine.core.instance_row import InstanceRow, Parked
from engine.services.processor import keys, parking
from engine.services.processor.meta import decode_meta, encode_meta
from engine.testing import TestEngine


class Rejected(Exception):
    pass


def build_registry(buggy: bool) -> Registry:
    """The same workflows before and after a fix is deployed."""
    registry = Registry()

    @registry.workflow(name="greet")
    async def greet(ctx: WorkflowContext, data: dict[str, Any]) -> str:
        if buggy:
            return str(data["nmae"])  # the bug: a typo
        return f"hello {data['name']}"

    @registry.workflow(name="two_events")
    async def two_events(ctx: WorkflowContext, _: Any) -> list[Any]:
        first = await ctx.wait_for_event("a")
        if buggy:
            raise AttributeError("'NoneType' object has no attribute 'x'")
        return [first, await ctx.wait_for_event("b")]

    @registry.workflow(name="refuse", failure_types=(Rejected,))
    async def refuse(ctx: WorkflowContext, kind: str) -> None:
        if kind == "application":
            raise ApplicationError("declined", type="Declined")
        raise Rejected("not today")

    return registry


def engine(*, park: bool = True) -> TestEngine:
    return TestEngine(build_registry(buggy=True), settings=Settings(park_workflow_errors=park))


def parked(env: TestEngine, instance_id: str) -> Parked | None:
    """The parked state as the instance row in the partition's table holds it."""
    pp = env.processors[env.partition_of(instance_id)]
    row = pp.tables.store.get(keys.meta_key(instance_id))
    assert row is not None
    return decode_meta(row).parked


def park_timers(env: TestEngine, instance_id: str) -> list[keys.TimerKey]:
    pp = env.processors[env.partition_of(instance_id)]
    return [t for t in pp.tables.timers_of(instance_id) if t.task_id == parking.PARK_TIMER]


def completions(env: TestEngine, instance_id: str) -> list[ExecutionCompleted]:
    return [e.body for e in env.history(instance_id) if isinstance(e.body, ExecutionCompleted)]


def test_a_bug_on_the_first_turn_parks_and_a_fix_completes_it() -> None:
    with engine() as env:
        run = env.start("greet", {"name": "ann"})
        env.run()
        assert env.history(run) == []  # nothing of the failed turn is recorded
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.PARKED
        first = parked(env, run)
        assert first is not None and first.failure.type == "KeyError" and first.attempts == 1
        assert [t.fire_at_ms for t in park_timers(env, run)] == [first.retry_at_ms]
        env.advance(1.0)  # the retry with the same code parks it again, 2 s later
        second = parked(env, run)
        assert second is not None and second.attempts == 2
        assert second.retry_at_ms == first.retry_at_ms + 2000
        env.deploy(build_registry(buggy=False))
        assert env.wait_for_completion(run).output == "hello ann"  # the timer runs the fix
        events = env.history(run)
        assert [e.sequence for e in events] == list(range(len(events)))
        assert parked(env, run) is None and park_timers(env, run) == []


def test_events_that_arrive_while_parked_are_applied_after_the_fix() -> None:
    with engine() as env:
        run = env.start("two_events")
        env.run()
        recorded = len(env.history(run))
        assert recorded > 0
        env.raise_event(run, "a", 1)
        env.run()
        assert len(env.history(run)) == recorded and parked(env, run) is not None
        env.raise_event(run, "b", 2)
        env.run()
        kept = parked(env, run)
        assert kept is not None and len(kept.inbox) == 2 and kept.attempts == 1
        env.deploy(build_registry(buggy=False))
        env.retry(run)  # turnstile retry: at once, not at the next scheduled retry
        env.run()
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.COMPLETED
        assert state.output == [1, 2]
        assert env.history(run)[recorded].sequence == recorded
        assert park_timers(env, run) == []


def test_an_unregistered_workflow_parks_until_it_is_deployed() -> None:
    with engine() as env:
        run = env.start("not_deployed_yet")
        env.run()
        state = parked(env, run)
        assert state is not None and state.failure.type == "NotRegisteredError"
        fixed = build_registry(buggy=False)

        @fixed.workflow(name="not_deployed_yet")
        async def later(ctx: WorkflowContext) -> str:
            return "deployed"

        env.deploy(fixed)
        env.retry(run)
        assert env.wait_for_completion(run).output == "deployed"


@pytest.mark.parametrize(("kind", "failure_type"), [("application", "Declined"), ("x", "Rejected")])
def test_deliberate_failures_still_fail(kind: str, failure_type: str) -> None:
    with engine() as env:
        run = env.start("refuse", kind)
        state = env.wait_for_completion(run)
        assert state.status is RuntimeStatus.FAILED
        assert state.failure is not None and state.failure.type == failure_type
        assert parked(env, run) is None


def test_a_parked_instance_can_be_terminated() -> None:
    with engine() as env:
        run = env.start("two_events")
        env.raise_event(run, "a", 1)
        env.run()
        assert parked(env, run) is not None
        env.terminate(run, "giving up")
        state = env.wait_for_completion(run)
        assert state.status is RuntimeStatus.TERMINATED
        assert parked(env, run) is None and park_timers(env, run) == []


def test_an_instance_parked_on_its_first_turn_can_be_terminated() -> None:
    with engine() as env:
        run = env.start("greet", {"name": "ann"})
        env.run()
        env.terminate(run, "giving up")
        assert env.wait_for_completion(run).status is RuntimeStatus.TERMINATED
        (completed,) = completions(env, run)
        assert completed.status is RuntimeStatus.TERMINATED


def test_with_parking_off_a_bug_fails_the_instance() -> None:
    with engine(park=False) as env:
        run = env.start("greet", {"name": "ann"})
        state = env.wait_for_completion(run)
        assert state.status is RuntimeStatus.FAILED and state.failure is not None
        assert state.failure.type == "KeyError"
        assert parked(env, run) is None


def test_a_parked_instance_waits_for_its_fix_without_busy_retries() -> None:
    """Backoff doubles to five minutes: an hour of engine time is a few dozen attempts."""
    with engine() as env:
        run = env.start("greet", {"name": "ann"})
        with pytest.raises(WaitTimeoutError, match="still PARKED"):
            env.wait_for_completion(run, timeout=3600)
        state = parked(env, run)
        assert state is not None and 10 < state.attempts < 30
        assert len(park_timers(env, run)) == 1


# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        KeyError("nmae"),
        AttributeError("x"),
        TypeError("bad call"),
        NotRegisteredError("no workflow"),
        NonDeterminismError(3, "a timer", "an activity"),
    ],
)
def test_what_new_code_can_fix_parks(error: BaseException) -> None:
    assert parking.should_park(error, ())


@pytest.mark.parametrize(
    "error",
    [
        ApplicationError("declined"),
        ActivityFailedError(FailureDetails("X", "x")),
        CodecError("unreadable input"),
        StepBudgetExceededError("loops"),
        Rejected("declared"),
    ],
)
def test_deliberate_errors_and_engine_limits_fail(error: BaseException) -> None:
    assert not parking.should_park(error, (Rejected,))


# --- the row ----------------------------------------------------------------------------------


def test_the_parked_state_round_trips_in_the_avro_row() -> None:
    kept = [b"\xc3\x01" + b"x" * 12]
    row = InstanceRow("p", parked=Parked(3, 1234, FailureDetails("KeyError", "nmae"), kept))
    assert decode_meta(encode_meta(row)) == row
    assert decode_meta(encode_meta(InstanceRow("q"))).parked is None


def test_rows_written_without_the_parked_field_read_as_not_parked() -> None:
    """Old rows lack the field; Avro resolution fills its default (null)."""
    current = copy.deepcopy(current_schema("InstanceRow").raw)  # Command read in by name
    old = copy.deepcopy(current)
    old["fields"] = [f for f in old["fields"] if f["name"] != "parked"]
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(old), _minimal_row())
    out.seek(0)
    read = fastavro.schemaless_reader(
        out, fastavro.parse_schema(old), fastavro.parse_schema(current)
    )
    assert isinstance(read, dict) and read["parked"] is None


def _minimal_row() -> dict[str, Any]:
    return {"instance_id": "old", "scheduled_start": None, "status": "RUNNING", "last_hash": b""}


def test_kept_events_survive_the_row() -> None:
    """What a parked instance keeps is re-read as the same inbound events."""
    with engine() as env:
        run = env.start("two_events")
        env.raise_event(run, "a", 1)
        env.run()
        state = parked(env, run)
        assert state is not None
        pp = env.processors[env.partition_of(run)]
        pp.cache.clear()  # a restart: the next turn reads the row
        env.deploy(build_registry(buggy=False))
        env.retry(run)
        env.raise_event(run, "b", 2)
        assert env.wait_for_completion(run).output == [1, 2]
        assert any(isinstance(e.body, TurnStarted) for e in env.history(run))
