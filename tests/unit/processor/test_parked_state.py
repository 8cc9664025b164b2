"""PARKED is a status of its own, and what a parked instance keeps is bounded.

An instance whose code raised a bug shows PARKED (status record, list filters, command
answers, the per-status counts behind the metrics gauge) with the error as its failure;
it leaves PARKED when a retry runs on, or when it is terminated. A parked instance keeps
the events that arrive for its retry, up to ``parked_events_max`` and
``parked_events_max_bytes``; past that, raised events go to dead letters and the instance
stays parked, while its own results and timers are always kept. The Kafka side is
tests/integration/test_parking_kafka.py."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_history, decode_message
from engine.config.settings import Settings, load_settings
from engine.core.errors import ConfigurationError, ParkedEventsFullError
from engine.core.history import RuntimeStatus
from engine.core.messages import CommandResult, InstanceStatus, RaiseEvent, ResetTarget
from engine.core.payloads import to_payload
from engine.services.audit.state import ProcessorTables, compare, fold_histories
from engine.services.processor import keys
from engine.services.processor.meta import decode_meta
from engine.testing import TestEngine


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

    @registry.workflow(name="timed")
    async def timed(ctx: WorkflowContext, _: Any) -> str:
        alarm = ctx.sleep(60)  # the timer runs while the instance is parked
        await ctx.wait_for_event("a")
        if buggy:
            raise KeyError("nmae")
        await alarm
        return "woke"

    return registry


def engine(**settings: Any) -> TestEngine:
    return TestEngine(build_registry(buggy=True), settings=Settings(**settings))


def status_of(env: TestEngine, instance_id: str) -> RuntimeStatus:
    state = env.get(instance_id)
    assert state is not None
    return state.status


def row_bytes(env: TestEngine, instance_id: str) -> int:
    pp = env.processors[env.partition_of(instance_id)]
    raw = pp.tables.store.get(keys.meta_key(instance_id))
    assert raw is not None
    return len(raw)


def kept(env: TestEngine, instance_id: str) -> list[str]:
    """The kinds of the events the parked instance keeps, in order."""
    pp = env.processors[env.partition_of(instance_id)]
    raw = pp.tables.store.get(keys.meta_key(instance_id))
    assert raw is not None
    parked = decode_meta(raw).parked
    assert parked is not None
    return [decode_history(event).body.KIND for event in parked.inbox]


def park_two_events(env: TestEngine) -> str:
    run = env.start("two_events")
    env.run()
    env.raise_event(run, "a", 1)
    env.run()
    assert status_of(env, run) is RuntimeStatus.PARKED
    return run


# --- the status --------------------------------------------------------------------------------


def test_a_parked_instance_shows_parked_with_its_reason() -> None:
    with engine() as env:
        pp = env.processors[0]
        pp.count_statuses()
        run = env.start("greet", {"name": "ann"})
        env.run()
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.PARKED
        assert state.failure is not None and state.failure.type == "KeyError"
        assert "attempt 1" in state.pending_reason and "turnstile retry" in state.pending_reason
        assert [s.instance_id for s in env.client.list_instances(status=RuntimeStatus.PARKED)]
        assert env.client.list_instances(status=RuntimeStatus.RUNNING) == []
        assert pp.statuses is not None and pp.statuses.snapshot() == {RuntimeStatus.PARKED: 1}
        assert pp.statuses.versions() == {("greet", ""): 1}  # still open: its code must stay
        env.deploy(build_registry(buggy=False))
        assert env.wait_for_completion(run).output == "hello ann"
        counts = pp.statuses.snapshot()
        assert (counts[RuntimeStatus.PARKED], counts[RuntimeStatus.COMPLETED]) == (0, 1)


def test_commands_to_a_parked_instance_are_answered_with_parked() -> None:
    with engine() as env:
        run = park_two_events(env)
        answer = env.raise_event(run, "b", 2)
        assert answer is not None and answer.result is CommandResult.BUFFERED
        assert answer.status is RuntimeStatus.PARKED and "PARKED" in answer.reason
        retried = env.retry(run)  # the same code: it parks again, attempt 2
        assert retried is not None and retried.result is CommandResult.ACCEPTED
        env.run()
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.PARKED
        assert "attempt 2" in state.pending_reason


def test_a_fixed_retry_brings_it_back_to_running_and_terminate_ends_it() -> None:
    with engine() as env:
        fixed, ended = park_two_events(env), park_two_events(env)
        env.deploy(build_registry(buggy=False))
        env.retry(fixed)
        env.run()
        state = env.get(fixed)
        assert state is not None and state.status is RuntimeStatus.RUNNING  # waits for "b"
        assert state.failure is None and state.pending_reason == ""
        env.deploy(build_registry(buggy=True))
        park_two_events(env)  # parking again needs no other bookkeeping
        env.terminate(ended, "giving up")
        assert env.wait_for_completion(ended).status is RuntimeStatus.TERMINATED


def test_suspending_a_parked_instance_is_kept_until_its_code_runs() -> None:
    with engine() as env:
        run = park_two_events(env)
        answer = env.suspend(run, "hold on")
        assert answer is not None and answer.result is CommandResult.BUFFERED
        assert "applies when a retry runs its code" in answer.reason
        env.run()
        assert status_of(env, run) is RuntimeStatus.PARKED
        env.deploy(build_registry(buggy=False))
        env.retry(run)
        env.run()
        assert status_of(env, run) is RuntimeStatus.SUSPENDED
        env.resume(run)
        env.raise_event(run, "b", 2)
        assert env.wait_for_completion(run).output == [1, 2]


def test_the_audit_finds_no_difference_in_a_parked_instance() -> None:
    with engine() as env:
        first_turn = env.start("greet", {"name": "ann"})  # parked before any history
        later = park_two_events(env)
        folds = fold_histories(env.history(first_turn) + env.history(later))
        tables = ProcessorTables()
        for record in env.records("state-changelog"):
            tables.apply(record.key or b"", record.value)
        statuses: dict[str, InstanceStatus] = {}
        for record in env.records("status"):
            assert record.value is not None
            status = decode_message(record.value)
            assert isinstance(status, InstanceStatus)
            statuses[status.instance_id] = status
        assert statuses[later].status is RuntimeStatus.PARKED
        report = compare(folds, tables, statuses)
        assert report.differences == []
        assert report.not_started == [first_turn]


# --- what it keeps -----------------------------------------------------------------------------


def test_events_past_the_count_go_to_dead_letters_and_it_stays_parked() -> None:
    with engine(parked_events_max=3) as env:
        run = park_two_events(env)  # keeps "a"
        answers = [env.raise_event(run, "b", n, wait=False) for n in range(2)]
        assert answers == [None, None]
        env.run()
        with pytest.raises(ParkedEventsFullError, match="parked_events_max=3"):
            env.raise_event(run, "b", 99)
        assert status_of(env, run) is RuntimeStatus.PARKED
        assert kept(env, run) == ["EventRaised"] * 3
        (letter,) = env.dead_letters()
        assert letter.instance_id == run and "PARKED" in letter.reason
        assert letter.value is not None
        resend = decode_message(letter.value)
        assert isinstance(resend, RaiseEvent) and (resend.name, resend.input) == (
            "b",
            to_payload(99),
        )


def test_a_thousand_and_a_half_events_of_a_kilobyte_keep_the_row_small() -> None:
    """What once made a 1.55 MB row (past the record limit, failing the instance for
    good): with the default bounds the row stays well below max_record_bytes."""
    with engine() as env:
        run = park_two_events(env)
        blob = "x" * 1000
        for _ in range(1500):
            env.raise_event(run, "b", blob, wait=False)
        env.run()
        assert status_of(env, run) is RuntimeStatus.PARKED
        settings = Settings()
        assert row_bytes(env, run) < settings.max_record_bytes // 2
        kept_events = len(kept(env, run))
        assert 200 < kept_events < 1500
        letters = env.dead_letters()
        assert len(letters) + kept_events == 1501
        assert all("parked_events_max_bytes" in letter.reason for letter in letters)
        env.deploy(build_registry(buggy=False))
        env.retry(run)
        assert env.wait_for_completion(run).output == [1, blob]


def test_timers_and_results_are_kept_past_the_bound() -> None:
    with engine(parked_events_max=1) as env:
        run = env.start("timed")
        env.run()
        env.raise_event(run, "a", 1)
        env.run()
        assert kept(env, run) == ["EventRaised"]
        with pytest.raises(ParkedEventsFullError):
            env.raise_event(run, "a", 2)
        env.advance(61)  # the timer fires while parked: kept, bound or not
        assert kept(env, run)[-1] == "TimerFired" and len(kept(env, run)) >= 2
        env.deploy(build_registry(buggy=False))
        env.retry(run)
        assert env.wait_for_completion(run).output == "woke"


def test_terminating_a_parked_instance_sends_its_kept_events_to_dead_letters() -> None:
    with engine() as env:
        run = park_two_events(env)
        env.raise_event(run, "b", 2)
        env.terminate(run, "giving up")
        assert env.wait_for_completion(run).status is RuntimeStatus.TERMINATED
        letters = env.dead_letters()
        assert len(letters) == 2 and all("terminated" in letter.reason for letter in letters)
        values = []
        for letter in letters:
            assert letter.value is not None
            event = decode_message(letter.value)
            assert isinstance(event, RaiseEvent)
            values.append((event.name, event.input))
        assert values == [("a", to_payload(1)), ("b", to_payload(2))]


def test_a_reset_of_a_parked_instance_delivers_the_events_it_kept() -> None:
    with engine() as env:
        run = park_two_events(env)
        env.raise_event(run, "b", 2)  # kept: it never reached the history
        env.run()
        env.deploy(build_registry(buggy=False))
        env.reset(run, ResetTarget.FIRST_TURN, "after the fix")
        state = env.wait_for_completion(run)
        assert state.output == [1, 2] and state.generation == 1


def test_the_byte_bound_must_fit_in_half_a_record() -> None:
    with pytest.raises(ConfigurationError, match="at most half of max_record_bytes"):
        load_settings(env={}, parked_events_max_bytes=600_000)
