"""``run all --metrics-port``: a real engine process serves Prometheus metrics with sane
values, /healthz and /readyz; an idle worker group's lag returns to 0."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from engine.adapters.kafka.config import producer_config
from engine.adapters.kafka.groups import describe_group
from engine.client import Client
from engine.config.settings import Settings, load_settings
from engine.config.topics import topic_names
from engine.core.errors import InstanceNotRunningError
from tests.engine_harness import (
    REPO_ROOT,
    EngineProcess,
    create_topics,
    delete_topics,
    unique_namespace,
    wait_until,
)

pytestmark = pytest.mark.kafka

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _scrape(url: str) -> Samples:
    status, text = _get(f"{url}/metrics")
    assert status == 200, text
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), sample.value))
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    found = [v for got, v in samples.get(name, []) if labels.items() <= got.items()]
    assert found, f"no sample {name}{labels}; have {sorted(samples)}"
    return sum(found)


@pytest.fixture
def settings(kafka_bootstrap: str) -> Iterator[Settings]:
    state = tempfile.mkdtemp(prefix="metrics-")
    settings = load_settings(
        bootstrap_servers=kafka_bootstrap,
        namespace=unique_namespace("metrics"),
        partitions=2,
        state_dir=state,
        env={},
    )
    create_topics(settings)
    try:
        yield settings
    finally:
        delete_topics(settings)


@pytest.fixture
def engine_url(settings: Settings) -> Iterator[str]:
    port = _free_port()
    argv = [
        sys.executable, "-m", "engine", "run", "all",
        "--module", "engine.examples.orders", "--module", "tests.workflows_for_tests",
        "--module", "tests.parking_workflows",
        "--namespace", settings.namespace, "--bootstrap-servers", settings.bootstrap_servers,
        "--partitions", "2", "--state-dir", settings.state_dir,
        "--metrics-port", str(port),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TURNSTILE_CONFIG", None)
    process = EngineProcess("all", argv, Path(settings.state_dir) / "all.log", env).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _get(f"{url}/healthz")[0] == 200 or not process.alive, 120, 0.2, "healthz"
        )
        assert process.alive, process.log_tail()
        wait_until(lambda: _get(f"{url}/readyz")[0] == 200, 120, 0.2, "readyz")
        yield url
    finally:
        assert process.stop(60) == 0, process.log_tail()


def test_a_running_engine_serves_its_metrics(settings: Settings, engine_url: str) -> None:
    assert _get(f"{engine_url}/nothing")[0] == 404
    with Client(settings=settings) as client:
        approved = client.start("orders.order", {"order_id": "A", "amount": 3}, instance_id="A")
        late = client.start("orders.order", {"order_id": "B", "amount": 7, "approval_timeout_s": 1})
        failing = client.start("t.raises", 1)
        echo = client.start("t.echo", 1)
        wait_until(
            lambda: (s := client.get(approved)) and s.custom_status == "awaiting approval",
            120,
            what="order A to wait for approval",
        )
        client.raise_event(approved, "approval", {"approved": True})
        for instance_id in (approved, late, failing, echo):
            client.wait_for_completion(instance_id, timeout=120)
        with pytest.raises(InstanceNotRunningError):
            client.raise_event(echo, "too-late")  # refused: the instance has ended
        producer = Producer(producer_config(settings.bootstrap_servers))
        producer.produce(topic_names(settings.namespace).commands, b"not avro", key=b"junk")
        producer.flush(30)

    samples: Samples = {}

    def settled() -> bool:
        nonlocal samples
        samples = _scrape(engine_url)
        names = samples.get("turnstile_dead_letters_total", [])
        rejected = samples.get("turnstile_rejected_total", [])
        return bool(names) and any(labels.get("kind") == "RaiseEvent" for labels, _ in rejected)

    wait_until(settled, 120, 0.5, "the dead letter and the refused event to be counted")

    # the processor
    assert _value(samples, "turnstile_turns_total") >= 6
    assert _value(samples, "turnstile_transactions_total") >= 1
    assert _value(samples, "turnstile_turn_duration_seconds_count") >= 1
    for phase in ("produce", "offsets", "commit"):
        assert _value(samples, "turnstile_transaction_phase_seconds_count", phase=phase) >= 1
    assert _value(samples, "turnstile_batch_records_count") >= 1
    assert _value(samples, "turnstile_transaction_aborts_total") == 0
    commands = topic_names(settings.namespace).commands
    assert _value(samples, "turnstile_records_in_total", topic=commands) >= 7
    assert _value(samples, "turnstile_dead_letters_total") == 1
    assert _value(samples, "turnstile_rejected_total", kind="RaiseEvent") == 1
    outcomes = "turnstile_command_outcomes_total"
    assert _value(samples, outcomes, command="StartWorkflow", result="accepted") >= 4
    assert _value(samples, outcomes, command="RaiseEvent", result="refused") == 1
    refusals = "turnstile_command_refusals_total"
    assert _value(samples, refusals, command="RaiseEvent", error="InstanceNotRunningError") == 1
    runs = "turnstile_workflow_runs_total"
    assert _value(samples, runs, workflow="orders.order", event="started") == 2
    assert _value(samples, runs, workflow="orders.order", event="completed") == 2
    assert _value(samples, runs, workflow="orders.ship", event="completed") == 1
    assert _value(samples, runs, workflow="t.raises", event="failed") == 1
    assert _value(samples, "turnstile_timer_lateness_seconds_count") >= 1
    assert _value(samples, "turnstile_restores_total") >= 1
    assert _value(samples, "turnstile_partitions_owned") == 2
    instances = "turnstile_instances"
    assert _value(samples, instances, status="COMPLETED") == 4  # A, B, the echo, the child
    assert _value(samples, instances, status="FAILED") == 1
    assert _value(samples, instances, status="RUNNING") == 0
    assert {labels["partition"] for labels, _ in samples[instances]} == {"0", "1"}
    assert _value(samples, "turnstile_instance_cache_size") >= 1
    assert _value(samples, "turnstile_instance_cache_lookups_total") >= 1
    assert {labels["topic"] for labels, _ in samples["turnstile_consumer_lag_records"]} >= {
        commands
    }
    # the worker
    attempts = "turnstile_activity_attempts_total"
    assert _value(samples, attempts, activity="orders.charge") == 2
    assert _value(samples, attempts, activity="orders.refund") == 1
    results = "turnstile_activity_results_total"
    assert _value(samples, results, activity="orders.charge", result="success") == 2
    assert _value(samples, "turnstile_activity_duration_seconds_count", activity="orders.pack") == 1
    assert _value(samples, "turnstile_activities_in_flight") == 0
    assert _value(samples, "turnstile_activity_queue_depth") == 0
    # no label carries an instance id
    for name, rows in samples.items():
        for labels, _ in rows:
            assert not {approved, late, failing, echo} & set(labels.values()), (name, labels)


def test_a_parked_instance_is_counted_as_parked(settings: Settings, engine_url: str) -> None:
    """The engine process runs the buggy workflow unfixed: the instance parks, and the
    per-status gauge counts it under PARKED (not RUNNING) until it is terminated."""
    with Client(settings=settings) as client:
        handle = client.start("parking.buggy", {"name": "m"})
        client.wait_for_start(handle, 120)
        handle.raise_event("go", "now")
        instances = "turnstile_instances"

        def counted(status: str, n: int) -> bool:
            return _value(_scrape(engine_url), instances, status=status) == n

        wait_until(lambda: counted("PARKED", 1), 120, 0.5, "the gauge to count it PARKED")
        samples = _scrape(engine_url)
        assert _value(samples, instances, status="RUNNING") == 0
        by_version = samples["turnstile_instances_by_version"]
        assert [n for labels, n in by_version if labels["name"] == "parking.buggy"] == [1]
        handle.terminate("seen")
        wait_until(lambda: counted("TERMINATED", 1), 120, 0.5, "the gauge to count it ended")
        assert counted("PARKED", 0)


def test_an_idle_worker_group_reads_lag_zero(settings: Settings, engine_url: str) -> None:
    with Client(settings=settings) as client:
        orders = [{"order_id": f"L{i}", "amount": 1, "approval_timeout_s": 0.2} for i in range(3)]
        ids = [client.start("orders.order", order) for order in orders]
        for instance_id in ids:
            client.wait_for_completion(instance_id, timeout=120)
    tasks = topic_names(settings.namespace).activity_tasks

    def worker_lag() -> list[int]:
        view = describe_group(settings, settings.worker_group, [tasks])
        return [p.lag for p in view.lags]

    wait_until(lambda: worker_lag() == [0, 0], 120, 0.5, "the worker group's lag to reach 0")
    samples = _scrape(engine_url)
    assert _value(samples, "turnstile_worker_lag_records") == 0
