"""Events raised for an id before it starts expire on time, by a timer, into dead letters,
and the row of an id that never starts goes with its last event; the answers say what
becomes of a kept event and when."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_message
from engine.config.settings import Settings
from engine.core.history import RuntimeStatus
from engine.core.messages import CommandResult, RaiseEvent
from engine.services.processor import keys, pending
from engine.testing import TestEngine

registry = Registry()
TTL_MS = 60_000


@registry.workflow(name="collect")
async def collect(ctx: WorkflowContext, _: Any) -> list[Any]:
    items: list[Any] = []
    while True:
        value = await ctx.wait_for_event("item")
        if value == "end":
            return items
        items.append(value)


@registry.workflow(name="limited", max_concurrency_per_key=1)
async def limited(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.wait_for_event("item")


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, settings=Settings(pending_events_ttl_ms=TTL_MS)) as engine:
        yield engine


def _row(env: TestEngine, instance_id: str) -> bytes | None:
    pp = env.processors[env.partition_of(instance_id)]
    return pp.tables.store.get(keys.meta_key(instance_id))


def _pending_timers(env: TestEngine, instance_id: str) -> list[keys.TimerKey]:
    pp = env.processors[env.partition_of(instance_id)]
    return [t for t in pp.tables.timers_of(instance_id) if t.task_id == pending.PENDING_TIMER]


def test_events_for_an_id_that_never_starts_expire_and_its_row_goes(env: TestEngine) -> None:
    answer = env.raise_event("never", "item", "first", request_id="r1")
    assert answer is not None and answer.result is CommandResult.BUFFERED
    assert "has not started yet" in answer.reason and "goes to dead letters" in answer.reason
    env.advance(timedelta(seconds=30))
    env.raise_event("never", "item", "second")
    assert _row(env, "never") is not None and len(_pending_timers(env, "never")) == 1
    env.advance(timedelta(seconds=31))  # the first expires on its own, no event needed
    assert [letter.instance_id for letter in env.dead_letters()] == ["never"]
    assert _row(env, "never") is not None  # the second is still within its TTL
    env.advance(timedelta(seconds=30))
    letters = env.dead_letters()
    assert len(letters) == 2 and all("pending_events_ttl_ms" in x.reason for x in letters)
    sent_again = []
    for letter in letters:
        assert letter.value is not None
        event = decode_message(letter.value)
        assert isinstance(event, RaiseEvent)
        sent_again.append(event.name)
    assert sent_again == ["item", "item"]
    assert _row(env, "never") is None and _pending_timers(env, "never") == []
    assert env.processors[0].counters.dead_letter_kinds == {"PendingEventExpired": 2}


def test_a_timer_of_events_that_were_delivered_changes_nothing(env: TestEngine) -> None:
    env.raise_event("soon", "item", "kept")
    env.start("collect", instance_id="soon")
    env.run()
    env.advance(timedelta(minutes=2))  # the expiry timer fires: nothing is kept any more
    env.raise_event("soon", "item", "end")
    assert env.wait_for_completion("soon").output == ["kept"]
    assert env.dead_letters() == []


def test_events_for_a_scheduled_start_past_the_ttl_expire_before_it(env: TestEngine) -> None:
    env.start("collect", instance_id="later", start_at=env.now() + timedelta(hours=1))
    answer = env.raise_event("later", "item", "early")
    assert answer is not None and answer.result is CommandResult.BUFFERED
    assert "waits for its scheduled start" in answer.reason
    assert "dead letters first" in answer.reason  # the start is after the expiry
    env.advance(timedelta(minutes=2))
    assert len(env.dead_letters()) == 1
    state = env.get("later")
    assert state is not None and state.status is RuntimeStatus.PENDING  # still scheduled


def test_the_answer_for_a_start_waiting_for_a_slot_says_so(env: TestEngine) -> None:
    env.start("limited", instance_id="holder", concurrency_key="k")
    env.start("limited", instance_id="waiter", concurrency_key="k")
    env.run()
    answer = env.raise_event("waiter", "item", "early")
    assert answer is not None and answer.result is CommandResult.BUFFERED
    assert "waits as PENDING for a slot of its concurrency key 'k'" in answer.reason
    assert "scheduled start" not in answer.reason and "goes to dead letters" in answer.reason
