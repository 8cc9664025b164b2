"""Takeover while a dead replica's transaction is still open on a changelog partition.

A zombie's open transaction holds the changelog's last stable offset (LSO) back; records that
a later owner committed after it lie beyond the LSO. A replica that restores "to partition
EOF" would stop at the LSO, build stale tables and fork the history on top of them. Here a raw
transactional producer plays the zombie, the running replica commits more turns after it, and
a fresh replica takes over: it must not process before the open transaction ends, and its
tables must then equal what ``audit state`` derives from the history topic.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from engine_harness import EngineProcess, history_problems, running_engine, wait_until

from engine.adapters.kafka.config import consumer_config, expected_partition, producer_config
from engine.adapters.kafka.io import log_end_offsets
from engine.cli.main import main
from engine.core.history import EventRaised, RuntimeStatus
from engine.services.processor import keys

pytestmark = pytest.mark.kafka

PARTITIONS = 2
EARLY = 8
LATE = 8


def _zombie(
    bootstrap: str,
    *topics: str,
    partitions: int = PARTITIONS,
    transactional_id: str = "",
    offsets_of: tuple[str, str] | None = None,
) -> Producer:
    """A transactional producer that leaves a transaction open on every partition of
    ``topics`` (changelogs), under ``transactional_id`` or a fresh one; with ``offsets_of``
    (group, input topic) the transaction also holds that group's offsets of the input's
    partitions, as a replica killed between sending its offsets and committing leaves it."""
    config = producer_config(bootstrap, client_id="zombie")
    config.update(
        {
            "transactional.id": transactional_id or f"zombie-{uuid.uuid4().hex}",
            "transaction.timeout.ms": 300_000,
        }
    )
    zombie = Producer(config)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for topic in topics:
        for p in range(partitions):
            zombie.produce(topic, key=keys.meta_key("never-committed"), value=b"stale", partition=p)
    assert zombie.flush(30) == 0
    if offsets_of is not None:
        group, topic = offsets_of
        reader = Consumer(consumer_config(bootstrap, group))
        try:
            wanted = [TopicPartition(topic, p) for p in range(partitions)]
            at = [
                TopicPartition(t.topic, t.partition, max(t.offset, 0))
                for t in reader.committed(wanted, timeout=30)
            ]
            zombie.send_offsets_to_transaction(at, reader.consumer_group_metadata(), 30)
        finally:
            reader.close()
    return zombie


def _stable_and_end(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """Per partition: (last stable offset, log end offset)."""
    config = consumer_config(bootstrap, f"lso-{uuid.uuid4().hex}")
    wanted = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    ends = log_end_offsets(config, wanted)
    committed = Consumer(config)
    try:
        stable = [committed.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in wanted]
    finally:
        committed.close()
    return [(stable[p], ends[(topic, p)][1]) for p in range(PARTITIONS)]


def _running(engine: object, instance: str) -> bool:
    state = engine.client.get(instance)  # type: ignore[attr-defined]
    return state is not None and state.status is RuntimeStatus.RUNNING


def test_a_replica_does_not_restore_short_of_an_open_transaction(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, in_process=False, state_dir=tmp_path
    ) as engine:
        client, changelog = engine.client, engine.topics.state_changelog
        old = engine.processors["processor-0"]
        assert isinstance(old, EngineProcess)
        old.wait_for_log(" restored: ")
        early = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(EARLY)]
        client.flush()
        for instance in early:
            wait_until(lambda i=instance: _running(engine, i), 60, what=f"{instance} to run")

        zombie = _zombie(engine.bootstrap, changelog)
        # the live replica goes on committing turns after the zombie's open records
        for i, instance in enumerate(early[: EARLY // 2]):
            client.raise_event(instance, "go", i, wait=False)
        late = [client.start("t.wait_event", {"n": 100 + i}, flush=False) for i in range(LATE)]
        client.flush()
        for instance in early[: EARLY // 2]:
            assert engine.wait_for_completion(instance, 60).status is RuntimeStatus.COMPLETED
        for instance in late:
            wait_until(lambda i=instance: _running(engine, i), 60, what=f"{instance} to run")
        bounds = _stable_and_end(engine.bootstrap, changelog)
        assert all(stable < end for stable, end in bounds), bounds
        old.kill()

        new = engine.start_processor("processor-1")
        assert isinstance(new, EngineProcess)
        new.wait_for_log("waits for an open transaction")
        waiting = [*early[EARLY // 2 :], *late]
        for i, instance in enumerate(waiting):  # nothing is processed yet: only write
            client.raise_event(instance, "go", 1000 + i, wait=False)
        time.sleep(3.0)  # while the zombie's transaction is open, nothing may be processed
        assert " restored: " not in new.current_log(), new.current_log()[-3000:]
        assert all(_running(engine, i) for i in waiting)
        zombie.abort_transaction(30)

        new.wait_for_log(" restored: ")
        for i, instance in enumerate(waiting):
            state = engine.wait_for_completion(instance, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output["got"] == 1000 + i
        records = engine.history_records()
        problems = [
            p for instance in [*early, *late] for p in history_problems(instance, records[instance])
        ]
        assert not problems, "\n".join(problems[:20])
        for instance in [*early, *late]:
            raised = [e for _, e in records[instance] if isinstance(e.body, EventRaised)]
            assert len(raised) == 1, f"{instance}: the event was applied {len(raised)} times"
        assert new.stop() == 0

        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0
        replica = ["--state-dir", str(tmp_path / "processor-1"), "--replica-id", "processor-1"]
        assert main(["audit", "state", *replica, *cli]) == 0


@pytest.mark.parametrize("with_offsets", [False, True], ids=["records", "records-and-offsets"])
def test_a_replica_fences_the_open_transaction_of_an_owner_that_left(
    kafka_bootstrap: str, tmp_path: Path, with_offsets: bool
) -> None:
    """The dead replica's own transactional id holds a transaction open (what a SIGKILL in
    the middle of a batch leaves, here for five minutes): the replica that takes its
    partitions over finds it named in the committed offsets, sees it gone from the group and
    fences it, so the restore goes on at once instead of waiting for the timeout. With the
    group's offsets in the open transaction too (killed after sending them), a read of the
    committed offsets that asks for stable ones would wait for that transaction to end."""
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, in_process=False, state_dir=tmp_path
    ) as engine:
        client, changelog = engine.client, engine.topics.state_changelog
        old = engine.processors["processor-0"]
        assert isinstance(old, EngineProcess)
        early = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(EARLY)]
        client.flush()
        for instance in early:
            wait_until(lambda i=instance: _running(engine, i), 60, what=f"{instance} to run")
        old.kill()
        dead = f"{engine.namespace}.processor.processor-0"
        offsets_of = (engine.settings.processor_group, engine.topics.commands)
        zombie = _zombie(
            engine.bootstrap,
            changelog,
            transactional_id=dead,
            offsets_of=offsets_of if with_offsets else None,
        )
        assert all(stable < end for stable, end in _stable_and_end(engine.bootstrap, changelog))

        new = engine.start_processor("processor-1")
        assert isinstance(new, EngineProcess)
        for i, instance in enumerate(early):
            client.raise_event(instance, "go", i, wait=False)
        client.flush()
        for i, instance in enumerate(early):
            state = engine.wait_for_completion(instance, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output["got"] == i
        log = new.current_log()
        assert f"fenced {dead}" in log, log[-3000:]
        assert "waits for an open transaction" not in log, log[-3000:]
        assert "could not tell whether" not in log, log[-3000:]
        with pytest.raises(KafkaException) as fenced:
            zombie.commit_transaction(30)
        assert fenced.value.args[0].code() in _FENCED, fenced.value
        records = engine.history_records()
        problems = [p for instance in early for p in history_problems(instance, records[instance])]
        assert not problems, "\n".join(problems[:20])
        assert new.stop() == 0
        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0


#: What a fenced zombie's commit fails with (librdkafka reports either).
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def _restores(process: EngineProcess) -> int:
    return process.current_log().count(" restored: ")


@pytest.mark.slow
def test_partitions_move_across_three_replicas_killed_with_open_transactions(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Replicas are SIGKILLed mid-load, one right after it took over the partitions of the
    first, so takeovers happen while the dead replicas' transactions are still open; a replica
    with an empty state folder joins last. Nothing may fork, be lost or be applied twice."""
    with running_engine(
        kafka_bootstrap, partitions=6, replicas=3, in_process=False, state_dir=tmp_path
    ) as engine:
        client = engine.client
        procs = {name: engine.processors[name] for name in ("processor-0", "processor-1")}
        for proc in engine.processors.values():
            assert isinstance(proc, EngineProcess)
            proc.wait_for_log(" restored: ")
        expected: dict[str, object] = {}
        waiting: list[str] = []

        def burst(base: int) -> None:
            for i in range(base, base + 60):
                expected[client.start("chain3.activities", i, flush=False)] = i + 3
            for i in range(base, base + 10):
                instance = client.start(
                    "t.timer_then_activity", {"sleep": 1.0, "x": i}, flush=False
                )
                expected[instance] = i + 1
                waiting.append(client.start("t.wait_event", {"n": i}, flush=False))
            client.flush()

        burst(0)
        first, second = procs["processor-0"], procs["processor-1"]
        assert isinstance(first, EngineProcess) and isinstance(second, EngineProcess)
        wait_until(lambda: _completed(engine, expected) >= 20, 90, what="work to flow")
        # processor-0 has committed on its own partitions (so its offsets name it, and its
        # takeover fences it), not only its peers on theirs
        owned = _held(first.current_log())
        mine = {i: v for i, v in expected.items() if expected_partition(i.encode(), 6) in owned}
        wait_until(lambda: _completed(engine, mine) >= 1, 90, what="processor-0 to commit")
        before = _restores(second)
        burst(1000)
        # besides the transactions the kills leave open, hold one open on every changelog
        # partition for a while, so that every takeover below meets one
        topics = engine.topics
        zombie = _zombie(
            engine.bootstrap, topics.state_changelog, topics.timer_changelog, partitions=6
        )
        threading.Timer(12.0, zombie.abort_transaction, args=(30,)).start()
        first.kill()  # busy: its last transaction stays open until the broker aborts it
        wait_until(lambda: _restores(second) > before, 90, what="processor-1 to take over")
        burst(2000)
        time.sleep(1.0)
        second.kill()  # right after its takeover, while it works on the new burst
        fresh = engine.start_processor("processor-3", state_dir=tmp_path / "processor-3")
        burst(3000)
        assert isinstance(fresh, EngineProcess)
        fresh.wait_for_log(" restored: ")
        for n, instance in enumerate(waiting):  # replicas are killed meanwhile: only write
            client.raise_event(instance, "go", n, wait=False)
            expected[instance] = None
        for instance, output in expected.items():
            state = engine.wait_for_completion(instance, 180)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            if output is not None:
                assert state.output == output
        records = engine.history_records()
        problems = [
            p for instance in expected for p in history_problems(instance, records[instance])
        ]
        assert not problems, "\n".join(problems[:20])
        for instance in waiting:
            raised = [e for _, e in records[instance] if isinstance(e.body, EventRaised)]
            assert len(raised) == 1, f"{instance}: the event was applied {len(raised)} times"
        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0
        assert main(["audit", "state", *cli]) == 0
        logs = "".join(p.current_log() for p in procs_all(engine))
        for dead in ("processor-0", "processor-1"):
            # its peers noticed the silence before the session timeout and evicted it, and
            # the new owners of its partitions fenced what it had left open
            assert f"replica {dead} silent for " in logs, logs[-5000:]
            assert f"fenced {engine.namespace}.processor.{dead}" in logs, logs[-5000:]
        waits = logs.count("waits for an open transaction")
        print(f"restores that waited for an open transaction: {waits}")


