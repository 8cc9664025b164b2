"""Warm standbys on the real broker: three replicas with ``standby_replicas = 1``, state and
load, one SIGKILLed. The replica that takes its partitions over had kept copies of them, so
its restore reads only the tail of the changelogs; every workflow completes once; and every
replica's copy, brought to the committed end, is exactly what a cold restore builds.

Nothing here asserts how fast: the number of records the takeover restored is read from the
taker's log, and the copies' lag from the replicas' metrics. benchmarks/failover.py measures
the time.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from engine_harness import (
    EngineProcess,
    RunningEngine,
    history_problems,
    running_engine,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

from engine.adapters.kafka.restore import restore_tables
from engine.adapters.rocks_store import RocksPartitionStore
from engine.cli.main import main
from engine.core.history import EventRaised, RuntimeStatus
from engine.services.processor.standby import range_assignment
from engine.services.processor.tables import STATE_CHANGELOG, TIMER_CHANGELOG, Tables

pytestmark = pytest.mark.kafka

PARTITIONS = 6
REPLICAS = ["processor-0", "processor-1", "processor-2"]
VICTIM = "processor-1"
#: Instances waiting for an event: the state a takeover would otherwise restore in full.
WAITING = 600
#: Instances running a timer and a step while the victim dies: the load.
LOAD = 60
RESTORED = re.compile(r"partitions \[([\d, ]*)\] restored: (\d+) changelog records")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _standby_lags(port: int) -> dict[int, float]:
    """``turnstile_standby_lag_records`` of one replica, by partition (none until it serves)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {
        int(sample.labels["partition"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "turnstile_standby_lag_records"
        for sample in family.samples
    }


def _start_replicas(engine: RunningEngine) -> dict[str, int]:
    ports = {}
    common = engine.processor_args
    for replica in REPLICAS:
        ports[replica] = _free_port()
        engine.processor_args = (*common, "--metrics-port", str(ports[replica]))
        engine.start_processor(replica)
    engine.processor_args = common
    return ports


def _changelog_records(engine: RunningEngine, partitions: list[int]) -> int:
    topics = [engine.topics.state_changelog, engine.topics.timer_changelog]
    return sum(1 for t in topics for r in engine.read(t) if r.partition in partitions)


def test_a_standby_takes_over_restoring_only_the_tail(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNSTILE_STANDBY_REPLICAS", "1")
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, replicas=0, in_process=False, state_dir=tmp_path
    ) as engine:
        ports = _start_replicas(engine)
        handles = {r: engine.processors[r] for r in REPLICAS}
        assert all(isinstance(h, EngineProcess) for h in handles.values())
        for h in handles.values():
            assert isinstance(h, EngineProcess)
            h.wait_for_log(" restored: ", 120)
        client = engine.client
        waiting = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(WAITING)]
        client.flush()
        for instance in waiting:
            wait_until(
                lambda i=instance: (
                    (s := client.get(i)) is not None and s.status is RuntimeStatus.RUNNING
                ),
                120,
                what=f"{instance} to run",
            )
        survivors = [r for r in REPLICAS if r != VICTIM]
        taken = range_assignment(REPLICAS, PARTITIONS)[VICTIM]
        # every partition the victim owns has a standby copy with nothing left to apply
        wait_until(
            lambda: all(any(_standby_lags(ports[r]).get(p) == 0 for r in survivors) for p in taken),
            120,
            what=f"standby copies of partitions {taken} to catch up",
        )
        before = {r: len(RESTORED.findall(_log(engine, r))) for r in survivors}
        # the prediction the standbys rest on: librdkafka's range assignor, members by id
        # (an eager rebalance restores every partition a replica is given: its last
        # "restored" line names its whole assignment)
        for r, partitions in range_assignment(REPLICAS, PARTITIONS).items():
            assert _assignment(_log(engine, r)) == partitions, (r, _log(engine, r)[-2000:])
        # the load: instances whose durable timers are running on every replica when the
        # victim dies (its timers then fire on the taker, from the standby copy)
        load = {
            client.start("t.timer_inline", {"sleep": 3.0, "x": i}, flush=False): 2 * i
            for i in range(LOAD)
        }
        client.flush()
        for instance in load:
            wait_until(
                lambda i=instance: (
                    (s := client.get(i)) is not None and s.status is RuntimeStatus.RUNNING
                ),
                120,
                what=f"{instance} to run",
            )
        victim = handles[VICTIM]
        assert isinstance(victim, EngineProcess)
        victim.kill()
        for i, instance in enumerate(waiting):
            client.raise_event(instance, "go", i, wait=False)
        client.flush()
        for i, instance in enumerate(waiting):
            state = engine.wait_for_completion(instance, 180)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output["got"] == i
        for instance, expected in load.items():
            state = engine.wait_for_completion(instance, 180)
            assert state.output == expected, (state.failure, engine.logs())

        restored = _takeover_restores(engine, survivors, before, taken)
        for r, partitions in range_assignment(survivors, PARTITIONS).items():
            assert _assignment(_log(engine, r)) == partitions, (r, _log(engine, r)[-2000:])
        state_records = _changelog_records(engine, taken)
        assert sum(restored.values()) * 4 < state_records, (restored, state_records)

        records = engine.history_records()
        problems = [p for i in [*waiting, *load] for p in history_problems(i, records[i])]
        assert not problems, "\n".join(problems[:20])
        for instance in waiting:
            raised = [e for _, e in records[instance] if isinstance(e.body, EventRaised)]
            assert len(raised) == 1, f"{instance}: the event was applied {len(raised)} times"
        for r in survivors:
            assert handles[r].stop() == 0, _log(engine, r)[-3000:]
        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0
        assert main(["audit", "state", *cli]) == 0
        for r in survivors:
            _assert_copies_match_a_cold_restore(engine, r, tmp_path / "cold" / r)


def _log(engine: RunningEngine, replica: str) -> str:
    handle = engine.processors[replica]
    assert isinstance(handle, EngineProcess)
    return handle.current_log()


MOVED = re.compile(r"partitions \[([\d, ]*)\] (restored|revoked)")


def _assignment(log: str) -> list[int]:
    """The partitions a replica holds, from the restores and revocations it logged (an
    eager rebalance revokes all, then restores what it kept and what moved to it)."""
    held: set[int] = set()
    for parts, kind in MOVED.findall(log):
        moved = {int(p) for p in parts.split(", ") if p}
        held = held | moved if kind == "restored" else held - moved
    assert held, log[-2000:]
    return sorted(held)


def _takeover_restores(
    engine: RunningEngine, survivors: list[str], before: dict[str, int], taken: list[int]
) -> dict[str, int]:
    """Changelog records each survivor restored after the kill, from its log; the victim's
    partitions must all have been taken over."""
    restored: dict[str, int] = {}
    got: set[int] = set()
    for r in survivors:
        for partitions, count in RESTORED.findall(_log(engine, r))[before[r] :]:
            got.update(int(p) for p in partitions.split(", ") if p)
            restored[r] = restored.get(r, 0) + int(count)
    assert set(taken) <= got, (taken, got)
    return restored


def _assert_copies_match_a_cold_restore(engine: RunningEngine, replica: str, cold: Path) -> None:
    """Every partition database the replica has (owned or a standby copy), brought to the
    committed end of its changelogs, holds exactly the rows a restore into an empty
    database builds."""
    settings = engine.settings
    changelogs = [
        (engine.topics.state_changelog, STATE_CHANGELOG),
        (engine.topics.timer_changelog, TIMER_CHANGELOG),
    ]
    root = engine.replica_state_dir(replica) / settings.namespace / replica
    folders = sorted(root.glob("p*"))
    assert folders, f"{replica} has no partition databases under {root}"
    for folder in folders:
        p = int(folder.name[1:])
        rows = []
        for path in (folder, cold / folder.name):
            store = RocksPartitionStore(path)
            try:
                restore_tables(settings, {p: changelogs}, {p: Tables(p, store)})
                rows.append(dict(store.scan(b"", b"\xff")))
            finally:
                store.close()
        warm, fresh = rows
        assert warm.keys() == fresh.keys(), (replica, p, warm.keys() ^ fresh.keys())
        assert warm == fresh, (replica, p)


KILLS = 3


@pytest.mark.slow
def test_standbys_through_repeated_kills_and_restarts_under_load(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each replica in turn is SIGKILLed under load and restarted, so copies open, are
    claimed, handed back and reopened across eager rebalances; every takeover fenced the
    dead replica at once (from the logs: no restore waited for its open transaction);
    every workflow completes once and every copy, brought to the end, equals a cold
    restore."""
    monkeypatch.setenv("TURNSTILE_STANDBY_REPLICAS", "1")
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, replicas=0, in_process=False, state_dir=tmp_path
    ) as engine:
        _start_replicas(engine)
        handles = {r: engine.processors[r] for r in REPLICAS}
        for h in handles.values():
            assert isinstance(h, EngineProcess)
            h.wait_for_log(" restored: ", 120)
        client = engine.client
        expected: dict[str, int] = {}
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                for _ in range(10):
                    spec = {"sleep": 0.3 + (n % 7) / 5, "x": n}
                    expected[client.start("t.timer_inline", spec, flush=False)] = 2 * n
                    n += 1
                client.flush()
                time.sleep(0.2)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        try:
            for round_ in range(KILLS):
                victim = handles[REPLICAS[round_ % len(REPLICAS)]]
                assert isinstance(victim, EngineProcess)
                target = len(expected) + 100
                wait_until(lambda t=target: len(expected) >= t, 120, what="load")
                others = [h for h in handles.values() if h is not victim]
                _kill_and_restart(victim, others, engine.namespace)
        finally:
            stop.set()
            loader.join()
        for instance, value in list(expected.items()):
            state = engine.wait_for_completion(instance, 240)
            assert state.output == value, (state.failure, engine.logs())
        records = engine.history_records()
        problems = [p for i in expected for p in history_problems(i, records[i])]
        assert not problems, "\n".join(problems[:20])
        for h in handles.values():
            assert h.stop() == 0
        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0
        assert main(["audit", "state", *cli]) == 0
        for r in REPLICAS:
            _assert_copies_match_a_cold_restore(engine, r, tmp_path / "cold" / r)


def _restores(handle: object) -> int:
    assert isinstance(handle, EngineProcess)
    return handle.current_log().count(" restored: ")


def _logs(handles: list[object]) -> str:
    return "".join(h.current_log() for h in handles if isinstance(h, EngineProcess))


def _kill_and_restart(victim: EngineProcess, others: list[object], namespace: str) -> None:
    """SIGKILL ``victim``, wait until a peer took partitions over - fencing the victim's
    transactional id first, so no restore waited for a transaction it left open - start it
    again and wait until it has its partitions back."""
    fenced = f"fenced {namespace}.processor.{victim.name}"
    fences, waits = _logs(others).count(fenced), _logs(others).count("waiting for open tr")
    counts = [_restores(h) for h in others]
    victim.kill()
    wait_until(
        lambda: any(_restores(h) > c for h, c in zip(others, counts, strict=True)),
        120,
        what="a takeover",
    )
    # fenced at once by a taker, not left to time out (the takeover of the partitions
    # a taker kept may be logged before the one of the victim's)
    wait_until(lambda: _logs(others).count(fenced) > fences, 120, what=fenced)
    victim.start()
    victim.wait_for_log(" restored: ", 120)
    after = _logs(others)
    assert after.count("waiting for open tr") == waits, after[-5000:]
