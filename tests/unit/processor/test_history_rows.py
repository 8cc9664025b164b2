"""A turn's history events travel as one row of the state table (one RocksDB write, one
changelog record, one record to restore), and rows written one event each by older
processors stay readable: replayed, restored and audited as before."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import decode_history, encode_message
from engine.config.topics import topic_names
from engine.core.history import RuntimeStatus
from engine.core.limits import KIB, RECORD_OVERHEAD, Limits
from engine.core.messages import RaiseEvent, StartWorkflow
from engine.core.payloads import from_payload, to_payload
from engine.services.audit.state import ProcessorTables
from engine.services.processor import keys
from engine.services.processor.history_rows import encode_turn_row, pack_rows, split_row
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.records import RawRecord

registry = Registry()
fanout_registry = Registry()
_VALUE_LIMITS = (
    "workflow_input", "workflow_output", "activity_input", "activity_result", "event",
    "custom_status",
)  # fmt: skip
TOPICS = topic_names("t")


def _add_one(x: int) -> int:
    return x + 1


@registry.workflow(name="steps")
async def steps(ctx: WorkflowContext, x: int) -> Any:
    for i in range(3):
        x = await ctx.run(f"step-{i}", _add_one, x)
    return x + int(await ctx.wait_for_event("go"))


def _processor(store: MemoryPartitionStore) -> PartitionProcessor:
    return PartitionProcessor(0, store, Environment(registry, TOPICS, 1, 2, 10**6))


def _turn(pp: PartitionProcessor, offset: int, key: str, value: bytes) -> dict[bytes, Any]:
    pp.accept(RawRecord(0, offset, key.encode(), value, 1000, TOPICS.commands), 1000)
    batch = pp.end_batch(1000)
    changes = dict(batch.changes)
    pp.committed({})
    return changes


def _history_keys(changes: dict[bytes, Any]) -> list[bytes]:
    return [k for k, v in changes.items() if k.startswith(keys.HISTORY) and v is not None]


def _start(pp: PartitionProcessor) -> dict[bytes, Any]:
    start = StartWorkflow("w", "steps", to_payload(1), request_id="s")
    return _turn(pp, 0, "w", encode_message(start))


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_a_turn_row_holds_its_events_in_order(events: list[bytes]) -> None:
    assert split_row(encode_turn_row(events)) == events


@given(st.binary(max_size=200))
def test_a_row_of_one_event_from_an_older_processor_reads_as_that_event(rest: bytes) -> None:
    old = b"\xc3\x01" + rest  # single-object Avro, as every event row used to be
    assert split_row(old) == [old]


def test_a_row_cut_short_says_what_to_do() -> None:
    row = encode_turn_row([b"\xc3\x01abc", b"\xc3\x01defg"])
    with pytest.raises(ValueError, match="restore the partition"):
        split_row(row[:-2])


def test_a_turn_writes_one_history_row_and_one_record_per_event_to_the_history_topic() -> None:
    pp = _processor(MemoryPartitionStore())
    start = StartWorkflow("w", "steps", to_payload(1), request_id="s")
    pp.accept(RawRecord(0, 0, b"w", encode_message(start), 1000, TOPICS.commands), 1000)
    batch = pp.end_batch(1000)
    published = [r.value for r in batch.out if r.topic == TOPICS.history]
    changes = dict(batch.changes)
    pp.committed({})
    (row_key,) = _history_keys(changes)
    events = [decode_history(e) for e in split_row(changes[row_key])]
    assert len(events) > 3  # started, the turn, three steps
    assert [e.sequence for e in events] == list(range(len(events)))
    assert published == split_row(changes[row_key])  # the topic keeps one record per event
    assert row_key == keys.history_key("w", 0)


def test_history_rows_of_an_older_processor_replay_and_the_instance_goes_on() -> None:
    store = MemoryPartitionStore()
    pp = _processor(store)
    (row_key,) = _history_keys(_start(pp))
    # what an older processor wrote for the same turn: one row per event
    events = split_row(store.get(row_key) or b"")
    old_rows: dict[bytes, bytes | None] = {row_key: None}
    for event in events:
        old_rows[keys.history_key("w", decode_history(event).sequence)] = event
    store.write(old_rows)
    pp.cache.clear()  # a restart: the next turn replays the rows
    misses = pp.counters.cache_misses
    changes = _turn(pp, 1, "w", encode_message(RaiseEvent("w", "go", to_payload(10))))
    assert pp.counters.cache_misses == misses + 1
    meta = pp.tables.load_meta("w")
    assert meta is not None and meta.status is RuntimeStatus.COMPLETED
    assert meta.output is not None and from_payload(meta.output) == 14
    # the new turn's events went into one row after the old ones
    (new_key,) = _history_keys(changes)
    assert keys.history_sequence(new_key) == len(events)
    assert pp.tables.history("w", 0)[: len(events)] == events


def test_the_audit_reads_both_layouts_alike() -> None:
    store = MemoryPartitionStore()
    pp = _processor(store)
    (row_key,) = _history_keys(_start(pp))
    row = store.get(row_key)
    assert row is not None
    packed, one_each = ProcessorTables(), ProcessorTables()
    packed.apply(row_key, row)
    for event in split_row(row):
        one_each.apply(keys.history_key("w", decode_history(event).sequence), event)
    assert packed.rows == one_each.rows and len(packed.rows["w"]) == len(split_row(row))
    packed.apply(row_key, None)  # a tombstone of the turn's row deletes all its events
    assert "w" not in packed.rows


@given(st.lists(st.binary(min_size=1, max_size=400), max_size=40), st.integers(8, 1200))
def test_a_large_turn_is_packed_into_rows_that_fit(events: list[bytes], max_bytes: int) -> None:
    rows = pack_rows(list(enumerate(events, start=7)), max_bytes)
    unpacked = [event for _, row in rows for event in split_row(row)]
    assert unpacked == events
    at = 7
    for first, row in rows:
        assert first == at  # each row is keyed by its first event's sequence
        count = len(split_row(row))
        assert len(row) <= max_bytes or count == 1  # only an event too large alone is larger
        at += count


@fanout_registry.activity(name="echo")
def echo(i: int) -> int:
    return i


@fanout_registry.workflow(name="fan")
async def fan(ctx: WorkflowContext, n: int) -> Any:
    results = await ctx.when_all([ctx.call_activity(echo, i) for i in range(n)])
    return sum(results)


def test_a_turn_larger_than_a_record_writes_several_rows_that_replay() -> None:
    small = Limits(**{kind: 2 * KIB for kind in _VALUE_LIMITS}, record=20 * KIB)
    env = Environment(fanout_registry, TOPICS, 1, 2, 10**6, limits=small)
    store = MemoryPartitionStore()
    pp = PartitionProcessor(0, store, env)
    start = StartWorkflow("f", "fan", to_payload(200), request_id="s")
    changes = _turn(pp, 0, "f", encode_message(start))
    rows = _history_keys(changes)
    assert len(rows) > 1
    assert all(len(changes[k]) <= small.record - RECORD_OVERHEAD for k in rows)
    history = [decode_history(e) for e in pp.tables.history("f", 0)]
    assert [e.sequence for e in history] == list(range(len(history)))
    pp.cache.clear()  # cold: the next turn replays every row
    _turn(pp, 1, "f", encode_message(RaiseEvent("f", "nudge", to_payload(0))))
    meta = pp.tables.load_meta("f")
    assert meta is not None and meta.status is RuntimeStatus.RUNNING and not meta.parked
    assert meta.next_sequence > len(history)  # the turn after the replay was recorded
