"""Restore time: how long a replica takes to rebuild its tables from the changelogs.

This is the cost of a failover or a fresh replica before it processes anything. Running
100,000 instances through the engine would take minutes, so the changelog is written
directly, but with exactly the records the processor writes: every instance is a real
``chain3.inline`` start stepped by the processor's own turn logic (``PartitionProcessor``
on a throwaway in-memory table), and the changelog records that turn writes (history rows,
the instance row, any deletions) are produced to the topic, on the instance's partition,
in transactions. Then ``restore_partitions`` (the code a replica runs
on assignment) rebuilds every partition into a fresh RocksDB folder, one after the other as
a replica does, and the wall time is reported in total and per partition.

    .venv/bin/python benchmarks/restore.py [--instances 100000] [--partitions 8]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
from common import CpuSpan, emit, git_commit, host_info, progress

import engine.examples.chain3  # noqa: F401  (registers chain3.inline)
from engine.adapters.kafka_config import transactional_producer_config
from engine.adapters.kafka_io import TransactionalProducer
from engine.adapters.kafka_processor import restore_partitions
from engine.adapters.rocks_store import RocksPartitionStore
from engine.codec import encode_message
from engine.config.settings import Settings
from engine.config.topics import TopicNames, topic_names
from engine.core.history import RuntimeStatus
from engine.core.keys import murmur2_partition
from engine.core.messages import StartWorkflow
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import default_registry
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.records import RawRecord

WORKFLOW = "chain3.inline"
NOW_MS = 1_764_460_800_000
BATCH = 500  # instances per generated turn batch, like a busy processor's batch
TXN_RECORDS = 20_000  # records per transaction while writing the changelog


@dataclass(frozen=True)
class Params:
    instances: int = 100_000
    partitions: int = 8
    workflow: str = WORKFLOW


class NullStore:
    """A table that forgets writes: generation only needs each new instance's first turn."""

    def get(self, key: bytes) -> bytes | None:
        return None

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return iter(())

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        pass

    def close(self) -> None:
        pass


def _environment(topics: TopicNames, settings: Settings) -> Environment:
    return Environment(
        registry=default_registry,
        topics=topics,
        partitions=settings.partitions,
        pending_events_max=settings.pending_events_max,
        pending_events_ttl_ms=settings.pending_events_ttl_ms,
        cache_capacity=BATCH,
    )


class ChangelogWriter:
    """Produces changelog records in transactions of about TXN_RECORDS records."""

    def __init__(self, settings: Settings) -> None:
        txn_id = f"{settings.namespace}.bench-restore-writer"
        config = transactional_producer_config(settings.bootstrap_servers, txn_id)
        config.update({"linger.ms": 20, "batch.size": 1_000_000})
        self.producer = TransactionalProducer(config, txn_id, timeout_s=60)
        self.in_txn = 0
        self.written: dict[int, int] = {}

    def write(self, topic: str, key: bytes, value: bytes | None, partition: int) -> None:
        if self.in_txn == 0:
            self.producer.begin()
        self.producer.produce(topic, key, value, partition)
        self.written[partition] = self.written.get(partition, 0) + 1
        self.in_txn += 1
        if self.in_txn >= TXN_RECORDS:
            self.commit()

    def commit(self) -> None:
        if self.in_txn:
            self.producer.commit()
            self.in_txn = 0

    def close(self) -> None:
        self.commit()
        self.producer.close()


def generate(settings: Settings, topics: TopicNames, n: int) -> tuple[dict[int, int], list[str]]:
    """Run n chain3.inline starts through the processor's turn logic and write the changelog
    records they produce. Returns records per partition and the instance ids."""
    env = _environment(topics, settings)
    pps = [PartitionProcessor(p, NullStore(), env) for p in range(settings.partitions)]
    changelogs = {topics.state_changelog, topics.timer_changelog}
    writer = ChangelogWriter(settings)
    ids: list[str] = []
    try:
        for i in range(n):
            instance_id = uuid.uuid4().hex
            ids.append(instance_id)
            p = murmur2_partition(instance_id.encode(), settings.partitions)
            start = StartWorkflow(instance_id, WORKFLOW, to_payload(i), request_id=f"r{i}")
            record = RawRecord(
                p, i, instance_id.encode(), encode_message(start), NOW_MS + i, topics.commands
            )
            pps[p].accept(record, NOW_MS + i)
            if (i + 1) % BATCH == 0 or i == n - 1:
                _end_batches(pps, changelogs, writer, NOW_MS + i)
            if (i + 1) % 20_000 == 0:
                progress(f"restore: generated {i + 1} instances")
    finally:
        writer.close()
    return writer.written, ids


