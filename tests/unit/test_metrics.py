"""Metrics fed from the processor's counters and the worker's observer; the worker's offset
tracker commits past transaction markers only where nothing is running."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from engine.adapters.metrics import MetricsServer, ProcessorMetrics, WorkerMetrics
from engine.config.topics import topic_names
from engine.core.errors import ConfigurationError
from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    ExecutionStarted,
    RuntimeStatus,
    TaskScheduled,
)
from engine.runtime.registry import Registry
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Counters, Environment, PartitionProcessor
from engine.services.processor.protocol import Step
from engine.services.processor.state import Progress
from engine.services.worker.worker import OffsetTracker


def _get(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_counters_tally_runs_by_workflow_and_outcome() -> None:
    c = Counters()
    c.recorded("", "", ExecutionStarted("w", version="2"))
    c.recorded("w", "2", TaskScheduled(1, "a"))
    c.recorded("w", "2", ExecutionCompleted(RuntimeStatus.FAILED))
    c.recorded("w", "2", ContinuedAsNew())
    c.reject("RaiseEvent")
    c.reject("RaiseEvent")
    assert c.workflow_runs == {
        ("w", "2", "started"): 1,
        ("w", "2", "failed"): 1,
        ("w", "2", "continued_as_new"): 1,
    }
    assert c.rejected == 2 and c.rejected_kinds == {"RaiseEvent": 2}


def test_counters_add_merges_the_labelled_tallies_and_timer_buckets() -> None:
    total, batch = Counters(), Counters()
    batch.dead_letter("CodecError")
    batch.timer_fired(3)
    batch.timer_fired(-2)  # a timer is never early: counted as on time
    batch.timer_fired(10**9)
    total.add(batch)
    total.add(batch)
    assert total.dead_letters == 2 and total.dead_letter_kinds == {"CodecError": 2}
    assert total.timers_fired == 6 and total.timer_late_ms == 2 * (3 + 10**9)
    assert total.timer_lateness == {5: 2, 1: 2, None: 2}


@dataclass
class Replica:
    """A processor replica's state as the metrics read it (``ProcessorRunner`` has these)."""

    progress: Progress = field(default_factory=Progress)
    partitions: dict[int, PartitionProcessor] = field(default_factory=dict)
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    ready: bool = False
    standby_lag: dict[int, int] = field(default_factory=dict)
    standby_applied: int = 0


def _batch(m: ProcessorMetrics, records: int, produced: int, *, commit: bool = True) -> None:
    """The hook calls of one batch, in protocol order."""
    for step, count in [(Step.POLL, records), (Step.ACCEPT, records), (Step.TIMERS, 0)]:
        m.observe(step, 0.001, count)
    m.observe(Step.STEP, 0.002, records)
    if not commit:
        m.observe(Step.ABORT, 0.001, 1)
        return
    for step, count in [(Step.PRODUCE, produced), (Step.OFFSETS, 1), (Step.COMMIT, 1)]:
        m.observe(step, 0.001, count)
    m.observe(Step.APPLY, 0.001, produced)


def test_processor_metrics_take_the_protocol_steps_and_forget_an_aborted_batch() -> None:
    m = ProcessorMetrics()
    _batch(m, 4, 9)
    _batch(m, 1, 0, commit=False)
    _batch(m, 2, 3)
    r = m.registry
    assert _get(r, "turnstile_transactions_total") == 2
    assert _get(r, "turnstile_transaction_aborts_total") == 1
    assert _get(r, "turnstile_records_out_total") == 12
    assert _get(r, "turnstile_batch_records_count") == 2
    assert _get(r, "turnstile_batch_records_sum") == 6
    assert _get(r, "turnstile_turn_duration_seconds_count") == 3
    for phase in ("produce", "offsets", "commit"):
        assert _get(r, "turnstile_transaction_phase_seconds_count", phase=phase) == 2


