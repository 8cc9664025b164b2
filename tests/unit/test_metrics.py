"""Metrics fed from the processor's counters and the worker's observer; the worker's offset
tracker commits past transaction markers only where nothing is running."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from engine.adapters.metrics import MetricsServer, ProcessorMetrics, WorkerMetrics
from engine.core.errors import ConfigurationError
from engine.core.history import (
    ContinuedAsNew,
    ExecutionCompleted,
    ExecutionStarted,
    RuntimeStatus,
    TaskScheduled,
)
from engine.services.processor.partition import Counters, InstanceCache
from engine.services.worker import OffsetTracker


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
    assert c.workflow_events == {
        ("w", "2", "started"): 1,
        ("w", "2", "failed"): 1,
        ("w", "2", "continued_as_new"): 1,
    }
    assert c.rejected == 2 and c.rejected_kinds == {"RaiseEvent": 2}


def test_processor_metrics_count_a_batch_once_and_forget_an_aborted_one() -> None:
    m = ProcessorMetrics()
    cache = InstanceCache(10)
    cache.get("x")  # a miss
    counters = Counters(turns=3, dead_letter_kinds={"CodecError": 1}, timer_lateness_ms=[5])
    for _ in range(4):
        m.record_in("cmds")
    m.partition_batch(0, counters, cache)
    m.batch(outputs=9)
    m.record_in("cmds")
    m.abort()
    m.batch(outputs=0)
    r = m.registry
    assert _get(r, "turnstile_turns_total") == 3
    assert _get(r, "turnstile_records_in_total", topic="cmds") == 4
    assert _get(r, "turnstile_records_out_total") == 9
    assert _get(r, "turnstile_dead_letters_total", reason="CodecError") == 1
    assert _get(r, "turnstile_timer_lateness_seconds_count") == 1
    assert _get(r, "turnstile_instance_cache_lookups_total", result="miss") == 1
    assert _get(r, "turnstile_transaction_aborts_total") == 1
    assert _get(r, "turnstile_transactions_total") == 2
    assert _get(r, "turnstile_batch_records_sum") == 4
    m.partition_batch(0, Counters(), cache)  # same cache, nothing new: no double count
    assert _get(r, "turnstile_instance_cache_lookups_total", result="miss") == 1


def test_readiness_waits_for_the_first_restored_assignment() -> None:
    m = ProcessorMetrics()
    assert not m.ready
    m.partitions_owned([0, 1])
    assert m.ready and _get(m.registry, "turnstile_partitions_owned") == 2


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
        m.partitions_owned([])
        assert get("/readyz") == 200
        assert get("/metrics") == 200
        assert get("/other") == 404
        with pytest.raises(ConfigurationError, match="choose another --metrics-port"):
            MetricsServer(m.registry, port=server.port)
    finally:
        server.stop()


def test_partition_counts_instances_per_status_across_commits_and_rollbacks(
    tmp_path: object,
) -> None:
    from pathlib import Path

    from engine.adapters.rocks_store import RocksPartitionStore
    from engine.runtime.registry import Registry
    from engine.services.processor.handlers import save_meta
    from engine.services.processor.partition import Environment, PartitionProcessor
    from engine.services.topics import topic_names

    env = Environment(Registry(), topic_names("t"), 10, 1000)
    pp = PartitionProcessor(0, RocksPartitionStore(Path(str(tmp_path)) / "p0"), env)
    try:

        def write(instance_id: str, status: RuntimeStatus | None, commit: bool = True) -> bool:
            item = pp.load(instance_id)
            item.meta.status = status
            save_meta(pp, item.meta)
            _, changes = pp.end_batch(0)
            if not commit:
                pp.rolled_back()
                return False
            return pp.committed(changes, {})

        write("a", RuntimeStatus.RUNNING)
        pp.count_statuses()
        assert pp.status_counts == {RuntimeStatus.RUNNING: 1}
        assert write("b", RuntimeStatus.RUNNING)
        assert write("a", RuntimeStatus.COMPLETED)
        assert not write("b", RuntimeStatus.FAILED, commit=False)  # aborted: no change
        assert not write("b", RuntimeStatus.RUNNING)  # same status: nothing moved
        assert pp.status_counts == {RuntimeStatus.RUNNING: 1, RuntimeStatus.COMPLETED: 1}
        m = ProcessorMetrics()
        m.instance_statuses(0, pp.status_counts)
        assert _get(m.registry, "turnstile_instances", partition="0", status="RUNNING") == 1
        assert _get(m.registry, "turnstile_instances", partition="0", status="FAILED") == 0
    finally:
        pp.close()