def _end_batches(
    pps: list[PartitionProcessor], changelogs: set[str], writer: ChangelogWriter, now_ms: int
) -> None:
    for pp in pps:
        batch = pp.end_batch(now_ms)
        for record in batch.out:
            if record.topic in changelogs:
                assert record.partition == pp.partition
                writer.write(record.topic, record.key, record.value, pp.partition)
        pp.committed({})


def restore_all(
    settings: Settings, topics: TopicNames, state_dir: Path
) -> tuple[list[dict[str, Any]], list[PartitionProcessor]]:
    """Restore every partition into a fresh folder, one after the other (as on assignment)."""
    env = _environment(topics, settings)
    per_partition: list[dict[str, Any]] = []
    pps = []
    for p in range(settings.partitions):
        pp = PartitionProcessor(p, RocksPartitionStore(state_dir / f"p{p}"), env)
        started = time.perf_counter()
        records = restore_partitions(settings, topics, {p: pp}).records
        per_partition.append(
            {"partition": p, "records": records, "s": round(time.perf_counter() - started, 3)}
        )
        pps.append(pp)
    return per_partition, pps


def verify(pps: list[PartitionProcessor], ids: list[str], partitions: int) -> None:
    """Spot-check restored rows: the instance is completed with input + 3."""
    step = max(len(ids) // 100, 1)
    for i in range(0, len(ids), step):
        pp = pps[murmur2_partition(ids[i].encode(), partitions)]
        meta = pp.tables.load_meta(ids[i])
        if meta is None or meta.status is not RuntimeStatus.COMPLETED or meta.output is None:
            raise AssertionError(f"instance {ids[i]} was not restored as completed: {meta}")
        if from_payload(meta.output) != i + 3:
            raise AssertionError(f"instance {ids[i]} restored with output {meta.output}")


def run(broker: harness.Broker, params: Params) -> dict[str, Any]:
    namespace = harness.fresh_namespace("restore")
    settings = harness.create_topics(broker.bootstrap, namespace, params.partitions)
    topics = topic_names(namespace)
    progress(f"restore: writing the changelog of {params.instances} instances ({namespace})")
    t0 = time.perf_counter()
    written, ids = generate(settings, topics, params.instances)
    progress(f"restore: changelog written in {time.perf_counter() - t0:.1f}s; restoring")
    state_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-restore-"))
    pids = {"broker": broker.pid} if broker.pid is not None else {}
    try:
        with CpuSpan(pids) as cpu:
            per_partition, pps = restore_all(settings, topics, state_dir)
        verify(pps, ids, params.partitions)
        for pp in pps:
            pp.close()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    records = sum(r["records"] for r in per_partition)
    if records != sum(written.values()):
        raise AssertionError(f"restored {records} records, wrote {sum(written.values())}")
    result = {
        "benchmark": "restore",
        "params": asdict(params),
        "host": host_info(),
        "commit": git_commit(),
        "records": records,
        "restore_s": round(cpu.wall, 3),
        "instances_per_s": round(params.instances / cpu.wall),
        "records_per_s": round(records / cpu.wall),
        "slowest_partition_s": max(r["s"] for r in per_partition),
        "per_partition": per_partition,
        "cpu_s": cpu.seconds(),
    }
    emit(result)
    progress(f"restore: {params.instances} instances in {cpu.wall:.2f}s")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    params = Params(args.instances, args.partitions)
    with harness.kafka(args.bootstrap_servers) as broker:
        result = run(broker, params)
    if not args.no_results_md:
        import results_md

        results_md.add_restore(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
