"""The processor's turnstile_instances_by_version gauge: open instances per workflow and
version, moved by committed turns (on engine.testing's real partition state machines),
with a bounded number of label pairs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from engine import Registry, WorkflowContext
from engine.adapters import metrics
from engine.adapters.metrics import ProcessorMetrics
from engine.config.topics import topic_names
from engine.core.history import RuntimeStatus
from engine.core.instance_row import InstanceRow
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.state import Progress
from engine.testing import TestEngine


@dataclass
class Replica:
    progress: Progress = field(default_factory=Progress)
    partitions: dict[int, PartitionProcessor] = field(default_factory=dict)
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    ready: bool = True
    standby_lag: dict[int, int] = field(default_factory=dict)
    standby_applied: int = 0


def _gauge(registry: CollectorRegistry, name: str, version: str) -> float | None:
    labels = {"name": name, "version": version}
    return registry.get_sample_value("turnstile_instances_by_version", labels)


def _registry(*versions: str) -> Registry:
    registry = Registry()
    for version in versions:

        async def wait(ctx: WorkflowContext) -> None:
            await ctx.wait_for_event("go")

        registry.add_workflow(wait, name="waits", version=version)
    return registry


def test_the_gauge_follows_starts_ends_and_new_defaults() -> None:
    with TestEngine(_registry("1"), partitions=2) as env:
        m = ProcessorMetrics()
        m.watch(Replica(partitions=env.processors))
        for pp in env.processors.values():
            pp.count_statuses()
        first = [env.start("waits") for _ in range(3)]
        env.run()
        assert _gauge(m.registry, "waits", "1") == 3
        env.deploy(_registry("1", "2"))
        second = env.start("waits")
        env.raise_event(first[0], "go")
        env.run()
        assert _gauge(m.registry, "waits", "1") == 2
        assert _gauge(m.registry, "waits", "2") == 1
        for run in [*first[1:], second]:
            env.raise_event(run, "go")
        env.run()
        assert _gauge(m.registry, "waits", "1") is None  # no open instance: no sample
        assert _gauge(m.registry, "waits", "2") is None
        state = env.get(second)
        assert state is not None and state.status is RuntimeStatus.COMPLETED


def test_label_pairs_are_bounded() -> None:
    env = Environment(Registry(), topic_names("t"), 10, 1000, 3600_000)
    pp = PartitionProcessor(0, MemoryPartitionStore(), env)
    pp.count_statuses()
    batch = pp.batch
    for i in range(metrics.MAX_VERSION_LABELS + 5):
        meta = batch.load(f"i-{i}").meta
        meta.status, meta.name, meta.version = RuntimeStatus.RUNNING, "w", f"v{i}"
        batch.save(meta)
    for i in range(3):  # the most used version keeps its label
        meta = batch.load(f"j-{i}").meta
        meta.status, meta.name, meta.version = RuntimeStatus.SUSPENDED, "w", "v0"
        batch.save(meta)
    pp.end_batch(0)
    pp.committed({})
    m = ProcessorMetrics()
    m.watch(Replica(partitions={0: pp}))
    samples = [
        s
        for f in m.registry.collect()
        if f.name == "turnstile_instances_by_version"
        for s in f.samples
    ]
    assert len(samples) == metrics.MAX_VERSION_LABELS + 1
    assert _gauge(m.registry, "w", "v0") == 4
    assert _gauge(m.registry, metrics.OTHER, metrics.OTHER) == 5


ROW = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from(list(RuntimeStatus)),
    st.sampled_from(["w", "x"]),
    st.sampled_from(["", "1", "2"]),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.lists(ROW, max_size=4), st.booleans(), st.booleans()), max_size=8))
def test_moved_counts_equal_a_fresh_count(batches: list[tuple[list[Any], bool, bool]]) -> None:
    """Batches change rows (status, workflow, version), purge one, commit or roll back:
    the counts kept up to date equal a count of the committed rows from scratch."""
    env = Environment(Registry(), topic_names("t"), 10, 1000, 3600_000)
    pp = PartitionProcessor(0, MemoryPartitionStore(), env)
    kept = pp.count_statuses()
    for rows, purge, commit in batches:
        batch = pp.batch
        for instance_id, status, name, version in rows:
            meta = batch.load(instance_id).meta
            meta.status, meta.name, meta.version = status, name, version
            batch.save(meta)
        if purge and rows:  # as the purge handler does: the row goes, a blank stays
            item = batch.load(rows[0][0])
            batch.remove(item.meta)
            item.meta = InstanceRow(rows[0][0])
        pp.end_batch(0)
        if commit:
            pp.committed({})
        else:
            pp.rolled_back()
    assert kept.versions() == pp.count_statuses().versions()
    assert {s: n for s, n in kept.snapshot().items() if n} == pp.statuses.snapshot()  # type: ignore[union-attr]
