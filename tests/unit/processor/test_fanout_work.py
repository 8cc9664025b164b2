"""A turn of a large fan-out costs what the turn touches, not what is open.

One instance waits for n activities (or n timed attempts in n fibers, n children, n event
waits); the partition's state machine is driven directly, and the Python bytecodes one
batch executes - taking one result, running the turn, closing and committing the batch -
are counted with an opcode tracer (work, not time: the machine is noisy). The count must
not grow with n: a turn with 100,000 open activities does what one with 10 does.

Before the runtime reported the attempts it stops waiting for, the processor compared
every open attempt with the execution after every turn (the count grew by ~30 bytecodes
per open attempt); before running children had rows of their own, every turn of a parent
re-encoded the list of its children in its row.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.config.topics import topic_names
from engine.core.history import RuntimeStatus
from engine.core.limits import HistoryLimits
from engine.core.messages import ActivityResult, ChildResult, Message, RaiseEvent, StartWorkflow
from engine.core.payloads import to_payload
from engine.services.processor import cancels
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.records import RawRecord
from engine.services.watchdog import TurnWatchdog

registry = Registry()
TOPICS = topic_names("fan")
NOW = 1_700_000_000_000


@registry.workflow(name="activities")
async def activities(ctx: WorkflowContext, n: int) -> int:
    return len(await ctx.when_all([ctx.call_activity("work", i) for i in range(n)]))


async def _timed(ctx: WorkflowContext, i: int) -> Any:
    return await ctx.call_activity("work", i, start_to_close=3600)


@registry.workflow(name="timed-fibers")
async def timed_fibers(ctx: WorkflowContext, n: int) -> int:
    return len(await ctx.when_all([ctx.spawn(_timed(ctx, i)) for i in range(n)]))


@registry.workflow(name="children")
async def children(ctx: WorkflowContext, n: int) -> int:
    kids = [ctx.call_child_workflow("kid", i, instance_id=f"kid-{i}") for i in range(n)]
    return len(await ctx.when_all(kids))


async def _waits(ctx: WorkflowContext) -> Any:
    return await ctx.wait_for_event("go", timeout=3600)


@registry.workflow(name="event-waits")
async def event_waits(ctx: WorkflowContext, n: int) -> int:
    return len(await ctx.when_all([ctx.spawn(_waits(ctx)) for _ in range(n)]))


class Partition:
    """One partition's state machine, fed records by hand, one batch at a time."""

    def __init__(self, n: int) -> None:
        env = Environment(
            registry,
            TOPICS,
            1,
            10,
            10**9,
            turn_max_events=4 * n + 100,  # the first turn schedules every call
            history_limits=HistoryLimits(events_warn=8 * n + 100, events_max=8 * n + 100),
            watchdog=TurnWatchdog(10**9),  # a slow machine must not fail the first turn
        )
        self.pp = PartitionProcessor(0, MemoryPartitionStore(), env)
        self._offsets = itertools.count()
        self._watchdog = env.watchdog

    def close(self) -> None:
        self._watchdog.close()

    def batch(self, topic: str, messages: list[Message]) -> None:
        for message in messages:
            key = message.instance_id.encode()
            record = RawRecord(0, next(self._offsets), key, encode_message(message), 0, topic)
            self.pp.accept(record, NOW)
        self.pp.end_batch(NOW)
        self.pp.committed({})

    def status(self, instance_id: str) -> RuntimeStatus | None:
        meta = self.pp.tables.load_meta(instance_id)
        return None if meta is None else meta.status


def bytecodes(run: Callable[[], None]) -> int:
    """The Python bytecodes ``run`` executes (C code it calls counts as one call)."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        elif event == "opcode":
            count += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(previous)
    return count


def _result(i: int) -> Message:
    return ActivityResult("fan", 0, i, 1, to_payload(i))


def _timed_result(i: int) -> Message:
    return _result(2 * i)  # each fiber made an activity call and then its timer


def _child_result(i: int) -> Message:
    output = to_payload(i)
    return ChildResult("fan", 0, i, f"kid-{i}", RuntimeStatus.COMPLETED, output)


def _event(i: int) -> Message:
    return RaiseEvent("fan", name="go", input=to_payload(i))


# (workflow, what answers one of its calls, the topic that answer arrives on)
SHAPES: dict[str, tuple[Callable[[int], Message], str]] = {
    "activities": (_result, TOPICS.activity_results),
    "timed-fibers": (_timed_result, TOPICS.activity_results),
    "children": (_child_result, TOPICS.instance_messages),
    "event-waits": (_event, TOPICS.commands),
}


def work_per_turn(shape: str, n: int, turns: int = 3) -> int:
    """Start a fan-out of ``n`` calls, then answer ``turns`` of them one batch each: the
    bytecodes of the dearest of those batches."""
    answer, topic = SHAPES[shape]
    partition = Partition(n)
    try:
        start = StartWorkflow("fan", name=shape, input=to_payload(n))
        partition.batch(TOPICS.commands, [start])
        assert partition.status("fan") is RuntimeStatus.RUNNING
        counts = [
            bytecodes(lambda i=i: partition.batch(topic, [answer(i)]))  # type: ignore[misc]
            for i in range(turns)
        ]
        assert partition.status("fan") is RuntimeStatus.RUNNING
    finally:
        partition.close()
    print(f"{shape} n={n}: {counts} bytecodes per turn")
    return max(counts)


@pytest.fixture(scope="module")
def baseline() -> Iterator[dict[str, int]]:
    yield {shape: work_per_turn(shape, 10) for shape in SHAPES}


def _flat(work: int, base: int) -> bool:
    """Within 10 % of a turn with 10 calls open (varints of larger task ids and sequence
    numbers cost a few bytecodes more; one open call more per turn cost ~30)."""
    return work <= base * 1.1


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_turn_of_a_fan_out_of_10_000_costs_what_one_of_10_does(
    shape: str, baseline: dict[str, int]
) -> None:
    work = work_per_turn(shape, 10_000)
    assert _flat(work, baseline[shape]), (shape, work, baseline[shape])


def test_a_turn_with_100_000_activities_open_costs_what_one_with_10_does(
    baseline: dict[str, int],
) -> None:
    work = work_per_turn("activities", 100_000)
    assert _flat(work, baseline["activities"]), (work, baseline["activities"])


def test_the_open_attempts_kept_for_a_reset_match_the_execution_after_every_turn() -> None:
    """The processor updates its open attempts from the turn's actions and results only;
    they still equal what the execution waits for (a timeout's retry, a cancelled call)."""
    partition = Partition(50)
    start = StartWorkflow("fan", name="timed-fibers", input=to_payload(50))
    partition.batch(TOPICS.commands, [start])
    item = partition.pp.cache.get("fan")
    assert item is not None and item.execution is not None
    assert item.open_attempts == cancels._waiting(item.execution)
    for i in range(0, 50, 7):
        partition.batch(TOPICS.activity_results, [_timed_result(i)])
        assert item.open_attempts == cancels._waiting(item.execution)
    partition.close()
