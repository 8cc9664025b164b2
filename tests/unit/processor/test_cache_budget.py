"""The hot-instance cache is bounded by its budget and protects running instances.

The budget (setting ``cache_instances``) is what bounds a replica's memory for instances,
so these tests fill caches past it, through the real turn logic and through the replica's
own split of the budget over partitions. What leaves a full cache first: instances
without a loaded execution (ended ones), then idle running ones, then newcomers - so a
working set larger than the cache keeps ``capacity`` instances hot instead of replaying
every instance on every turn, as least-recently-used eviction does."""

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
from engine.runtime.executor import WorkflowExecution
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.state import (
    IDLE_AFTER_MS,
    InstanceCache,
    Loaded,
    partition_cache_capacity,
)
from engine.services.records import RawRecord

registry = Registry()
TOPICS = topic_names("t")


@registry.workflow(name="parked")
async def parked(ctx: WorkflowContext, x: int) -> Any:
    return x + int(await ctx.wait_for_event("go"))


@registry.workflow(name="quick")
async def quick(ctx: WorkflowContext, x: int) -> Any:
    return x


def _processor(capacity: int) -> PartitionProcessor:
    env = Environment(registry, TOPICS, 1, 2, 10**6, cache_capacity=capacity)
    return PartitionProcessor(0, MemoryPartitionStore(), env)


class _Log:
    """Offsets of one test's input records."""

    def __init__(self) -> None:
        self.offset = 0

    def turn(self, pp: PartitionProcessor, key: str, value: bytes, now_ms: int = 1000) -> None:
        pp.accept(RawRecord(0, self.offset, key.encode(), value, now_ms, TOPICS.commands), now_ms)
        self.offset += 1
        pp.end_batch(now_ms)
        pp.committed({})

    def start(self, pp: PartitionProcessor, name: str, workflow: str, now_ms: int = 1000) -> None:
        start = StartWorkflow(name, workflow, to_payload(1), request_id=f"s-{name}")
        self.turn(pp, name, encode_message(start), now_ms)

    def go(self, pp: PartitionProcessor, name: str, now_ms: int = 1000) -> None:
        self.turn(pp, name, encode_message(RaiseEvent(name, "go", to_payload(100))), now_ms)


def _running(name: str) -> Loaded:
    return Loaded(InstanceRow(name), WorkflowExecution(registry, name))


def _cheap(name: str) -> Loaded:
    return Loaded(InstanceRow(name))


def test_running_instances_stay_hot_while_newcomers_past_the_budget_replay() -> None:
    pp, log = _processor(capacity=4), _Log()
    for i in range(8):
        log.start(pp, f"w{i}", "parked")
        assert len(pp.cache) <= 4
    misses = pp.counters.cache_misses
    for i in range(4):  # the first four kept their place: no replay
        log.go(pp, f"w{i}")
    assert pp.counters.cache_misses == misses
    for i in range(4, 8):  # the newcomers were turned away: each is rebuilt from its rows
        log.go(pp, f"w{i}")
    assert pp.counters.cache_misses == misses + 4
    meta = pp.tables.load_meta("w7")
    assert meta is not None and meta.status is RuntimeStatus.COMPLETED
    assert meta.output is not None and from_payload(meta.output) == 101
    assert len(pp.cache) == 4


def test_ended_instances_leave_before_running_ones() -> None:
    pp, log = _processor(capacity=4), _Log()
    log.start(pp, "ended-0", "quick")
    log.start(pp, "running-0", "parked")
    log.start(pp, "ended-1", "quick")
    log.start(pp, "running-1", "parked")
    for i in range(2, 4):  # two more running instances take the ended ones' places
        log.start(pp, f"running-{i}", "parked")
    assert [pp.cache.get(f"ended-{i}") for i in range(2)] == [None, None]
    assert all(pp.cache.get(f"running-{i}") is not None for i in range(4))


