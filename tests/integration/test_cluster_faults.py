"""The engine on a 3-broker cluster while brokers fail: the leader of the busiest partitions
is SIGKILLed and restarted, then every broker is restarted in turn (a rolling restart).

The cluster is this test's own (``engine.dev.local_cluster``): three nodes, each broker and
controller; the engine's topics get replication factor 3 and ``min.insync.replicas`` 2 from
``topics apply`` (checked on the cluster), and producers write with acks=all. A steady load
of mixed workflows (activities, timers, events) runs throughout. Afterwards every workflow
completed once with the right output, the history topic has no duplicated or missing event,
``history verify --all`` and ``audit state`` pass, and no engine process was restarted. How
long completions paused at each fault is printed (``-s``) and kept in benchmarks/results/.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_harness import (
    REPO_ROOT,
    EngineProcess,
    RunningEngine,
    history_problems,
    running_engine,
    wait_until,
)

from engine.core.history import RuntimeStatus
from engine.dev.local_cluster import LocalKafkaCluster
from engine.dev.local_kafka import LocalKafka

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.cluster]


class Load:
    """Starts three workflows every 0.2 s until stopped, one of each kind (three activities
    in a chain; a durable timer, then an activity; one waiting for an external event, which
    is raised right after the start); notes when each one completes."""

    def __init__(self, engine: RunningEngine) -> None:
        self.engine = engine
        self.expected: dict[str, Any] = {}
        self.completions: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._lock = threading.Lock()

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _done(self, _future: Any) -> None:
        with self._lock:
            self.completions.append(time.monotonic())

    def _run(self) -> None:
        client, i = self.engine.client, 0
        while not self._stop.wait(0.2):
            chain = client.start("chain3.activities", i, flush=False)
            self.expected[chain] = i + 3
            timer = client.start("t.timer_then_activity", {"sleep": 1.0, "x": i}, flush=False)
            self.expected[timer] = i + 1
            spec = {"event": "go"}
            waiting = client.start("t.wait_event", spec, flush=False)
            self.expected[waiting] = {"input": spec, "got": i}
            client.flush()
            client.raise_event(waiting, "go", i, wait=False)
            for instance in (chain, timer, waiting):
                client.completion_future(instance).add_done_callback(self._done)
            i += 1

    def longest_pause(self, since: float, until: float) -> float:
        """The longest time without a completion between ``since`` and ``until``."""
        with self._lock:
            times = sorted(t for t in self.completions if since <= t <= until)
        marks = [since, *times, until]
        return max(b - a for a, b in itertools.pairwise(marks))


def _leader_counts(engine: RunningEngine) -> Counter[int]:
    """How many partitions of the engine's topics each broker (node id) leads."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": engine.bootstrap}).list_topics(timeout=30)
    counts: Counter[int] = Counter()
    for name in engine.topics.names():
        for partition in metadata.topics[name].partitions.values():
            counts[partition.leader] += 1
    return counts


def _in_sync(engine: RunningEngine) -> bool:
    """Every partition of the engine's topics has all three replicas in sync."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": engine.bootstrap}).list_topics(timeout=30)
    return all(
        len(p.isrs) == 3
        for name in engine.topics.names()
        for p in metadata.topics[name].partitions.values()
    )


def _replication(engine: RunningEngine) -> set[tuple[int, str]]:
    """(replicas, min.insync.replicas) of the engine's topics' partitions."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": engine.bootstrap})
    metadata = admin.list_topics(timeout=30)
    names = list(engine.topics.names())
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    in_sync = {
        resource.name: future.result(timeout=30)["min.insync.replicas"].value
        for resource, future in admin.describe_configs(resources).items()
    }
    return {
        (len(p.replicas), in_sync[name])
        for name in names
        for p in metadata.topics[name].partitions.values()
    }


def _fault(load: Load, name: str, pauses: dict[str, float], action: Callable[[], None]) -> None:
    started = time.monotonic()
    action()
    time.sleep(20.0)  # the load goes on meanwhile; the pause is measured over this window
    pauses[name] = round(load.longest_pause(started, time.monotonic()), 2)


def _kill(node: LocalKafka) -> None:
    pid = node.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not node.status().running, 30, what="the killed broker to be gone")


def _start(node: LocalKafka) -> None:
    """Start a node again, with as long a wait as the cluster's first start: on a busy shared
    machine a restarted node has taken over 90 s (the single broker's default) to be ready."""
    node.start(timeout=240.0)


def _cli(engine: RunningEngine, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "engine", *args, "--bootstrap-servers", engine.bootstrap]
    argv += ["--namespace", engine.namespace]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_engine_rides_out_a_leader_kill_and_a_rolling_restart(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path / "cluster", 3)
    bootstrap = cluster.start(timeout=240.0)
    pauses: dict[str, float] = {}
    try:
        with running_engine(
            bootstrap, partitions=4, in_process=False, state_dir=tmp_path / "state"
        ) as engine:
            processor = engine.processors["processor-0"]
            assert isinstance(processor, EngineProcess)
            processor.wait_for_log(" restored: ")
            assert _replication(engine) == {(3, "2")}  # topics apply's choice on a cluster
            with Load(engine) as load:
                wait_until(lambda: len(load.completions) >= 30, 120, what="work to flow")
                leader = _leader_counts(engine).most_common(1)[0][0]
                node = cluster.nodes[leader - 1]
                _fault(load, f"SIGKILL broker {leader}", pauses, lambda: _kill(node))
                _fault(load, f"restart broker {leader}", pauses, lambda: _start(node))
                wait_until(lambda: _in_sync(engine), 180, what="replicas back in sync")
                for number, each in enumerate(cluster.nodes, start=1):

                    def restart(n: LocalKafka = each) -> None:
                        n.stop()
                        _start(n)

                    _fault(load, f"rolling restart of broker {number}", pauses, restart)
                    wait_until(lambda: _in_sync(engine), 180, what="replicas back in sync")
            print(f"\ncompletions paused at most (s): {pauses}")
            expected = load.expected
            for instance, output in expected.items():
                state = engine.wait_for_completion(instance, 240)
                assert (state.status, state.output) == (RuntimeStatus.COMPLETED, output), (
                    state.failure,
                    engine.logs(),
                )
            records = engine.history_records()
            problems = [p for i in expected for p in history_problems(i, records[i])]
            assert not problems, "\n".join(problems[:20])
            for proc in [*engine.processors.values(), *engine.workers.values()]:
                assert isinstance(proc, EngineProcess)
                assert proc.alive and proc.starts == 1, proc.log_tail()
            verify = _cli(engine, "history", "verify", "--all")
            assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
            audit = _cli(engine, "audit", "state")
            assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
    finally:
        cluster.stop()
