"""The hot-instance cache is bounded by its budget: a full cache evicts the least recently
used instance, and an evicted instance is rebuilt from its rows when it is needed again.

The budget (setting ``cache_instances``) is what bounds a replica's memory for instances,
so these tests fill caches past it, through the real turn logic and through the replica's
own split of the budget over partitions."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.config.topics import topic_names
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow
from engine.core.messages import RaiseEvent, StartWorkflow
from engine.core.payloads import from_payload, to_payload
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.state import InstanceCache, Loaded, partition_cache_capacity
from engine.services.records import RawRecord

registry = Registry()
TOPICS = topic_names("t")


@registry.workflow(name="parked")
async def parked(ctx: WorkflowContext, x: int) -> Any:
    return x + int(await ctx.wait_for_event("go"))


def _processor(capacity: int) -> PartitionProcessor:
    env = Environment(registry, TOPICS, 1, 2, 10**6, cache_capacity=capacity)
    return PartitionProcessor(0, MemoryPartitionStore(), env)


def _turn(pp: PartitionProcessor, offset: int, key: str, value: bytes) -> None:
    pp.accept(RawRecord(0, offset, key.encode(), value, 1000, TOPICS.commands), 1000)
    pp.end_batch(1000)
    pp.committed({})


def test_a_full_cache_evicts_the_least_recently_used() -> None:
    cache = InstanceCache(3)
    for name in "abcd":
        cache.put(name, Loaded(InstanceRow(name)))
    assert len(cache) == 3
    assert cache.get("a") is None  # the oldest went
    assert cache.get("b") is not None  # b is now the most recent
    cache.put("e", Loaded(InstanceRow("e")))
    assert cache.get("c") is None and cache.get("b") is not None


@given(st.integers(1, 20), st.lists(st.integers(0, 40), max_size=200))
def test_the_cache_never_holds_more_than_its_capacity(capacity: int, ids: list[int]) -> None:
    cache = InstanceCache(capacity)
    for i in ids:
        if cache.get(str(i)) is None:
            cache.put(str(i), Loaded(InstanceRow(str(i))))
        assert len(cache) <= capacity
    assert len(cache) == min(capacity, len(set(ids)))


def test_running_instances_past_the_budget_are_evicted_and_rebuilt_when_needed() -> None:
    pp = _processor(capacity=4)
    for i in range(10):
        start = StartWorkflow(f"w{i}", "parked", to_payload(i), request_id=f"s{i}")
        _turn(pp, i, f"w{i}", encode_message(start))
        assert len(pp.cache) <= 4
    assert len(pp.cache) == 4
    misses = pp.counters.cache_misses
    # w0 was evicted long ago: its event makes the processor replay it from its rows.
    _turn(pp, 10, "w0", encode_message(RaiseEvent("w0", "go", to_payload(100))))
    assert pp.counters.cache_misses == misses + 1
    meta = pp.tables.load_meta("w0")
    assert meta is not None and meta.status is RuntimeStatus.COMPLETED
    assert meta.output is not None and from_payload(meta.output) == 100
    assert len(pp.cache) == 4


@given(st.integers(1, 10**6), st.integers(1, 512))
def test_the_replicas_partitions_share_the_budget_without_exceeding_it(
    budget: int, partitions: int
) -> None:
    per_partition = partition_cache_capacity(budget, partitions)
    assert per_partition >= 1
    assert per_partition * partitions <= max(budget, partitions)
