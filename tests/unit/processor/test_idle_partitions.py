"""A replica's idle partitions cost it nothing per batch: the earliest timer is remembered
between timer writes (no store scan before every poll and every timer check), and a
partition whose batch holds nothing says so, so the loop leaves it out of the batch's end
and commit. The remembered answer must always equal a fresh scan."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.config.topics import topic_names
from engine.core.messages import StartWorkflow
from engine.core.payloads import to_payload
from engine.services.processor import keys
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.tables import Tables
from engine.services.records import RawRecord

registry = Registry()


@registry.workflow(name="one")
async def one(ctx: WorkflowContext, x: int) -> int:
    return x + 1


class CountingStore(MemoryPartitionStore):
    """The in-memory store, counting the scans it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.scans += 1
        return super().scan(start, end)


def fresh_view(tables: Tables) -> Tables:
    """The same store and overlay, with nothing remembered: what a scan answers now."""
    view = Tables(tables.partition, tables.store)
    view.overlay = dict(tables.overlay)
    return view


timer_keys = st.builds(
    keys.TimerKey,
    st.integers(0, 50),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 2),
    st.integers(0, 3),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put_timer"), timer_keys),
        st.tuples(st.just("delete_timer"), timer_keys),
        st.tuples(st.just("put_row"), st.sampled_from([b"m1", b"m2"])),
        st.tuples(st.just("commit"), st.none()),
        st.tuples(st.just("drop"), st.none()),
        st.tuples(st.just("restore"), timer_keys),
    ),
    max_size=40,
)


def _do(tables: Tables, op: str, arg: object) -> None:
    if op == "put_timer":
        assert isinstance(arg, keys.TimerKey)
        tables.put_timer(arg)
    elif op == "delete_timer":
        assert isinstance(arg, keys.TimerKey)
        tables.delete_timer(arg)
    elif op == "put_row":
        assert isinstance(arg, bytes)
        tables.put(keys.meta_key(arg.decode()), b"row")
    elif op == "commit":
        tables.apply(tables.take_changes(), {"state": 1})
    elif op == "drop":
        tables.drop_overlay()
    else:  # a changelog restore writes committed rows straight through apply()
        assert isinstance(arg, keys.TimerKey)
        tables.apply({keys.timer_key(arg): b""}, {"timer": 2})


@settings(max_examples=200, deadline=None)
@given(operations, st.integers(0, 60))
def test_the_remembered_earliest_timer_always_equals_a_fresh_scan(
    ops: list[tuple[str, object]], now_ms: int
) -> None:
    tables = Tables(0, MemoryPartitionStore())
    for op, arg in ops:
        tables.next_timer_ms()  # remember the answer before every write
        _do(tables, op, arg)
        assert tables.next_timer_ms() == fresh_view(tables).next_timer_ms()
        assert tables.due_timers(now_ms) == fresh_view(tables).due_timers(now_ms)


def _partition() -> tuple[PartitionProcessor, CountingStore]:
    store = CountingStore()
    environment = Environment(registry, topic_names("t"), 1, 2, 10**6)
    return PartitionProcessor(0, store, environment), store


def test_an_idle_partition_answers_timer_questions_without_scanning_its_store() -> None:
    pp, store = _partition()
    assert pp.next_timer_ms() is None
    scans = store.scans
    for now_ms in range(1000, 1100):
        assert pp.next_timer_ms() is None
        assert pp.fire_due_timers(now_ms) == 0
    assert store.scans == scans


def test_a_partition_has_work_only_once_something_reached_its_batch() -> None:
    pp, _ = _partition()
    assert not pp.has_work
    pp.fire_due_timers(1000)  # no timer due: still nothing to commit
    assert not pp.has_work
    start = encode_message(StartWorkflow("a", name="one", input=to_payload(1)))
    pp.accept(RawRecord(0, 0, b"a", start, 0, "t.commands"), 1000)
    assert pp.has_work
    assert pp.end_batch(1000).out
    pp.committed({"state": 3})
    assert not pp.has_work
    assert pp.tables.load_meta("a") is not None


def test_a_timer_written_in_the_batch_is_seen_at_once() -> None:
    pp, _ = _partition()
    assert pp.next_timer_ms() is None
    pp.tables.put_timer(keys.TimerKey(1500, "a", 0, 0))
    assert pp.next_timer_ms() == 1500
    pp.rolled_back()
    assert pp.next_timer_ms() is None


row_keys = st.binary(min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(row_keys, st.binary(min_size=1, max_size=2)),
    st.dictionaries(row_keys, st.one_of(st.none(), st.binary(min_size=1, max_size=2))),
    row_keys,
    row_keys,
)
def test_a_scan_merges_the_overlay_into_the_store_in_key_order(
    stored: dict[bytes, bytes],
    overlay: dict[bytes, bytes | None],
    start: bytes,
    end: bytes,
) -> None:
    """A scan reads the store lazily; with the batch's writes (and deletes) in the range it
    still answers what the store would hold with them applied, in key order."""
    store = MemoryPartitionStore()
    store.write(stored)
    tables = Tables(0, store)
    tables.overlay = dict(overlay)
    model = {**stored, **overlay}
    expected = sorted((k, v) for k, v in model.items() if v is not None and start <= k < end)
    assert list(tables.scan(start, end)) == expected
    first = next(tables.scan(start, end), None)
    assert first == (expected[0] if expected else None)
