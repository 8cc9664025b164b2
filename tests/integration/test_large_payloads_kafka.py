"""Large payloads on the real broker: a start input and an activity result far above the
record limit travel as chunks on the payloads topic, the history holds references, and a
processor and a worker killed (SIGKILL) in the middle lose nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import fields, is_dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from engine.adapters.kafka.payloads import payload_store
from engine.config.topics import topic_names
from engine.core.errors import PayloadTooLargeError
from engine.core.history import ExecutionStarted, TaskCompleted
from engine.core.payload_refs import parse_ref
from engine.core.payloads import Payload, from_payload, is_ref
from tests.engine_harness import REPO_ROOT, EngineProcess, RunningEngine, running_engine
from tests.workflows_for_tests import big_text, fingerprint

pytestmark = pytest.mark.kafka

MB = 1024 * 1024


def test_a_large_input_and_result_travel_as_references(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, in_process=False, partitions=2) as engine:
        text = big_text(2 * MB, "in")
        run = engine.client.start("t.big_round_trip", {"text": text, "result_size": 3 * MB})
        done = engine.client.wait_for_completion(run, timeout=180)
        events = engine.history(run)
        started = next(e.body for e in events if isinstance(e.body, ExecutionStarted))
        result = next(e.body for e in events if isinstance(e.body, TaskCompleted))
        assert done.output == {
            "input": fingerprint(text),
            "result": fingerprint(big_text(3 * MB, "r")),
        }
        assert is_ref(started.input) and is_ref(result.output)
        assert started.input is not None and len(started.input.data) < 1024
        assert parse_ref(started.input.data).chunks > 1
        assert from_payload(started.input) == {"text": text, "result_size": 3 * MB}
        assert from_payload(result.output) == big_text(3 * MB, "r")
        where = ["--bootstrap-servers", kafka_bootstrap, "--namespace", engine.settings.namespace]
        shown = subprocess.run(
            [sys.executable, "-m", "engine", "history", "show", run, *where],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert f'"large_payload":{3 * MB + 2}' in shown.stdout  # the result's size, JSON quoted
        assert len(shown.stdout) < 20_000  # sizes and beginnings, not the values
        assert _live_chunks(engine, run) > 0
        engine.client.purge(run)
        assert _live_chunks(engine, run) == 0
        with pytest.raises(PayloadTooLargeError, match="payload_max_bytes"):
            engine.client.start("t.big_round_trip", {"text": "x" * 64 * MB, "result_size": 1})


def test_every_kind_of_payload_travels_large(kafka_bootstrap: str) -> None:
    """Activity input and result, child input and output, an event from a client and one
    sent between instances, the workflow's output: each above the inline limit, each a
    reference in the history, each intact where it arrives."""
    size = 3 * MB
    text = big_text(size, "all")
    with running_engine(kafka_bootstrap, in_process=False, partitions=2) as engine:
        peer = engine.client.start("t.big_peer", None)
        run = engine.client.start("t.big_everything", {"size": size, "peer": str(peer)})
        engine.client.raise_event(run, "go", text[::2])
        done = engine.client.wait_for_completion(run, timeout=180)
        got = engine.client.wait_for_completion(peer, timeout=180)
        histories = engine.histories()
        assert done.output == {
            "echo": fingerprint(text[::-1]),
            "child": fingerprint(text),
            "event": fingerprint(text[::2]),
            "text": text,
        }
        assert got.output == fingerprint(text)
        large = {
            type(e.body).__name__
            for events in histories.values()
            for e in events
            for value in vars_of(e.body)
            if isinstance(value, Payload) and is_ref(value)
        }
        assert large >= {
            "ExecutionStarted",  # the child's input
            "TaskScheduled",
            "TaskCompleted",
            "ChildWorkflowCreated",
            "ChildWorkflowCompleted",
            "EventRaised",
            "EventSent",
            "ExecutionCompleted",
        }
        for name in (run, f"{run}-child", peer):
            engine.client.purge(name)
        assert sum(_live_chunks(engine, name) for name in (run, f"{run}-child", peer)) == 0


def vars_of(body: object) -> list[object]:
    return [getattr(body, f.name) for f in fields(body)] if is_dataclass(body) else []


def test_the_sweep_deletes_chunks_no_instance_needs(kafka_bootstrap: str) -> None:
    """Chunks written for an instance that never started (a start refused, a client that
    died before its command) are deleted by ``topics sweep-payloads``; a live instance's
    stay."""
    with running_engine(kafka_bootstrap, in_process=False, partitions=2) as engine:
        run = engine.client.start("t.big_round_trip", {"text": "x" * MB, "result_size": MB})
        engine.client.wait_for_completion(run, timeout=120)
        payload_store(engine.settings).put("never-started", Payload(b"y" * 2 * MB, "binary"))
        assert _live_chunks(engine, "never-started") == 4
        where = ["--bootstrap-servers", kafka_bootstrap, "--namespace", engine.settings.namespace]
        sweep = ["topics", "sweep-payloads", "--older-than", "0", *where]
        swept = subprocess.run(
            [sys.executable, "-m", "engine", *sweep],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert swept.returncode == 0, swept.stderr
        assert "deleted 4 orphaned chunks of 1 instances" in swept.stdout
        assert _live_chunks(engine, "never-started") == 0
        assert _live_chunks(engine, run) == 3 + 3  # input and result, 1 MiB and a bit each


def test_20_mb_in_50_mb_back_through_killed_processes(kafka_bootstrap: str) -> None:
    """SIGKILL the processor and the worker while the 50 MB result is under way: the
    restarted ones finish the run with both values intact."""
    with running_engine(kafka_bootstrap, in_process=False, partitions=2) as engine:
        text = big_text(20 * MB, "in")
        run = engine.client.start("t.big_round_trip", {"text": text, "result_size": 50 * MB})
        (processor,) = engine.processors.values()
        (worker,) = engine.workers.values()
        assert isinstance(processor, EngineProcess) and isinstance(worker, EngineProcess)
        _wait_for_the_task(engine, run)
        processor.kill()
        worker.kill()
        processor.start()
        worker.start()
        done = engine.client.wait_for_completion(run, timeout=300)
        assert done.output == {
            "input": fingerprint(text),
            "result": fingerprint(big_text(50 * MB, "r")),
        }
        # 512 KiB chunks of the JSON (a few bytes over 20 and 50 MiB), no copy left over
        assert _live_chunks(engine, run) == 41 + 101
        engine.client.purge(run)
        assert _live_chunks(engine, run) == 0  # no orphan: every chunk has its tombstone


def _wait_for_the_task(engine: RunningEngine, run: str) -> None:
    """Until the processor scheduled the activity (its turn read the 20 MB input)."""
    deadline = time.monotonic() + 180
    while not any(type(e.body).__name__ == "TaskScheduled" for e in engine.history(run)):
        assert time.monotonic() < deadline, engine.logs()
        time.sleep(0.2)


def _live_chunks(engine: RunningEngine, run: str) -> int:
    """The chunk keys of ``run`` whose latest record on the payloads topic is not a
    tombstone (what compaction would keep), read committed from the beginning."""
    topic = topic_names(engine.settings.namespace).payloads
    consumer = Consumer(
        {
            "bootstrap.servers": engine.settings.bootstrap_servers,
            "group.id": "large-payload-test",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        latest: dict[bytes, bool] = {}
        ends: set[int] = set()
        deadline = time.monotonic() + 120
        while len(ends) < len(meta.partitions):
            assert time.monotonic() < deadline, "the payloads topic was not read to its end"
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                ends.add(message.partition() or 0)
                continue
            key = message.key() or b""
            if key.startswith(f"{run}/".encode()):
                latest[key] = message.value() is not None
        return sum(latest.values())
    finally:
        consumer.close()
