"""Replay and audit commands against the history of a real run on a real broker.

One engine (processor and worker in-process) runs a handful of workflows once for the
module: orders (approved and rejected), chain3 with activities and inline steps, and a loop
that continues as new. Every command then reads what that run wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from engine_harness import running_engine

from engine import WorkflowContext, workflow
from engine.adapters.kafka.config import producer_config
from engine.adapters.kafka.history import TopicReader, read_instance_history
from engine.cli.main import main
from engine.codec import decode_message, encode_message, write_history_file
from engine.config.topics import topic_names
from engine.core.history import HistoryEvent, RuntimeStatus, TaskScheduled
from engine.core.messages import InstanceStatus
from engine.core.payloads import to_payload
from engine.runtime.registry import Registry
from engine.services.audit.records import ReadProgress
from engine.services.audit.replay import DIVERGED, OK, ReplayChecker
from engine.services.processor import keys
from engine.services.processor.meta import decode_meta, encode_meta

pytestmark = pytest.mark.kafka

TIMEOUT = 60.0
MODULES = ("engine.examples.orders", "engine.examples.chain3")


@workflow(name="audit.loop")
async def audit_loop(ctx: WorkflowContext, n: int) -> int:
    """Three generations, so that timelines and replays cross continue-as-new."""
    await ctx.call_activity("chain3.add_one", n)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


@dataclass
class Run:
    """What the shared run left behind."""

    engine: Any
    approved: str
    rejected: str
    activities: str
    inline: str
    loop: str

    @property
    def ids(self) -> list[str]:
        return [self.approved, self.rejected, self.activities, self.inline, self.loop]

    def cli(self, *argv: str) -> list[str]:
        settings = self.engine.settings
        return [
            *argv,
            "--bootstrap-servers",
            settings.bootstrap_servers,
            "--namespace",
            settings.namespace,
            "--quiet",
        ]


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str) -> Iterator[Run]:
    with running_engine(kafka_bootstrap, partitions=4, modules=MODULES) as engine:
        client = engine.client
        approved = client.start("orders.order", {"order_id": "A", "amount": 5}, instance_id="au-A")
        rejected = client.start("orders.order", {"order_id": "R", "amount": 3}, instance_id="au-R")
        activities = client.start("chain3.activities", 10)
        inline = client.start("chain3.inline", 1)
        loop = client.start("audit.loop", 0)
        for order, approval in ((approved, True), (rejected, False)):
            client.wait_for_start(order, timeout=TIMEOUT)
            client.raise_event(order, "approval", {"approved": approval})
        for instance in (approved, rejected, activities, inline, loop):
            state = client.wait_for_completion(instance, timeout=TIMEOUT)
            assert state.status.value == "COMPLETED", (instance, state)
        client.wait_for_completion(f"{approved}:ship", timeout=TIMEOUT)
        yield Run(engine, approved, rejected, activities, inline, loop)


def _main(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _history(run: Run, instance_id: str) -> list[HistoryEvent]:
    return read_instance_history(run.engine.settings, instance_id)


# --- history show -------------------------------------------------------------------------------


def test_history_show_prints_one_line_per_event(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _history(run, run.approved)
    code, out = _main(capsys, run.cli("history", "show", run.approved, "--full"))
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == len(events) + 2  # header, events, summary
    assert lines[0].split()[:2] == ["SEQ", "TIME"]
    assert "TaskScheduled" in out and "name=orders.charge" in out
    assert 'input={"amount":5,"order_id":"A"}' in out
    assert "ChildWorkflowCreated" in out and "ExecutionCompleted" in out
    assert lines[-1].startswith(f"-- {run.approved}:") and "COMPLETED" in lines[-1]


def test_history_show_json_spans_every_generation(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _main(capsys, run.cli("history", "show", run.loop, "--json"))
    assert code == 0
    doc = json.loads(out)
    assert doc["summary"]["generations"] == [0, 2]
    assert doc["summary"]["status"] == "COMPLETED"
    started = [e for e in doc["events"] if e["kind"] == "ExecutionStarted"]
    assert [e["generation"] for e in started] == [0, 1, 2]
    assert [e["sequence"] for e in doc["events"]] == list(range(len(doc["events"])))


def test_history_show_of_an_unknown_instance_fails(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _main(capsys, run.cli("history", "show", "no-such-instance"))
    assert code == 1 and "no history for instance 'no-such-instance'" in out


# --- hash chains and exports ------------------------------------------------------------------


def test_history_verify_finds_every_chain_intact(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _main(capsys, run.cli("history", "verify", "--all", "--json"))
    assert code == 0, out
    doc = json.loads(out)
    verified = {r["instance_id"] for r in doc["results"]}
    assert set(run.ids) <= verified and doc["broken"] == 0
    code, out = _main(capsys, run.cli("history", "verify", run.approved, run.loop))
    assert code == 0 and out.count("\nok ") + out.startswith("ok ") == 2


def test_an_export_is_a_standard_avro_file_that_verifies(
    run: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "export.avro"
    argv = ["history", "export", "-o", str(path), "--instance", run.approved]
    code, out = _main(capsys, run.cli(*argv, "--instance", run.loop, "--json"))
    assert code == 0, out
    summary = json.loads(out)
    expected = len(_history(run, run.approved)) + len(_history(run, run.loop))
    assert summary["events"] == expected and summary["instances"] == 2
    with path.open("rb") as fo:  # a plain Avro reader, no engine code
        records = list(fastavro.reader(fo))
    assert len(records) == expected
    assert {r["instance_id"] for r in records} == {run.approved, run.loop}
    code, out = _main(capsys, ["history", "verify", "--from-file", str(path)])
    assert code == 0 and "all chains intact" in out


@pytest.mark.parametrize("tamper", ["delete", "reorder", "alter"])
def test_history_verify_rejects_a_tampered_export(
    run: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path, tamper: str
) -> None:
    events = _history(run, run.rejected)
    index = next(i for i, e in enumerate(events) if isinstance(e.body, TaskScheduled))
    if tamper == "delete":
        changed = events[:index] + events[index + 1 :]
    elif tamper == "reorder":
        changed = [*events[:index], events[index + 1], events[index], *events[index + 2 :]]
    else:
        body = replace(events[index].body, input=to_payload({"order_id": "R", "amount": 0}))
        changed = [*events[:index], replace(events[index], body=body), *events[index + 1 :]]
    path = tmp_path / f"{tamper}.avro"
    with path.open("wb") as fo:
        write_history_file(fo, changed)
    code, out = _main(capsys, ["history", "verify", "--from-file", str(path), "--json"])
    assert code == 1
    broken = json.loads(out)["results"][0]["break"]
    kind = {"delete": "missing", "reorder": "reordered", "alter": "altered"}[tamper]
    assert (broken["instance_id"], broken["kind"], broken["sequence"]) == (
        run.rejected,
        kind,
        events[index].sequence,
    )


def test_an_export_of_a_time_range_holds_only_that_range(
    run: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    events = _history(run, run.loop)
    since, until = events[3].timestamp_ms, events[-1].timestamp_ms
    path = tmp_path / "range.avro"
    code, out = _main(
        capsys,
        run.cli(
            "history", "export", "-o", str(path), "--since", _iso(since), "--until", _iso(until)
        ),
    )
    assert code == 0, out
    with path.open("rb") as fo:
        records = list(fastavro.reader(fo))
    assert records and all(since <= _ms(r["timestamp_ms"]) < until for r in records)
    in_range = [e for e in events if since <= e.timestamp_ms < until]
    assert len([r for r in records if r["instance_id"] == run.loop]) == len(in_range)
    code, out = _main(capsys, ["history", "verify", "--from-file", str(path), "--partial"])
    assert code == 0, out


def _iso(epoch_ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def _ms(value: Any) -> int:
    """fastavro returns timestamp-millis fields as datetimes."""
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


# --- replay check -------------------------------------------------------------------------------


def test_replay_check_passes_on_unchanged_code(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = run.cli("replay", "check", *[a for m in MODULES for a in ("--module", m)], "--json")
    code, out = _main(capsys, argv)
    assert code == 0, out
    doc = json.loads(out)
    outcomes = {r["instance_id"]: r["outcome"] for r in doc["results"]}
    assert all(outcomes[i] == OK for i in run.ids)
    assert doc["events_per_second"] > 0 and doc["instances_per_second"] > 0
    loop = next(r for r in doc["results"] if r["instance_id"] == run.loop)
    assert loop["generations"] == 3
    code, out = _main(capsys, run.cli("replay", "check", "--partition", "0", "--partition", "1"))
    assert code == 0 and "events/s" in out and "instances/s" in out


CHANGED_ORDERS = """
from engine import WorkflowContext
from engine.runtime.registry import Registry