def test_each_commit_counts_its_own_batch_when_the_next_batch_runs_during_it() -> None:
    """The loop reports the next batch's accepts and turns before the previous commit."""
    m = ProcessorMetrics()
    for step, count in [(Step.ACCEPT, 4), (Step.TIMERS, 0), (Step.STEP, 4), (Step.PRODUCE, 9)]:
        m.observe(step, 0.001, count)
    for step, count in [(Step.ACCEPT, 2), (Step.TIMERS, 0), (Step.STEP, 2)]:
        m.observe(step, 0.001, count)
    for step, count in [(Step.OFFSETS, 1), (Step.COMMIT, 1), (Step.APPLY, 9)]:
        m.observe(step, 0.001, count)
    assert _get(m.registry, "turnstile_batch_records_sum") == 4
    assert _get(m.registry, "turnstile_records_out_total") == 9
    for step, count in [(Step.PRODUCE, 3), (Step.OFFSETS, 1), (Step.COMMIT, 1)]:
        m.observe(step, 0.001, count)
    assert _get(m.registry, "turnstile_batch_records_sum") == 6
    assert _get(m.registry, "turnstile_records_out_total") == 12


def _partition(statuses: dict[str, RuntimeStatus]) -> PartitionProcessor:
    env = Environment(Registry(), topic_names("t"), 10, 1000, 3600_000)
    pp = PartitionProcessor(0, MemoryPartitionStore(), env)
    _write(pp, statuses)
    return pp


def _write(pp: PartitionProcessor, statuses: dict[str, RuntimeStatus], commit: bool = True) -> None:
    batch = pp.batch
    for instance_id, status in statuses.items():
        item = batch.load(instance_id)
        item.meta.status = status
        batch.save(item.meta)
    pp.end_batch(0)
    if commit:
        pp.committed({})
    else:
        pp.rolled_back()


def test_a_scrape_reads_the_replicas_totals_partitions_and_lag() -> None:
    m = ProcessorMetrics()
    r = m.registry
    assert _get(r, "turnstile_turns_total") == 0  # nothing watched yet: zeros
    replica = Replica()
    m.watch(replica)
    counters = Counters(turns=3, cache_hits=2, cache_misses=1)
    counters.topics["cmds"] = 4
    counters.dead_letter("CodecError")
    counters.reject("RaiseEvent")
    counters.outcome("StartWorkflow", "refused")
    counters.refuse("StartWorkflow", "WorkflowAlreadyRunningError")
    counters.recorded("w", "1", ExecutionStarted("w", version="1"))
    counters.timer_fired(30)
    replica.progress.add(counters)
    replica.progress.restores, replica.progress.restore_s = 1, 0.5
    replica.partitions[3] = _partition({"a": RuntimeStatus.RUNNING})
    replica.lag[("cmds", 3)] = 7
    assert _get(r, "turnstile_turns_total") == 3
    assert _get(r, "turnstile_records_in_total", topic="cmds") == 4
    assert _get(r, "turnstile_dead_letters_total", reason="CodecError") == 1
    assert _get(r, "turnstile_rejected_total", kind="RaiseEvent") == 1
    refused = {"command": "StartWorkflow", "result": "refused"}
    assert _get(r, "turnstile_command_outcomes_total", **refused) == 1
    why = {"command": "StartWorkflow", "error": "WorkflowAlreadyRunningError"}
    assert _get(r, "turnstile_command_refusals_total", **why) == 1
    runs = {"workflow": "w", "version": "1", "event": "started"}
    assert _get(r, "turnstile_workflow_runs_total", **runs) == 1
    assert _get(r, "turnstile_timer_lateness_seconds_bucket", le="0.025") == 0
    assert _get(r, "turnstile_timer_lateness_seconds_bucket", le="0.05") == 1
    assert _get(r, "turnstile_timer_lateness_seconds_sum") == 0.03
    assert _get(r, "turnstile_instance_cache_lookups_total", result="miss") == 1
    assert _get(r, "turnstile_restore_seconds_total") == 0.5
    assert _get(r, "turnstile_partitions_owned") == 1
    assert _get(r, "turnstile_instance_cache_size", partition="3") == 1
    assert _get(r, "turnstile_consumer_lag_records", topic="cmds", partition="3") == 7
    # instances per status only once the partition counted them
    assert _get(r, "turnstile_instances", partition="3", status="RUNNING") is None
    replica.partitions[3].count_statuses()
    assert _get(r, "turnstile_instances", partition="3", status="RUNNING") == 1
    assert _get(r, "turnstile_instances", partition="3", status="FAILED") == 0


