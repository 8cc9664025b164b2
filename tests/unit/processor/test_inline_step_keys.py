"""Inline steps run at least once: a turn redone before its commit runs the step's body
again, with the same idempotency key (``engine.current_step()``), while the history
records its result once. Driven on the partition state machine, whose abort path
(``rolled_back``) is what the Kafka loop runs after an aborted transaction."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Registry, WorkflowContext, current_step
from engine.codec import decode_history, encode_message
from engine.config.topics import topic_names
from engine.core.errors import TurnstileError
from engine.core.history import InlineStepCompleted
from engine.core.messages import RaiseEvent, StartWorkflow
from engine.core.payloads import from_payload, to_payload
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.records import RawRecord
from engine.testing import TestEngine

registry = Registry()
#: What the steps' bodies saw, in the order they ran (stands in for an external system).
calls: list[tuple[str, str]] = []


def charge(label: str) -> str:
    key = current_step().idempotency_key
    calls.append((label, key))
    return key


@registry.workflow(name="two-steps")
async def two_steps(ctx: WorkflowContext, _: Any) -> list[str]:
    first = await ctx.run("first", charge, "first")
    await ctx.wait_for_event("go")
    second = await ctx.run("second", charge, "second")
    return [first, second]


def _record(offset: int, message: Any) -> RawRecord:
    return RawRecord(0, offset, b"a", encode_message(message), 0, "t.commands")


def _recorded_steps(pp: PartitionProcessor, now: int) -> list[str]:
    batch = pp.end_batch(now)
    events = [decode_history(r.value) for r in batch.out if r.topic == "t.history" and r.value]
    return [from_payload(e.body.output) for e in events if isinstance(e.body, InlineStepCompleted)]


def test_a_redone_turn_runs_its_step_again_with_the_same_key() -> None:
    calls.clear()
    environment = Environment(registry, topic_names("t"), 1, 2, 10**6)
    pp = PartitionProcessor(0, MemoryPartitionStore(), environment)
    start = _record(0, StartWorkflow("a", name="two-steps", input=to_payload(None)))
    pp.accept(start, 1000)
    (key,) = _recorded_steps(pp, 1000)
    pp.rolled_back()  # the transaction aborted: nothing was recorded
    pp.accept(start, 1000)
    assert _recorded_steps(pp, 1000) == [key]  # recorded once, in the committed turn
    pp.committed({})
    row = pp.tables.load_meta("a")
    assert row is not None and row.run_id  # the redone start made the same run id
    assert key == f"a/{row.run_id}/0/0"
    assert calls == [("first", key), ("first", key)]  # but run twice, same key

    go = _record(1, RaiseEvent("a", "go"))
    pp.accept(go, 2000)
    (second,) = _recorded_steps(pp, 2000)
    pp.rolled_back()  # a later turn of a cold-rebuilt instance: the first step is replayed
    pp.accept(go, 2000)
    assert _recorded_steps(pp, 2000) == [second]
    assert second != key and second.startswith(f"a/{row.run_id}/0/")
    assert calls[2:] == [("second", second), ("second", second)]


def test_each_run_of_an_instance_gives_its_steps_other_keys() -> None:
    calls.clear()
    with TestEngine(registry) as env:
        env.start("two-steps", None, instance_id="b")
        env.raise_event("b", "go")
        first = env.wait_for_completion("b").output
        env.start("two-steps", None, instance_id="b")  # a new run: the next generation
        env.raise_event("b", "go")
        again = env.wait_for_completion("b").output
    run = first[0].split("/")[1]
    assert first == [f"b/{run}/0/0", f"b/{run}/0/1"]
    assert len(set(first) | set(again)) == 4


def test_current_step_outside_a_step_says_where_it_works() -> None:
    with pytest.raises(TurnstileError, match="outside an inline step"):
        current_step()
