"""A generation's history is bounded, like Temporal's: from ``history_events_warn`` events
(or ``history_bytes_warn`` bytes) on, a WARNING and ``ctx.continue_as_new_suggested``;
past ``history_events_max`` (``history_bytes_max``) the instance fails with a reason that
names the limit. And each turn writes at most one status record per instance."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.config.settings import Settings, load_settings
from engine.core.errors import ConfigurationError, RegistrationError
from engine.core.history import RuntimeStatus, TurnStarted
from engine.services.audit.replay import OK, ReplayChecker
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="spin")
async def spin(ctx: WorkflowContext, _: Any) -> None:
    """The fault run's instance: a timer loop that never ends (three events a turn)."""
    while True:
        await ctx.sleep(0)


@registry.workflow(name="spin-small", history_events_warn=30, history_events_max=90)
async def spin_small(ctx: WorkflowContext, _: Any) -> None:
    while True:
        await ctx.sleep(0)


@registry.workflow(name="chatty")
async def chatty(ctx: WorkflowContext, _: Any) -> None:
    """Few events, each large: the byte limits end it."""
    while True:
        ctx.set_custom_status("x" * 2000)
        await ctx.sleep(0)


@registry.workflow(name="polite")
async def polite(ctx: WorkflowContext, state: dict[str, Any]) -> dict[str, Any]:
    """Loops until the engine suggests a continue-as-new, then continues with its state."""
    while not ctx.continue_as_new_suggested:
        await ctx.sleep(1)
        state["ticks"] += 1
    state["generations"] += 1
    if state["generations"] == 4:
        return state
    ctx.continue_as_new(state)


LIMITS = Settings(history_events_warn=150, history_events_max=600)


def test_a_runaway_loop_fails_at_the_hard_limit_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.processor")
    with TestEngine(registry, settings=LIMITS) as env:
        env.start("spin", None, instance_id="s")
        state = env.wait_for_completion("s")
        assert state.status is RuntimeStatus.FAILED
        assert state.failure is not None
        assert state.failure.type == "HistoryLimitExceededError"
        assert "history_events_max=600" in state.failure.message
        history = env.history("s")
        assert 590 <= len(history) <= 603  # the limit, plus the failure's own end
        warnings = [r for r in caplog.records if "its code now sees" in r.getMessage()]
        assert len(warnings) == 1 and "history_events_warn=150" in warnings[0].getMessage()
        # one status record per turn of the loop, never more
        turns = sum(isinstance(e.body, TurnStarted) for e in history)
        statuses = [r for r in env.records("status") if r.key == b"s"]
        assert len(statuses) <= turns + 1


def test_the_suggestion_is_recorded_and_a_loop_that_heeds_it_runs_on() -> None:
    with TestEngine(registry, settings=LIMITS) as env:
        env.start("polite", {"ticks": 0, "generations": 0}, instance_id="p")
        env.wait_for_completion("p")
        state = env.get("p")
        assert state is not None and state.status is RuntimeStatus.COMPLETED
        assert state.output["generations"] == 4 and state.generation == 3
        history = env.history("p")
        per_generation = Counter(e.generation for e in history)
        assert max(per_generation.values()) < LIMITS.history_events_warn + 10
        suggested = [e for e in history if getattr(e.body, "continue_as_new_suggested", False)]
        assert len(suggested) == 4  # one turn per generation saw it, and continued
        # replay takes the recorded answers: every generation replays as it ran
        checker = ReplayChecker(registry)
        checker.feed_all(history)
        report = checker.finish()
        assert [r.outcome for r in report.results] == [OK] and report.generations == 4


def test_a_workflow_sets_its_own_event_limits() -> None:
    with TestEngine(registry) as env:  # the settings' defaults: 10,240 / 51,200
        env.start("spin-small", None, instance_id="w")
        state = env.wait_for_completion("w")
        assert state.status is RuntimeStatus.FAILED and state.failure is not None
        assert "history_events_max=90" in state.failure.message
        assert len(env.history("w")) <= 93


def test_the_byte_limits() -> None:
    settings = Settings(history_bytes_warn=20_000, history_bytes_max=60_000)
    with TestEngine(registry, settings=settings) as env:
        env.start("chatty", None, instance_id="c")
        state = env.wait_for_completion("c")
        assert state.status is RuntimeStatus.FAILED and state.failure is not None
        assert "history_bytes_max=60000" in state.failure.message
        assert len(env.history("c")) < 200


def test_limits_are_checked_when_they_are_set() -> None:
    with pytest.raises(ConfigurationError, match="history_events_warn=9 must be"):
        load_settings(env={}, history_events_warn=9, history_events_max=8)
    with pytest.raises(ConfigurationError, match="history_bytes_max"):
        load_settings(env={}, history_bytes_max=0)
    with pytest.raises(RegistrationError, match="history_events_warn=50"):
        Registry().workflow(name="x", history_events_warn=50, history_events_max=10)(spin)
    with pytest.raises(ConfigurationError, match="the warning comes first"):
        load_settings(env={"TURNSTILE_HISTORY_EVENTS_MAX": "700"})
    env = {"TURNSTILE_HISTORY_EVENTS_WARN": "100", "TURNSTILE_HISTORY_EVENTS_MAX": "700"}
    assert load_settings(env=env).history_limits.events_max == 700


def test_each_batch_writes_at_most_one_status_record_per_instance() -> None:
    with TestEngine(registry, settings=LIMITS) as env:
        for n in range(5):
            env.start("spin", None, instance_id=f"i{n}", wait=False)
        for _ in range(20):
            before = len(env.records("status"))
            env.step()  # one batch: timers of every instance fire, each takes a turn
            batch = env.records("status")[before:]
            per_instance = Counter(r.key for r in batch)
            assert per_instance and max(per_instance.values()) == 1


def test_a_purge_and_a_new_start_in_one_batch_write_one_status_record() -> None:
    with TestEngine(registry) as env:
        env.start("polite", {"ticks": 0, "generations": 3}, instance_id="x")
        env.terminate("x")
        env.run()
        env.purge("x", wait=False)
        env.start("polite", {"ticks": 0, "generations": 3}, instance_id="x", wait=False)
        before = len(env.records("status"))
        env.step()
        batch = [r for r in env.records("status")[before:] if r.key == b"x"]
        assert len(batch) == 1 and batch[0].value is not None  # the new run's, no tombstone
        state = env.get("x")
        assert state is not None and state.status is RuntimeStatus.RUNNING