registry = Registry()


@registry.workflow(name="orders.order")
async def order(ctx: WorkflowContext, order: dict) -> dict:
    ctx.set_custom_status("charging")
    await ctx.call_activity("orders.authorize", order)  # was orders.charge
    return {"status": "changed"}
"""


def _changed_registry() -> Registry:
    namespace: dict[str, Any] = {}
    exec(compile(CHANGED_ORDERS, "changed_orders", "exec"), namespace)
    registry: Registry = namespace["registry"]
    return registry


def test_replay_check_flags_a_changed_workflow(
    run: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "changed_orders.py").write_text(CHANGED_ORDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["replay", "check", "--registry", "changed_orders:registry", "--skip-unregistered"]
    code, out = _main(capsys, run.cli(*argv))
    assert code == 1
    assert f"DIVERGED {run.approved} (orders.order)" in out
    assert f"DIVERGED {run.rejected} (orders.order)" in out
    assert "orders.charge" in out and "orders.authorize" in out


def test_replay_checker_names_the_first_divergence(run: Run) -> None:
    events = _history(run, run.approved)
    checker = ReplayChecker(_changed_registry())
    checker.feed_all(events)
    result = checker.finish().results[0]
    first_task = next(e for e in events if isinstance(e.body, TaskScheduled))
    assert result.outcome == DIVERGED
    assert (result.generation, result.sequence) == (0, first_task.sequence)
    assert "orders.charge" in result.recorded and "orders.authorize" in result.attempted


def test_replay_check_reads_exported_files(
    run: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "orders.avro"
    argv = run.cli("history", "export", "-o", str(path), "--instance", run.rejected)
    assert _main(capsys, argv)[0] == 0
    code, out = _main(capsys, ["replay", "check", "--module", MODULES[0], "--from-file", str(path)])
    assert code == 0 and "all decisions match" in out
    (tmp_path / "changed_orders.py").write_text(CHANGED_ORDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["replay", "check", "--registry", "changed_orders:registry", "--from-file", str(path)]
    code, out = _main(capsys, argv)
    assert code == 1 and f"DIVERGED {run.rejected}" in out


# --- audit state --------------------------------------------------------------------------------


def test_audit_state_matches_the_history(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _main(capsys, run.cli("audit", "state", "--json"))
    assert code == 0, out
    doc = json.loads(out)
    assert doc["ok"] and doc["instances"] >= len(run.ids)


def test_audit_state_reads_a_replicas_files(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    settings = run.engine.settings
    replicas = sorted(Path(settings.state_dir).glob(f"**/{settings.namespace}/processor-0"))
    assert replicas, f"no state of processor-0 under {settings.state_dir}"
    state_dir = replicas[0].parent.parent
    argv = ["audit", "state", "--state-dir", str(state_dir), "--replica-id", "processor-0"]
    code, out = _main(capsys, run.cli(*argv))
    assert code == 0, out
    assert "against the replica's files" in out and "no differences" in out


def test_audit_state_lists_differences(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """Forge a status record and a changelog row, audit, then put the originals back."""
    victim = run.inline
    topics = topic_names(run.engine.settings.namespace)
    status = _latest(run, topics.status, victim.encode(), victim)
    meta = _latest(run, topics.state_changelog, keys.meta_key(victim), victim)
    forged_status = replace(_status(status), status=RuntimeStatus.RUNNING)
    forged_meta = decode_meta(meta)
    forged_meta.next_sequence += 5
    _produce(run, topics.status, victim.encode(), encode_message(forged_status), victim)
    _produce(run, topics.state_changelog, keys.meta_key(victim), encode_meta(forged_meta), victim)
    try:
        code, out = _main(capsys, run.cli("audit", "state", "--no-recheck", "--json"))
    finally:
        _produce(run, topics.status, victim.encode(), status, victim)
        _produce(run, topics.state_changelog, keys.meta_key(victim), meta, victim)
    assert code == 1
    found = {(d["instance_id"], d["source"], d["field"]) for d in json.loads(out)["differences"]}
    assert found == {(victim, "status", "status"), (victim, "state", "next_sequence")}
    code, out = _main(capsys, run.cli("audit", "state"))
    assert code == 0, out


def _latest(run: Run, topic: str, key: bytes, instance_id: str) -> bytes:
    """The latest value under ``key`` (every topic keeps an instance on one partition)."""
    with TopicReader(run.engine.settings) as reader:
        partition = reader.partition_of(topic, instance_id)
        values = [r.value for r in reader.read(topic, [partition]) if r.key == key]
    assert values and values[-1] is not None
    return values[-1]


def _status(value: bytes) -> InstanceStatus:
    status = decode_message(value)
    assert isinstance(status, InstanceStatus)
    return status


def _produce(run: Run, topic: str, key: bytes, value: bytes, instance_id: str) -> None:
    settings = run.engine.settings
    with TopicReader(settings) as reader:
        partition = reader.partition_of(topic, instance_id)
    producer = Producer(producer_config(settings.bootstrap_servers))
    producer.produce(topic, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0


def test_reads_report_progress_and_stop_at_the_end(run: Run) -> None:
    seen: list[ReadProgress] = []
    settings = run.engine.settings
    topic = topic_names(settings.namespace).history
    with TopicReader(settings, progress_every_s=0.0) as reader:
        records = list(reader.read(topic, on_progress=seen.append))
        again = list(reader.read(topic, start=reader.positions[topic]))
    assert seen and seen[-1].partitions_done == seen[-1].partitions == 4
    assert seen[-1].records == len(records) and again == []
    assert {r.key for r in records} >= {i.encode() for i in run.ids}
