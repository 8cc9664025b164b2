"""Parking through Kafka: the parked row (with its kept events) travels through the state
changelog, the retry timer through the timer changelog, the retry is a resume on the
commands topic, and the neighbours on the same partition go on. The status record says
PARKED (with the error), so `turnstile list --status PARKED` and `status` show it, and a
flood of events to a parked instance leaves its row small instead of failing it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.cli.main import main
from engine.client import WorkflowHandle
from engine.core.errors import ParkedEventsFullError
from engine.core.history import ExecutionCompleted, RuntimeStatus
from engine.core.keys import murmur2_partition
from tests import parking_workflows
from tests.engine_harness import RunningEngine, running_engine, wait_until

pytestmark = pytest.mark.kafka
WAIT = 120.0
PARTITIONS = 2


def _same_partition(instance_id: str, prefix: str) -> str:
    target = murmur2_partition(instance_id.encode(), PARTITIONS)
    n = 0
    while murmur2_partition(f"{prefix}-{n}".encode(), PARTITIONS) != target:
        n += 1
    return f"{prefix}-{n}"


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    modules = ("tests.parking_workflows", "tests.workflows_for_tests")
    with running_engine(kafka_bootstrap, partitions=PARTITIONS, modules=modules) as running:
        yield running


def _park(engine: RunningEngine, name: str) -> WorkflowHandle[Any]:
    """Start the buggy workflow and raise the event it fails on; returns once the buggy
    turn has run (a neighbour started after it on its partition has completed)."""
    client = engine.client
    handle = client.start("parking.buggy", {"name": name})
    client.wait_for_start(handle, WAIT)
    handle.raise_event("go", "there")
    neighbour = client.start("t.echo", "next door", instance_id=_same_partition(handle, "nb"))
    assert client.wait_for_completion(neighbour, WAIT).output == "next door"
    wait_until(
        lambda: (s := handle.status()) is not None and s.status is RuntimeStatus.PARKED,
        WAIT,
        what="the status record to say PARKED",
    )
    state = handle.status()
    assert state is not None and state.failure is not None and state.failure.type == "KeyError"
    assert not [e for e in engine.history(handle) if isinstance(e.body, ExecutionCompleted)]
    return handle


def test_a_bug_parks_the_instance_and_retry_runs_the_fixed_code(engine: RunningEngine) -> None:
    parking_workflows.FIXED["value"] = False
    handle = _park(engine, "ann")
    parking_workflows.FIXED["value"] = True  # the fix is deployed
    handle.retry()
    assert handle.result(timeout=WAIT) == "ann there"


def test_a_parked_instance_is_terminated(engine: RunningEngine) -> None:
    parking_workflows.FIXED["value"] = False
    handle = _park(engine, "bob")
    handle.terminate("giving up")
    state = engine.client.wait_for_completion(handle, WAIT)
    assert state.status is RuntimeStatus.TERMINATED


def test_list_and_status_show_a_parked_instance(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    parking_workflows.FIXED["value"] = False
    handle = _park(engine, "cyd")
    flags = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace]
    assert main(["list", "--status", "PARKED", "--quiet", *flags]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"{handle}  parking.buggy  PARKED") for line in listed)
    assert main(["list", "--status", "RUNNING", "--quiet", *flags]) == 0
    assert str(handle) not in capsys.readouterr().out
    assert main(["status", handle, *flags]) == 0
    shown = capsys.readouterr().out
    assert "status:       PARKED" in shown and "KeyError" in shown
    assert "parked:       waits for fixed code" in shown
    handle.terminate("done looking")
    assert engine.client.wait_for_completion(handle, WAIT).status is RuntimeStatus.TERMINATED


def test_a_flood_of_events_to_a_parked_instance_keeps_it_parked(engine: RunningEngine) -> None:
    """1,500 events of 1 KB once made a 1.55 MB row, which the broker refused, failing the
    instance for good; now the events past the bound go to dead letters."""
    parking_workflows.FIXED["value"] = False
    handle = _park(engine, "dee")
    blob = "x" * 1000
    for _ in range(1500):
        engine.client.raise_event(handle, "more", blob, wait=False)
    with pytest.raises(ParkedEventsFullError, match="parked_events_max_bytes"):
        engine.client.raise_event(handle, "more", blob)  # answered after those before it
    state = handle.status()
    assert state is not None and state.status is RuntimeStatus.PARKED
    parking_workflows.FIXED["value"] = True
    handle.retry()
    assert handle.result(timeout=WAIT) == "dee there"