def test_a_scrape_reads_the_standby_copies_lag() -> None:
    m = ProcessorMetrics()
    r = m.registry
    assert _get(r, "turnstile_standby_partitions") == 0
    replica = Replica()
    m.watch(replica)
    replica.standby_lag.update({1: 0, 5: 12})
    replica.standby_applied = 40
    assert _get(r, "turnstile_standby_lag_records", partition="5") == 12
    assert _get(r, "turnstile_standby_lag_records", partition="1") == 0
    assert _get(r, "turnstile_standby_partitions") == 2
    assert _get(r, "turnstile_standby_records_applied_total") == 40


def test_readiness_waits_for_the_first_restored_assignment() -> None:
    m = ProcessorMetrics()
    assert not m.ready
    replica = Replica()
    m.watch(replica)
    assert not m.ready
    replica.ready = True
    assert m.ready


def test_worker_metrics_read_load_at_scrape_time() -> None:
    m = WorkerMetrics()
    load = {"running": 2, "queued": 5}
    m.attach(lambda: load["running"], lambda: load["queued"])
    m.started("a")
    m.finished("a", "timeout", 0.3)
    r = m.registry
    assert _get(r, "turnstile_activity_attempts_total", activity="a") == 1
    assert _get(r, "turnstile_activity_results_total", activity="a", result="timeout") == 1
    assert _get(r, "turnstile_activities_in_flight") == 2
    load["queued"] = 0
    assert _get(r, "turnstile_activity_queue_depth") == 0


def test_caught_up_moves_only_idle_partitions_forward() -> None:
    t = OffsetTracker()
    t.assign([0, 1, 2])
    t.consumed(0, 10)
    t.consumed(1, 20)
    t.done(1, 20, 2)
    t.caught_up({0: 12, 1: 22, 2: 5})
    assert t.to_commit() == {0: 10, 1: 22, 2: 5}  # 0 still runs offset 10
    t.done(0, 10, 1)
    t.caught_up({0: 9})  # never backwards
    assert t.to_commit()[0] == 11


def test_the_endpoint_serves_metrics_health_and_readiness() -> None:
    m = ProcessorMetrics()
    server = MetricsServer(m.registry, port=0, ready=lambda: m.ready).start()
    try:

        def get(path: str) -> int:
            try:
                with urllib.request.urlopen(server.url + path, timeout=10) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert get("/healthz") == 200
        assert get("/readyz") == 503
        replica = Replica(ready=True)
        m.watch(replica)
        assert get("/readyz") == 200
        assert get("/metrics") == 200
        assert get("/other") == 404
        with pytest.raises(ConfigurationError, match="choose another --metrics-port"):
            MetricsServer(m.registry, port=server.port)
    finally:
        server.stop()


def test_partition_counts_instances_per_status_across_commits_and_rollbacks() -> None:
    pp = _partition({"a": RuntimeStatus.RUNNING})
    statuses = pp.count_statuses()
    assert statuses.snapshot() == {RuntimeStatus.RUNNING: 1}
    _write(pp, {"b": RuntimeStatus.RUNNING})
    _write(pp, {"a": RuntimeStatus.COMPLETED})
    _write(pp, {"b": RuntimeStatus.FAILED}, commit=False)  # aborted: no change
    _write(pp, {"b": RuntimeStatus.RUNNING})  # same status: nothing moved
    assert statuses.snapshot() == {RuntimeStatus.RUNNING: 1, RuntimeStatus.COMPLETED: 1}
    # a purge removes the row: the instance leaves the counts
    batch = pp.batch
    batch.remove(batch.load("a").meta)
    pp.end_batch(0)
    pp.committed({})
    assert statuses.snapshot() == {RuntimeStatus.RUNNING: 1, RuntimeStatus.COMPLETED: 0}
