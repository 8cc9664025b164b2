"""The replica side of benchmarks/restore.py, run in a process of its own.

A fresh process, so that its CPU seconds and its resident memory are the replica's alone
(the generator's templates and id lists live in the parent). It does what a replica does on
assignment: opens every partition's RocksDB table, restores them all at once with
``restore_partitions`` (one consumer, as ``_assigned`` does), and then serves: it starts
running instances (a workflow parked on an external event, so each cached instance keeps
its execution) through the processor's turn logic until every partition's cache is full,
and then as many again, to show that the budget (``cache_instances``) bounds the cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import CpuSpan, progress

import engine.examples.chain3  # noqa: F401  (registers chain3.inline)
from engine import WorkflowContext, workflow
from engine.adapters.kafka.processor import restore_partitions
from engine.adapters.rocks_store import RocksPartitionStore
from engine.codec import encode_message
from engine.config.settings import load_settings
from engine.config.topics import topic_names
from engine.core.history import RuntimeStatus
from engine.core.keys import murmur2_partition
from engine.core.messages import StartWorkflow
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import default_registry
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.state import partition_cache_capacity
from engine.services.records import RawRecord

PARKED = "bench.parked"
FILL_BATCH = 200  # starts per partition and committed batch while filling the caches


@workflow(name=PARKED)
async def parked(ctx: WorkflowContext, x: int) -> int:
    """Waits for an event that never comes: its instance stays running, execution cached."""
    return x + int(await ctx.wait_for_event("go"))


@dataclass(frozen=True)
class ReplicaJob:
    bootstrap: str
    namespace: str
    partitions: int
    cache_instances: int
    broker_pid: int | None
    sample: list[tuple[str, int]]


def rss_mib() -> tuple[float, float]:
    """This process's resident set and its peak (VmRSS, VmHWM), in MiB."""
    found: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(rest.split()[0]) / 1024
    return round(found["VmRSS"], 1), round(found["VmHWM"], 1)


def run_replica(job: ReplicaJob) -> dict[str, Any]:
    """Restore, verify, fill the caches; return the measurements."""
    settings = load_settings(
        bootstrap_servers=job.bootstrap, namespace=job.namespace, partitions=job.partitions
    )
    topics = topic_names(job.namespace)
    capacity = partition_cache_capacity(job.cache_instances, job.partitions)
    env = Environment(
        registry=default_registry,
        topics=topics,
        partitions=job.partitions,
        pending_events_max=settings.pending_events_max,
        pending_events_ttl_ms=settings.pending_events_ttl_ms,
        cache_capacity=capacity,
    )
    state_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-restore-"))
    pids = {"broker": job.broker_pid} if job.broker_pid is not None else {}
    try:
        pps = {
            p: PartitionProcessor(p, RocksPartitionStore(state_dir / f"p{p}"), env)
            for p in range(job.partitions)
        }
        rss_before, _ = rss_mib()
        with CpuSpan(pids) as cpu:
            report = restore_partitions(settings, topics, pps)
        rss_restored, peak_restored = rss_mib()
        progress(f"restore: {report.records} records restored in {cpu.wall:.2f}s")
        verify(pps, job.sample, job.partitions)
        memory = fill_caches(pps, topics, capacity)
        for pp in pps.values():
            pp.close()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return {
        "records": report.records,
        "restore_s": round(cpu.wall, 3),
        "cpu_s": cpu.seconds(),
        "replica_cpu_s": round(cpu.client_s, 3),
        "rss_mib": {"before": rss_before, "restored": rss_restored, "peak": peak_restored},
        "cache": memory,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def verify(
    pps: dict[int, PartitionProcessor], sample: list[tuple[str, int]], partitions: int
) -> None:
    """Spot-check restored rows: each sampled instance is completed with its output."""
    for instance_id, expected in sample:
        pp = pps[murmur2_partition(instance_id.encode(), partitions)]
        meta = pp.tables.load_meta(instance_id)
        if meta is None or meta.status is not RuntimeStatus.COMPLETED or meta.output is None:
            raise AssertionError(f"instance {instance_id} was not restored as completed: {meta}")
        if from_payload(meta.output) != expected:
            raise AssertionError(f"instance {instance_id} restored with output {meta.output}")


def fill_caches(pps: dict[int, PartitionProcessor], topics: Any, capacity: int) -> dict[str, Any]:
    """Start parked instances until every cache is full (RSS then), then as many again
    (RSS again: a bounded cache evicts, so memory must not grow by another cache)."""
    started = _start_parked(pps, topics, capacity, first=0)
    cached = sum(len(pp.cache) for pp in pps.values())
    full, _ = rss_mib()
    _start_parked(pps, topics, capacity, first=started)
    cached_after = sum(len(pp.cache) for pp in pps.values())
    over, _ = rss_mib()
    if cached_after > capacity * len(pps):
        raise AssertionError(f"{cached_after} instances cached, budget {capacity * len(pps)}")
    return {
        "capacity_per_partition": capacity,
        "cached": cached,
        "rss_full_mib": full,
        "started_twice_the_budget": cached_after,
        "rss_after_twice_mib": over,
    }


def _start_parked(
    pps: dict[int, PartitionProcessor], topics: Any, per_partition: int, first: int
) -> int:
    """Start ``per_partition`` parked instances on every partition; returns the next index."""
    n = first
    for p, pp in pps.items():
        for done in range(0, per_partition, FILL_BATCH):
            for _ in range(min(FILL_BATCH, per_partition - done)):
                instance_id = _id_on(p, len(pps), n)
                start = StartWorkflow(instance_id, PARKED, to_payload(n), request_id=f"f{n}")
                value = encode_message(start)
                record = RawRecord(p, n, instance_id.encode(), value, 0, topics.commands)
                pp.accept(record, 0)
                n += 1
            pp.end_batch(0)
            pp.committed({})
        progress(f"restore: partition {p}: {len(pp.cache)} instances cached")
    return n


def _id_on(partition: int, partitions: int, n: int) -> str:
    """An instance id that the key hash puts on ``partition``."""
    suffix = 0
    while True:
        candidate = f"parked-{n}-{suffix}"
        if murmur2_partition(candidate.encode(), partitions) == partition:
            return candidate
        suffix += 1
