"""Restore time and memory: how long a replica takes to rebuild its tables from the
changelogs, and what it then holds in memory.

This is the cost of a failover or a fresh replica before it processes anything. Running a
million instances through the engine would take hours on the shared machine, so the
changelog is written directly, with the records the processor writes: the first
``--stepped`` instances are real ``chain3.inline`` starts stepped by the processor's own
turn logic (``PartitionProcessor`` on a throwaway in-memory table), and their changelog
records (history rows, the instance row) are produced to the topic, on the instance's
partition, in transactions; every further instance copies one of those instances' records
with the instance id replaced by a fresh one (same length, so every key layout and Avro
length is the processor's), on the fresh id's partition.

Then a fresh process (``restore_replica.py``) does what a replica does on assignment: it
restores every partition at once with ``restore_partitions`` into fresh RocksDB folders,
spot-checks the rows, and fills its instance caches to the budget and past it. Reported:
wall time, the replica's and the broker's CPU seconds over the restore, the replica's RSS
after the restore and with a full cache, and the memory per cached instance.

    .venv/bin/python benchmarks/restore.py [--instances 100000] [--partitions 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import harness
from common import emit, git_commit, host_info, progress
from restore_replica import ReplicaJob, run_replica

import engine.examples.chain3  # noqa: F401  (registers chain3.inline)
from engine.adapters.kafka.config import transactional_producer_config
from engine.adapters.kafka.io import TransactionalProducer
from engine.codec import encode_message
from engine.config.settings import Settings
from engine.config.topics import TopicNames, topic_names
from engine.core.keys import murmur2_partition
from engine.core.messages import StartWorkflow
from engine.core.payloads import to_payload
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
    #: instances run through the turn logic; the others copy their records (see generate)
    stepped: int = 20_000
    #: the replica's cache budget (setting cache_instances) while it serves after restore
    cache_instances: int = 10_000


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


def _environment(topics: TopicNames, settings: Settings, cache: int) -> Environment:
    return Environment(
        registry=default_registry,
        topics=topics,
        partitions=settings.partitions,
        pending_events_max=settings.pending_events_max,
        pending_events_ttl_ms=settings.pending_events_ttl_ms,
        cache_capacity=cache,
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


def generate(
    settings: Settings, topics: TopicNames, params: Params
) -> tuple[dict[int, int], list[tuple[str, int]]]:
    """Write the changelog of ``params.instances`` completed instances: the first
    ``params.stepped`` run through the processor's turn logic, the rest are copies of their
    records under fresh instance ids. Returns records per partition and a sample of
    (instance id, expected output) pairs for :func:`verify`."""
    writer = ChangelogWriter(settings)
    try:
        templates = _step(settings, topics, min(params.stepped, params.instances), writer)
        sample = _clone(settings, templates, params.instances, writer)
    finally:
        writer.close()
    return writer.written, sample


#: One stepped instance: its id, its input, and its changelog records (topic, key, value).
Template = tuple[str, int, list[tuple[str, bytes, bytes | None]]]


def _step(
    settings: Settings, topics: TopicNames, n: int, writer: ChangelogWriter
) -> list[Template]:
    """Run n chain3.inline starts through the turn logic; write and keep their records."""
    env = _environment(topics, settings, BATCH)
    pps = [PartitionProcessor(p, NullStore(), env) for p in range(settings.partitions)]
    records: dict[str, list[tuple[str, bytes, bytes | None]]] = {}
    inputs: dict[str, int] = {}
    for i in range(n):
        instance_id = uuid.uuid4().hex
        inputs[instance_id] = i
        records[instance_id] = []
        p = murmur2_partition(instance_id.encode(), settings.partitions)
        start = StartWorkflow(instance_id, WORKFLOW, to_payload(i), request_id=f"r{i}")
        record = RawRecord(
            p, i, instance_id.encode(), encode_message(start), NOW_MS + i, topics.commands
        )
        pps[p].accept(record, NOW_MS + i)
        if (i + 1) % BATCH == 0 or i == n - 1:
            _end_batches(pps, topics, writer, records, NOW_MS + i)
        if (i + 1) % 20_000 == 0:
            progress(f"restore: stepped {i + 1} instances through the turn logic")
    return [(iid, inputs[iid], rows) for iid, rows in records.items()]


def _end_batches(
    pps: list[PartitionProcessor],
    topics: TopicNames,
    writer: ChangelogWriter,
    records: dict[str, list[tuple[str, bytes, bytes | None]]],
    now_ms: int,
) -> None:
    changelogs = {topics.state_changelog, topics.timer_changelog}
    for pp in pps:
        batch = pp.end_batch(now_ms)
        for record in batch.out:
            if record.topic in changelogs:
                assert record.partition == pp.partition and record.key is not None
                writer.write(record.topic, record.key, record.value, pp.partition)
                # meta and history keys: one prefix byte, then the 32-character instance id
                records[record.key[1:33].decode()].append((record.topic, record.key, record.value))
        pp.committed({})


def _clone(
    settings: Settings, templates: list[Template], n: int, writer: ChangelogWriter
) -> list[tuple[str, int]]:
    """Write instances len(templates)..n-1 as copies of the templates' records, with each
    template's instance id replaced by a fresh one (same length, so every Avro length and
    key layout stays as the processor wrote it), on the fresh id's partition."""
    sample_every = max(n // 100, 1)
    sample = [(iid, x + 3) for iid, x, _ in templates[:: max(len(templates) // 20, 1)]]
    for i in range(len(templates), n):
        base_id, x, rows = templates[i % len(templates)]
        instance_id = uuid.uuid4().hex
        old, new = base_id.encode(), instance_id.encode()
        p = murmur2_partition(new, settings.partitions)
        for topic, key, value in rows:
            writer.write(topic, key.replace(old, new), _swap(value, old, new), p)
        if i % sample_every == 0:
            sample.append((instance_id, x + 3))
        if (i + 1) % 100_000 == 0:
            progress(f"restore: wrote {i + 1} instances")
    return sample


def _swap(value: bytes | None, old: bytes, new: bytes) -> bytes | None:
    return None if value is None else value.replace(old, new)


def run(broker: harness.Broker, params: Params) -> dict[str, Any]:
    namespace = harness.fresh_namespace("restore")
    settings = harness.create_topics(broker.bootstrap, namespace, params.partitions)
    topics = topic_names(namespace)
    progress(f"restore: writing the changelog of {params.instances} instances ({namespace})")
    t0 = time.perf_counter()
    written, sample = generate(settings, topics, params)
    progress(f"restore: changelog written in {time.perf_counter() - t0:.1f}s; restoring")
    job = ReplicaJob(
        broker.bootstrap,
        namespace,
        params.partitions,
        params.cache_instances,
        broker.pid,
        sample,
    )
    replica = _in_own_process(job)
    records = replica["records"]
    if records != sum(written.values()):
        raise AssertionError(f"restored {records} records, wrote {sum(written.values())}")
    result = {
        "benchmark": "restore",
        "params": asdict(params),
        "host": host_info(),
        "commit": git_commit(),
        "instances_per_s": round(params.instances / replica["restore_s"]),
        "records_per_s": round(records / replica["restore_s"]),
        **replica,
    }
    emit(result)
    progress(f"restore: {params.instances} instances in {replica['restore_s']:.2f}s")
    return result


def _in_own_process(job: ReplicaJob) -> dict[str, Any]:
    """Run the replica side in a fresh interpreter (its CPU and memory are its own)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result: dict[str, Any] = pool.apply(run_replica, (job,))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--stepped",
        type=int,
        default=Params.stepped,
        help="instances run through the turn logic; the others copy their records",
    )
    parser.add_argument(
        "--cache-instances",
        type=int,
        default=Params.cache_instances,
        help="the replica's cache budget while it serves after the restore",
    )
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument(
        "--broker-pid", type=int, help="with --bootstrap-servers: its PID, to read its CPU"
    )
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    params = Params(
        args.instances, args.partitions, stepped=args.stepped, cache_instances=args.cache_instances
    )
    with harness.kafka(args.bootstrap_servers) as broker:
        if args.broker_pid is not None:
            broker = harness.Broker(broker.bootstrap, args.broker_pid)
        result = run(broker, params)
    if not args.no_results_md:
        import results_md

        results_md.add_restore(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
