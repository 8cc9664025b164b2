"""A partition whose next batch runs while the previous one commits decides exactly what it
decides one batch at a time: the next batch reads the closed one's changes from the tables'
pending layer, commits apply the layers oldest first, and an abort drops every batch after
the aborted one too, leaving no trace."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.config.topics import topic_names
from engine.core.history import RuntimeStatus
from engine.core.messages import (
    Message,
    PurgeWorkflow,
    RaiseEvent,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.core.payloads import to_payload
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.tables import Tables
from engine.services.records import RawRecord

registry = Registry()
NOW_MS = 1_765_000_000_000


@registry.workflow(name="inline3")
async def inline3(ctx: WorkflowContext, x: int) -> int:
    for _ in range(3):
        x = await ctx.run("inc", lambda v: v + 1, x)
    return x


@registry.workflow(name="waiter")
async def waiter(ctx: WorkflowContext, x: int) -> Any:
    got = await ctx.wait_for_event("go")
    return [x, got]


@registry.workflow(name="collector")
async def collector(ctx: WorkflowContext, x: int) -> Any:
    got = [await ctx.wait_for_event("go") for _ in range(3)]
    return [x, *got]


IDS = ("a", "b", "c")
commands = st.one_of(
    st.builds(
        StartWorkflow,
        st.sampled_from(IDS),
        name=st.sampled_from(["inline3", "waiter", "collector"]),
        input=st.integers(0, 9).map(to_payload),
    ),
    st.builds(RaiseEvent, st.sampled_from(IDS), name=st.just("go"), input=st.just(to_payload(1))),
    st.builds(TerminateWorkflow, st.sampled_from(IDS), reason=st.just("enough")),
    st.builds(PurgeWorkflow, st.sampled_from(IDS)),
)


def _records(messages: list[Message]) -> list[RawRecord]:
    return [
        RawRecord(0, offset, m.instance_id.encode(), encode_message(m), NOW_MS, "t.commands")
        for offset, m in enumerate(messages)
    ]


def _batches(records: list[RawRecord], cuts: list[int]) -> list[list[RawRecord]]:
    edges = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    return [records[a:b] for a, b in itertools.pairwise(edges) if b > a]


def _partition(cache_capacity: int = 2) -> PartitionProcessor:
    env = Environment(registry, topic_names("t"), 1, 10, 10**9, cache_capacity=cache_capacity)
    return PartitionProcessor(0, MemoryPartitionStore(), env)


Output = tuple[str, bytes | None, bytes | None]


def _one_at_a_time(
    batches: list[list[RawRecord]], cache_capacity: int = 2
) -> tuple[PartitionProcessor, list[Output]]:
    pp, out = _partition(cache_capacity), []
    for i, batch in enumerate(batches):
        for record in batch:
            pp.accept(record, NOW_MS + i)
        out += [(r.topic, r.key, r.value) for r in pp.end_batch(NOW_MS + i).out]
        pp.committed({})
    return pp, out


def _pipelined(
    batches: list[list[RawRecord]], abort_at: int | None, cache_capacity: int = 2
) -> tuple[PartitionProcessor, list[Output]]:
    """Batch i+1 is accepted and stepped before batch i's outcome is reported; the
    transaction of batch ``abort_at`` aborts once (both it and the batch after it are done
    again, as the loop's seek back makes them)."""
    pp, out = _partition(cache_capacity), []
    i, in_flight = 0, None
    aborted = False
    while i < len(batches) or in_flight is not None:
        closed = None
        if i < len(batches):
            for record in batches[i]:
                pp.accept(record, NOW_MS + i)
            closed = (i, pp.end_batch(NOW_MS + i))
        if in_flight is not None:
            number, batch = in_flight
            if number == abort_at and not aborted:
                aborted = True
                pp.rolled_back()  # drops the closed batch after it too
                i, in_flight = number, None
                continue
            out += [(r.topic, r.key, r.value) for r in batch.out]
            pp.committed({})
        in_flight = closed
        i += 1
    return pp, out


def _rows(pp: PartitionProcessor) -> list[tuple[bytes, bytes]]:
    return list(pp.tables.scan(b"", b"\xff" * 8))


@settings(max_examples=120, deadline=None)
@given(
    messages=st.lists(commands, min_size=1, max_size=14),
    cuts=st.lists(st.integers(0, 14), max_size=6),
    abort=st.one_of(st.none(), st.integers(0, 6)),
)
def test_the_next_batch_during_the_commit_decides_what_one_at_a_time_decides(
    messages: list[Message], cuts: list[int], abort: int | None
) -> None:
    batches = _batches(_records(messages), cuts)
    expected_pp, expected = _one_at_a_time(batches)
    pp, out = _pipelined(batches, abort if abort is None or abort < len(batches) else None)
    assert out == expected
    assert _rows(pp) == _rows(expected_pp)
    assert pp.uncommitted == 0 and not pp.has_work


def test_an_instance_of_a_batch_not_yet_committed_keeps_one_copy_under_cache_pressure() -> None:
    """With room for one instance, the commit of batch 0 must not drop ``b``, which batch 1
    (closed, not committed) changed: batch 2 would load a second copy, and batch 1's commit
    would put the older one back for batch 3 to use."""
    go = RaiseEvent("b", name="go", input=to_payload(1))
    starts = [StartWorkflow(i, name="collector", input=to_payload(0)) for i in ("a", "b")]
    records = _records([*starts, go, go, go])
    batches = [records[:2], records[2:3], records[3:4], records[4:]]
    expected_pp, expected = _one_at_a_time(batches, cache_capacity=1)
    pp, out = _pipelined(batches, None, cache_capacity=1)
    assert out == expected and _rows(pp) == _rows(expected_pp)
    meta = pp.tables.load_meta("b")
    assert meta is not None and meta.status is RuntimeStatus.COMPLETED, "three events, one copy"


def test_a_closed_batch_stays_readable_until_its_commit_and_an_abort_drops_the_later_ones() -> None:
    tables = Tables(0, MemoryPartitionStore())
    tables.put(b"k1", b"first")
    first = tables.take_changes()
    tables.put(b"k2", b"second")
    tables.put(b"k1", b"over")
    assert tables.get(b"k1") == b"over" and tables.get(b"k2") == b"second"
    second = tables.take_changes()
    assert tables.get(b"k1") == b"over", "the newest pending layer wins"
    assert list(tables.scan(b"k", b"l")) == [(b"k1", b"over"), (b"k2", b"second")]
    tables.apply(first, {})
    assert tables.store.get(b"k1") == b"first" and tables.get(b"k1") == b"over"
    tables.put(b"k3", b"third")
    tables.drop_overlay()  # an abort of the second batch drops what came after it too
    assert tables.get(b"k1") == b"first" and tables.get(b"k2") is None
    assert tables.get(b"k3") is None and second
