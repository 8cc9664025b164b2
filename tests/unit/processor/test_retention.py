"""Retention: the processor purges finished instances itself, by a timer set when they end
(the namespace's retention_ms, or the workflow's own retention), and only the run that
ended: a new run under the id is kept."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine import Registry, WorkflowContext
from engine.config.settings import Settings
from engine.core.errors import RegistrationError
from engine.core.history import ExecutionCompleted
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="short-lived", retention=timedelta(hours=1))
async def short_lived(ctx: WorkflowContext, x: int) -> int:
    return x


@registry.workflow(name="plain")
async def plain(ctx: WorkflowContext, x: int) -> int:
    if x < 0:
        await ctx.wait_for_event("never")
    return x


def test_a_workflow_retention_purges_it_after_the_time() -> None:
    with TestEngine(registry, partitions=2) as env:
        env.start("short-lived", 1, instance_id="a")
        env.start("plain", 1, instance_id="b")  # no namespace retention: kept
        assert env.wait_for_completion("a").output == 1
        env.advance(timedelta(minutes=59))
        assert env.get("a") is not None
        env.advance(timedelta(minutes=1))
        assert env.get("a") is None  # purged: gone from status, as after 'turnstile purge'
        assert env.get("b") is not None
        assert any(isinstance(e.body, ExecutionCompleted) for e in env.history("a"))


def test_the_namespace_retention_and_a_new_run_under_the_id() -> None:
    with TestEngine(registry, settings=Settings(retention_ms=10 * 60_000)) as env:
        env.start("plain", 1, instance_id="c")
        env.run()
        env.advance(timedelta(minutes=5))
        env.start("plain", -1, instance_id="c")  # a new run, still running at the old time
        env.advance(timedelta(minutes=30))
        state = env.get("c")
        assert state is not None and state.generation == 1
        env.terminate("c", "done")
        env.advance(timedelta(minutes=10))
        assert env.get("c") is None  # the second run's own retention


def test_a_bad_retention_is_a_registration_error() -> None:
    with pytest.raises(RegistrationError, match="retention of workflow 'x'"):
        Registry().workflow(name="x", retention=-5)(plain)


def test_a_new_run_that_ends_in_the_same_batch_gets_its_own_timer() -> None:
    with TestEngine(registry, settings=Settings(retention_ms=60_000)) as env:
        env.start("plain", 1, instance_id="d")
        env.run()
        env.advance(timedelta(seconds=30))
        env.start("plain", 2, instance_id="d")  # ends in the batch that starts it
        env.run()
        env.advance(timedelta(seconds=40))  # the first run's timer: stale, dropped
        state = env.get("d")
        assert state is not None and state.output == 2
        env.advance(timedelta(seconds=30))
        assert env.get("d") is None
