"""Readers answer while partitions are busy.

A workflow that loops on ``ctx.sleep(0)`` runs one turn, one transaction, after another on
its partition, so a transaction is open there almost all the time and the partition never
falls quiet; a producer that stalled leaves its transaction open until the broker aborts it,
the extreme of the same. The readers that answer users (``status``, ``wait``, ``list``,
``Client.get`` and ``list_instances``, a command's outcome, the dashboard) must answer all
the same, with what was committed when they started, and a read after a command's answer
must show a state at least as new as that answer.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from engine_harness import RunningEngine, running_engine, wait_until

from engine.adapters.kafka.config import consumer_config, producer_config
from engine.adapters.kafka.io import log_end_offsets
from engine.cli.main import main
from engine.client import Client
from engine.core.history import RuntimeStatus
from engine.core.keys import instance_key, murmur2_partition
from engine.core.messages import CommandResult
from engine.ui.source import DashboardSource

pytestmark = pytest.mark.kafka

PARTITIONS = 4
SPINNING, WAITING, HELD = 0, 1, 3
#: How long a read may take before the test fails: a bound on a hang, not a speed check.
BOUND_S = 60.0
#: Looks at a status partition until one shows a transaction open on it.
LOOKS = 500


def _id_on(prefix: str, partition: int) -> str:
    """A new instance id whose records go to ``partition``."""
    run = uuid.uuid4().hex[:8]
    for n in itertools.count():
        candidate = f"{prefix}-{run}-{n}"
        if murmur2_partition(instance_key(candidate), PARTITIONS) == partition:
            return candidate
    raise AssertionError("unreachable")


def _hold_open(engine: RunningEngine, partition: int) -> Producer:
    """A transaction left open on ``partition`` of the status, history and dead-letter
    topics, as a producer that stalled leaves one until the broker aborts it."""
    config = producer_config(engine.bootstrap, client_id="stalled")
    config.update(
        {"transactional.id": f"stalled-{uuid.uuid4().hex}", "transaction.timeout.ms": 300_000}
    )
    stalled = Producer(config)
    stalled.init_transactions(30)
    stalled.begin_transaction()
    t = engine.topics
    for topic in (t.status, t.history, t.dead_letters):
        stalled.produce(topic, key=b"never-committed", value=b"open", partition=partition)
    assert stalled.flush(30) == 0
    return stalled


def _open_transaction_seen(engine: RunningEngine, partition: int) -> bool:
    """True once the last stable offset of a status partition is seen short of its log end:
    a transaction is open there."""
    wanted = TopicPartition(engine.topics.status, partition)
    config = consumer_config(engine.bootstrap, f"look-{uuid.uuid4().hex}")
    committed = Consumer(config)
    try:
        for _ in range(LOOKS):
            stable = committed.get_watermark_offsets(wanted, timeout=10, cached=False)[1]
            end = log_end_offsets(config, [wanted])[(wanted.topic, partition)][1]
            if stable < end:
                return True
    finally:
        committed.close()
    return False


def _cli(engine: RunningEngine, *argv: str) -> list[str]:
    return [*argv, "--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]


def _status_of(engine: RunningEngine, instance_id: str) -> RuntimeStatus | None:
    state = engine.client.get(instance_id)
    return None if state is None else state.status


def test_readers_answer_while_partitions_are_busy(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_engine(kafka_bootstrap, partitions=PARTITIONS, in_process=False) as engine:
        client = engine.client
        spinner = client.start("t.spin", 50, instance_id=_id_on("spin", SPINNING))
        waiting = client.start("t.wait_event", None, instance_id=_id_on("wait", WAITING))
        ended = client.start("t.echo", {"v": 1}, instance_id=_id_on("ended", HELD))
        assert engine.wait_for_completion(ended, BOUND_S).output == {"v": 1}
        for instance in (spinner, waiting):
            wait_until(
                lambda i=instance: _status_of(engine, i) is RuntimeStatus.RUNNING,
                BOUND_S,
                what=f"{instance} to run",
            )
        stalled = _hold_open(engine, HELD)
        try:
            assert _open_transaction_seen(engine, SPINNING), "the spinner keeps no transaction open"
            _readers_answer(engine, capsys, spinner, waiting, ended)
            assert _open_transaction_seen(engine, SPINNING), "the spinner stopped"
            stopped = client.terminate(spinner)  # an answer from the busy partition itself
            assert stopped is not None and stopped.result is CommandResult.ACCEPTED
            state = client.get(spinner)  # read right after the answer: at least as new
            assert state is not None and state.status is RuntimeStatus.TERMINATED
        finally:
            stalled.abort_transaction(30)


def _readers_answer(
    engine: RunningEngine,
    capsys: pytest.CaptureFixture[str],
    spinner: str,
    waiting: str,
    ended: str,
) -> None:
    capsys.readouterr()
    assert main(_cli(engine, "status", waiting, "--json")) == 0
    assert '"status": "RUNNING"' in capsys.readouterr().out
    assert main(_cli(engine, "wait", ended, "--timeout", str(BOUND_S))) == 0
    assert "COMPLETED" in capsys.readouterr().out
    assert main(_cli(engine, "list", "--quiet")) == 0
    listed = capsys.readouterr().out
    assert all(i in listed for i in (spinner, waiting, ended)), listed
    assert main(_cli(engine, "history", "show", ended, "--quiet")) == 0
    assert "status COMPLETED" in capsys.readouterr().out

    with Client(settings=engine.settings, timeout=BOUND_S) as fresh:
        state = fresh.get(waiting)
        assert state is not None and state.status is RuntimeStatus.RUNNING
        busy = fresh.get(spinner)
        assert busy is not None and busy.status is RuntimeStatus.RUNNING
        assert {spinner, waiting, ended} <= {s.instance_id for s in fresh.list_instances()}
        answer = fresh.raise_event(waiting, "go", 7)  # waits for the command's outcome
        assert answer is not None and answer.result is CommandResult.ACCEPTED
        # the event ended the workflow in the turn that answered: a read now shows it
        state = fresh.get(waiting)
        assert state is not None and state.status is RuntimeStatus.COMPLETED
        assert state.output == {"input": {}, "got": 7}

    _dashboard_answers(engine, spinner, ended)


def _dashboard_answers(engine: RunningEngine, spinner: str, ended: str) -> None:
    source = DashboardSource(engine.settings, Client(settings=engine.settings, timeout=BOUND_S))
    try:
        page: dict[str, Any] = source.instances({})
        assert {spinner, ended} <= {item["instance_id"] for item in page["items"]}
        detail = source.instance(ended)
        assert detail["status"] == "COMPLETED"
        assert detail["timeline"], detail
        busy = source.instance(spinner)
        assert busy["status"] == "RUNNING" and busy["timeline"]
        assert source.dead_letters()["total"] == 0
    finally:
        source.close()
