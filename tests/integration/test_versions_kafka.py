"""Versions on the real broker: a start without a version (client, plain producer, child
workflow) runs the default version and records it; ``list --version`` and
``turnstile versions`` read the status topic."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from engine_harness import RunningEngine, running_engine

from engine.cli.main import main
from engine.core.history import RuntimeStatus

pytestmark = pytest.mark.kafka

TIMEOUT = 60.0
COMMAND_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "Command.avsc"


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def _plain_start(engine: RunningEngine, instance_id: str) -> None:
    """A StartWorkflow with an empty version, written with fastavro from the schema file."""
    from test_plain_producer import single_object

    start = {"name": "t.versioned", "input": {"data": b"3", "encoding": "json"}, "version": ""}
    record = {"instance_id": instance_id, "body": ("io.turnstile.command.StartWorkflow", start)}
    value = single_object(json.loads(COMMAND_SCHEMA.read_text()), record)
    producer = Producer({"bootstrap.servers": engine.bootstrap, "partitioner": "murmur2_random"})
    producer.produce(engine.topics.commands, key=instance_id.encode(), value=value)
    assert producer.flush(30) == 0


def test_starts_without_a_version_run_the_default_and_the_cli_counts_them(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:8]
    by_client = engine.client.start("t.versioned", 1, instance_id=f"client-{tag}")
    pinned = engine.client.start("t.versioned", 2, instance_id=f"pinned-{tag}", version="1")
    parent = engine.client.start("t.versioned_parent", 4, instance_id=f"parent-{tag}")
    _plain_start(engine, f"plain-{tag}")
    flags = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.settings.namespace]
    assert main(["start", "t.versioned", "--input", "5", "--id", f"cli-{tag}", *flags]) == 0
    capsys.readouterr()
    runs = [by_client.instance_id, pinned.instance_id, parent.instance_id, f"plain-{tag}"]
    outputs = {
        run: engine.client.wait_for_completion(run, TIMEOUT).output for run in [*runs, f"cli-{tag}"]
    }
    assert outputs == {
        f"cli-{tag}": "v2 got 5",
        f"client-{tag}": "v2 got 1",
        f"pinned-{tag}": "v1 got 2",
        f"parent-{tag}": "v2 got 4",
        f"plain-{tag}": "v2 got 3",
    }
    plain = engine.client.get(f"plain-{tag}")
    assert plain is not None and plain.version == "2" and plain.status is RuntimeStatus.COMPLETED

    assert main(["list", "--name", "t.versioned", "--version", "1", "--json", *flags]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["instance_id"] for s in listed] == [f"pinned-{tag}"]
    assert main(["versions", "--name", "t.versioned", "--json", *flags]) == 0
    counts = {c["version"]: (c["open"], c["ended"]) for c in json.loads(capsys.readouterr().out)}
    assert counts == {"1": (0, 1), "2": (0, 4)}  # the child ran version 2 too
    assert main(["versions", *flags]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["WORKFLOW", "VERSION", "OPEN", "ENDED"]
    assert ["t.versioned", "2", "0", "4"] in [line.split() for line in table]