def test_an_idle_instance_gives_its_place_to_a_busy_one() -> None:
    pp, log = _processor(capacity=2), _Log()
    log.start(pp, "sleeper", "parked", now_ms=1000)
    log.start(pp, "busy", "parked", now_ms=2000)
    later = 1000 + IDLE_AFTER_MS + 1  # the sleeper is idle, the busy one is not yet
    log.start(pp, "newcomer", "parked", now_ms=later)
    assert pp.cache.get("sleeper") is None
    assert pp.cache.get("busy") is not None and pp.cache.get("newcomer") is not None


def test_a_turn_that_is_rolled_back_leaves_nothing_in_the_cache() -> None:
    pp = _processor(capacity=4)
    start = StartWorkflow("w", "parked", to_payload(1), request_id="s")
    pp.accept(RawRecord(0, 0, b"w", encode_message(start), 1000, TOPICS.commands), 1000)
    pp.end_batch(1000)
    pp.rolled_back()
    assert len(pp.cache) == 0 and pp.cache.get("w") is None


# One step of the model: a batch loads these ids (True: its turn leaves it running), then
# commits at a clock that moved on by the given ms.
_batches = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 30), st.booleans()), min_size=1, max_size=8),
        st.sampled_from([0, 1, IDLE_AFTER_MS // 2, IDLE_AFTER_MS + 1]),
    ),
    max_size=40,
)


@given(st.integers(1, 12), _batches)
def test_eviction_follows_the_documented_order(
    capacity: int, batches: list[tuple[list[tuple[int, bool]], int]]
) -> None:
    cache = InstanceCache(capacity)
    now = 0
    known: dict[str, Loaded] = {}
    used: dict[str, int] = {}
    for loads, step in batches:
        now += step
        touched: dict[str, Loaded] = {}
        fresh: set[str] = set()
        for number, running in loads:
            name = str(number)
            item = cache.get(name)
            if item is None:
                item = known[name] = _cheap(name)
                cache.put(name, item)
                fresh.add(name)
            item.execution = WorkflowExecution(registry, name) if running else None
            touched[name] = item
        before = {name for name in known if cache.get(name) is not None}
        for name, item in touched.items():
            cache.keep(name, item, now)
            used[name] = now
        cache.trim(now)
        kept = {name for name in before if cache.get(name) is not None}
        assert len(cache) == len(kept) == min(capacity, len(before))
        _check_order(
            known,
            before - kept,
            kept,
            fresh,
            {name for name in before if now - used[name] >= cache.idle_ms},
        )


def _check_order(
    known: dict[str, Loaded], dropped: set[str], kept: set[str], fresh: set[str], idle: set[str]
) -> None:
    """What one trim dropped respects the order: cheap, idle, newcomers, the rest."""
    running = {name for name in dropped | kept if known[name].execution is not None}
    if dropped & running:
        assert not kept - running, "a cheap entry stayed while a running one left"
    if (dropped & running) - idle:
        assert not kept & idle, "an idle instance stayed while a busy one left"
    if (dropped & running) - idle - fresh:
        assert not kept & fresh, "a newcomer stayed while a busy resident left"


@given(st.integers(1, 20), st.lists(st.integers(0, 40), max_size=200))
def test_the_cache_never_holds_more_than_its_capacity_after_a_commit(
    capacity: int, ids: list[int]
) -> None:
    cache = InstanceCache(capacity)
    for now, i in enumerate(ids):
        item = cache.get(str(i)) or _cheap(str(i))
        cache.put(str(i), item)
        cache.keep(str(i), item, now)
        cache.trim(now)
        assert len(cache) <= capacity
    assert len(cache) == min(capacity, len(set(ids)))


@given(st.integers(1, 10**6), st.integers(1, 512))
def test_the_replicas_partitions_share_the_budget_without_exceeding_it(
    budget: int, partitions: int
) -> None:
    per_partition = partition_cache_capacity(budget, partitions)
    assert per_partition >= 1
    assert per_partition * partitions <= max(budget, partitions)