def procs_all(engine: object) -> list[EngineProcess]:
    return [p for p in engine.processors.values() if isinstance(p, EngineProcess)]  # type: ignore[attr-defined]


def _held(log: str) -> set[int]:
    """The partitions a replica holds, from the restores and revocations it logged."""
    held: set[int] = set()
    for line in log.splitlines():
        for kind in (" restored: ", " revoked"):
            if "partitions [" in line and kind in line:
                inside = line.split("partitions [", 1)[1].split("]", 1)[0]
                moved = {int(p) for p in inside.split(",") if p.strip()}
                held = held | moved if kind == " restored: " else held - moved
    return held


def _completed(engine: object, instances: dict[str, object]) -> int:
    done = 0
    for instance in instances:
        state = engine.client.get(instance)  # type: ignore[attr-defined]
        done += state is not None and state.status is RuntimeStatus.COMPLETED
    return done


def test_sigterm_while_a_restore_waits_is_a_clean_stop(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A replica held at restore by an open changelog transaction stops cleanly on SIGTERM:
    exit status 0, and the lines about the stop are the processor's own."""
    with running_engine(
        kafka_bootstrap,
        partitions=PARTITIONS,
        replicas=0,
        workers=0,
        in_process=False,
        state_dir=tmp_path,
    ) as engine:
        zombie = _zombie(engine.bootstrap, engine.topics.state_changelog)
        try:
            replica = engine.start_processor("processor-0")
            assert isinstance(replica, EngineProcess)
            replica.wait_for_log("waits for an open transaction")
            returncode = replica.stop()
            log = replica.current_log()
            assert returncode == 0, log[-3000:]
            assert "INFO engine.processor: received SIGTERM, stopping" in log, log[-3000:]
            assert "INFO engine.processor: processor processor-0 stopped while restoring" in log
            assert "error:" not in log and " restored: " not in log, log[-3000:]
        finally:
            zombie.abort_transaction(30)
