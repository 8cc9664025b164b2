"""The audit logic without Kafka: hash chains, replay check, state rebuild, timelines.

Histories are produced by the real runtime (a workflow stepped turn by turn, activities
answered in memory) and sealed with the codec exactly as the processor seals them, so the
records under test are byte for byte what the history topic would hold.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import main
from engine.codec import (
    decode_history,
    encode_history,
    seal_history,
    verify_history_chain,
    write_history_file,
)
from engine.core.history import (
    ExecutionStarted,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    TaskCompleted,
    TaskScheduled,
    TurnStarted,
)
from engine.core.messages import InstanceStatus
from engine.core.payloads import from_payload, to_payload
from engine.runtime import actions as act
from engine.runtime.context import WorkflowContext
from engine.runtime.executor import WorkflowExecution
from engine.runtime.jsonhistory import history_from_json
from engine.runtime.registry import Registry
from engine.services.audit.chain import (
    ALTERED,
    DUPLICATED,
    MISSING,
    REORDERED,
    ChainResult,
    verify_events,
    verify_records,
)
from engine.services.audit.records import EventFilter
from engine.services.audit.replay import DIVERGED, ERROR, OK, SKIPPED, ReplayChecker
from engine.services.audit.state import (
    Difference,
    InstanceFold,
    ProcessorTables,
    compare,
    confirmed,
    fold_histories,
)
from engine.services.audit.timeline import event_line, format_time, timeline_json, timeline_lines
from engine.services.processor import keys
from engine.services.processor.meta import InstanceRow, encode_meta

START_MS = 1_700_000_000_000


# --- workflows -------------------------------------------------------------------------------


def _registry(charge_activity: str = "pay.charge") -> Registry:
    """The workflows under test; ``charge_activity`` lets a test 'deploy' changed code."""
    registry = Registry()

    @registry.activity(name="pay.charge")
    def charge(amount: int) -> str:
        return f"ch-{amount}"

    @registry.activity(name="pay.authorize")
    def authorize(amount: int) -> str:
        return f"auth-{amount}"

    @registry.activity(name="pay.notify")
    def notify(receipt: str) -> str:
        return f"sent {receipt}"

    async def checkout(ctx: WorkflowContext, amount: int) -> dict[str, str]:
        ctx.set_custom_status("charging")
        receipt = await ctx.call_activity(charge_activity, amount)
        sent = await ctx.call_activity("pay.notify", receipt)
        ctx.set_custom_status("done")
        return {"receipt": receipt, "sent": sent}

    async def loop(ctx: WorkflowContext, n: int) -> int:
        await ctx.call_activity("pay.charge", n)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    registry.add_workflow(checkout, name="pay.checkout")
    registry.add_workflow(loop, name="pay.loop")
    return registry


INLINE_CALLS: list[int] = []


def _inline_registry() -> Registry:
    registry = Registry()

    def bump(x: int) -> int:
        INLINE_CALLS.append(x)
        return x + 1

    async def inline(ctx: WorkflowContext, x: int) -> int:
        for _ in range(3):
            x = await ctx.run("bump", bump, x)
        return x

    registry.add_workflow(inline, name="pay.inline")
    return registry


# --- histories ---------------------------------------------------------------------------------


def _run(
    registry: Registry,
    instance_id: str,
    name: str,
    value: Any,
    *,
    turns: int = 50,
    start_ms: int = START_MS,
) -> list[HistoryEvent]:
    """Run an instance to its end (or ``turns`` turns), answering activities in memory (and
    taking the turn the processor's wake-up brings after a continue-as-new)."""
    execution = WorkflowExecution(registry, instance_id)
    inbox = [Inbound(ExecutionStarted(name, to_payload(value)))]
    history: list[HistoryEvent] = []
    now = start_ms
    continued = False
    for _ in range(turns):
        if not inbox and not continued:
            break
        result = execution.step(inbox, now)
        history.extend(result.new_events)
        inbox = [
            _answer(registry, a) for a in result.actions if isinstance(a, act.ScheduleActivity)
        ]
        continued = any(isinstance(a, act.ContinueAsNew) for a in result.actions)
        now += 1000
    return history


def _answer(registry: Registry, action: act.ScheduleActivity) -> Inbound:
    output = registry.get_activity(action.name).fn(from_payload(action.input))
    return Inbound(
        TaskCompleted(action.task_id, to_payload(output), action.attempt), action.generation
    )


def _seal(events: Sequence[HistoryEvent], previous: bytes = b"") -> list[bytes]:
    """Chain and encode events as the processor does."""
    out = []
    for event in events:
        sealed, data = seal_history(event, previous)
        previous = sealed.hash
        out.append(data)
    return out


def _decoded(records: Sequence[bytes]) -> list[HistoryEvent]:
    return [decode_history(r) for r in records]


@pytest.fixture(scope="module")
def checkout() -> list[bytes]:
    return _seal(_run(_registry(), "order-1", "pay.checkout", 5))


def _only(results: list[ChainResult]) -> ChainResult:
    assert len(results) == 1, results
    return results[0]


def _verify(records: Sequence[bytes], **kwargs: Any) -> ChainResult:
    return _only(verify_records([(None, r) for r in records], **kwargs))


# --- hash chain --------------------------------------------------------------------------------


def test_an_intact_chain_verifies_and_agrees_with_the_codec(checkout: list[bytes]) -> None:
    result = _verify(checkout)
    assert result.ok and result.events == len(checkout)
    assert result.first_sequence == 0 and result.last_sequence == len(checkout) - 1
    assert result.last_hash == verify_history_chain(checkout)


def test_a_changed_byte_is_reported_as_altered(checkout: list[bytes]) -> None:
    target = 3
    data = bytearray(checkout[target])
    data[20] ^= 0x01
    tampered = [*checkout[:target], bytes(data), *checkout[target + 1 :]]
    broken = _verify(tampered).broken
    assert broken is not None
    assert broken.kind == ALTERED
    assert broken.instance_id == "order-1"


def test_an_event_changed_and_rehashed_breaks_the_next_link(checkout: list[bytes]) -> None:
    events = _decoded(checkout)
    target = next(i for i, e in enumerate(events) if isinstance(e.body, TaskCompleted))
    forged_body = dataclasses.replace(events[target].body, output=to_payload("ch-999"))
    forged = dataclasses.replace(events[target], body=forged_body)
    _, data = seal_history(forged, events[target].previous_hash)
    broken = _verify([*checkout[:target], data, *checkout[target + 1 :]]).broken
    assert broken is not None
    assert (broken.kind, broken.sequence) == (ALTERED, target + 1)
    assert "re-hashed" in broken.detail


@pytest.mark.parametrize("target", [0, 4])
def test_a_deleted_event_is_reported_as_missing(checkout: list[bytes], target: int) -> None:
    broken = _verify([*checkout[:target], *checkout[target + 1 :]]).broken
    assert broken is not None
    assert (broken.kind, broken.sequence) == (MISSING, target)


def test_swapped_events_are_reported_as_reordered(checkout: list[bytes]) -> None:
    records = list(checkout)
    records[3], records[4] = records[4], records[3]
    broken = _verify(records).broken
    assert broken is not None
    assert (broken.kind, broken.sequence) == (REORDERED, 3)


def test_a_repeated_event_is_reported_as_duplicated(checkout: list[bytes]) -> None:
    records = [*checkout[:5], checkout[4], *checkout[5:]]
    broken = _verify(records).broken
    assert broken is not None
    assert (broken.kind, broken.sequence) == (DUPLICATED, 4)


def test_a_copy_of_the_first_event_is_a_duplicate_not_a_restart(checkout: list[bytes]) -> None:
    broken = _verify([*checkout, checkout[0]]).broken
    assert broken is not None and broken.kind == DUPLICATED


def test_a_new_chain_after_a_purge_is_accepted(checkout: list[bytes]) -> None:
    again = _seal(_run(_registry(), "order-1", "pay.checkout", 7, start_ms=START_MS + 60_000))
    result = _verify([*checkout, *again])
    assert result.ok and result.restarts == 1
    assert result.last_hash == decode_history(again[-1]).hash


def test_an_undecodable_record_is_reported_under_its_key(checkout: list[bytes]) -> None:
    results = verify_records([(b"order-1", checkout[0]), (b"order-1", b"\xc3\x01garbage")])
    broken = _only(results).broken
    assert broken is not None and broken.kind == ALTERED and "not a valid" in broken.detail


def test_interleaved_instances_are_verified_independently(checkout: list[bytes]) -> None:
    other = _seal(_run(_registry(), "order-2", "pay.checkout", 9))
    mixed = [r for pair in zip(checkout, other, strict=False) for r in pair]
    mixed += checkout[len(other) :] + other[len(checkout) :]
    results = verify_records([(None, r) for r in mixed])
    assert [r.instance_id for r in results] == ["order-1", "order-2"]
    assert all(r.ok for r in results)


def test_partial_chains_need_the_partial_flag(checkout: list[bytes]) -> None:
    tail = checkout[3:]
    broken = _verify(tail).broken
    assert broken is not None and broken.kind == MISSING and "--partial" in broken.detail
    result = _verify(tail, partial=True)
    assert result.ok and result.partial


def test_decoded_events_verify_by_encoding_them_again(checkout: list[bytes]) -> None:
    events = _decoded(checkout)
    assert _only(verify_events(events)).ok
    target = next(i for i, e in enumerate(events) if isinstance(e.body, TaskScheduled))
    body = dataclasses.replace(events[target].body, name="pay.refund")
    tampered = [
        *events[:target],
        dataclasses.replace(events[target], body=body),
        *events[target + 1 :],
    ]
    broken = _only(verify_events(tampered)).broken
    assert broken is not None and (broken.kind, broken.sequence) == (ALTERED, target)


# --- replay check ------------------------------------------------------------------------------


def _replay(registry: Registry, events: Sequence[HistoryEvent], **kwargs: Any) -> Any:
    checker = ReplayChecker(registry, **kwargs)
    checker.feed_all(events)
    return checker.finish()


def test_unchanged_code_replays_every_generation() -> None:
    registry = _registry()
    events = _run(registry, "loop-1", "pay.loop", 0) + _run(registry, "order-1", "pay.checkout", 3)
    report = _replay(registry, events)
    assert report.ok, [r.line() for r in report.results]
    by_id = {r.instance_id: r for r in report.results}
    assert by_id["loop-1"].generations == 3 and by_id["order-1"].generations == 1
    assert report.events == len(events) and report.generations == 4


def test_changed_code_is_flagged_with_the_first_divergence() -> None:
    events = _run(_registry(), "order-1", "pay.checkout", 3)
    report = _replay(_registry(charge_activity="pay.authorize"), events)
    assert not report.ok
    result = report.results[0]
    assert result.outcome == DIVERGED
    first_task = next(e for e in events if isinstance(e.body, TaskScheduled))
    assert result.sequence == first_task.sequence
    assert "pay.charge" in result.recorded and "pay.authorize" in result.attempted
    assert "DIVERGED order-1" in result.line()


def test_a_running_instance_is_replayed_too() -> None:
    registry = _registry()
    events = _run(registry, "order-1", "pay.checkout", 3, turns=2)
    assert not any(e.body.KIND == "ExecutionCompleted" for e in events)
    report = _replay(_registry(charge_activity="pay.authorize"), events)
    assert report.results[0].outcome == DIVERGED
    assert _replay(registry, events).ok


def test_unknown_workflows_are_errors_unless_skipped() -> None:
    events = _run(_registry(), "order-1", "pay.checkout", 3)
    report = _replay(Registry(), events)
    assert report.results[0].outcome == ERROR and not report.ok
    assert "--module" in report.results[0].detail
    skipped = _replay(Registry(), events, skip_unregistered=True)
    assert skipped.results[0].outcome == SKIPPED and skipped.ok


def test_inline_steps_are_not_run_again_on_replay() -> None:
    registry = _inline_registry()
    events = _run(registry, "inline-1", "pay.inline", 1)
    INLINE_CALLS.clear()
    report = _replay(registry, events)
    assert report.results[0].outcome == OK
    assert INLINE_CALLS == []


# --- state rebuild and comparison ------------------------------------------------------------


def _meta_from(execution: WorkflowExecution, fold: InstanceFold) -> InstanceRow:
    status = execution.metadata()
    return InstanceRow(
        instance_id=status.instance_id,
        name=status.name,
        version=status.version,
        status=status.status,
        generation=status.generation,
        output=status.output,
        failure=status.failure,
        custom_status=status.custom_status,
        next_sequence=fold.next_sequence,
        last_hash=fold.last_hash,
    )


def _engine_state(
    registry: Registry, instance_id: str, name: str, value: Any
) -> tuple[list[bytes], ProcessorTables, dict[str, InstanceStatus]]:
    """History records plus the tables and status record a processor would hold."""
    records = _seal(_run(registry, instance_id, name, value))
    events = _decoded(records)
    fold = fold_histories(events)[instance_id]
    execution = WorkflowExecution(registry, instance_id)
    execution.replay(events)
    tables = ProcessorTables()
    tables.apply(keys.meta_key(instance_id), encode_meta(_meta_from(execution, fold)))
    start = max(i for i, e in enumerate(events) if isinstance(e.body, ExecutionStarted))
    if start > 0 and isinstance(events[start - 1].body, TurnStarted):
        start -= 1  # a new run's rows begin with the turn that started it
    for event, data in zip(events[start:], records[start:], strict=True):
        tables.apply(keys.history_key(instance_id, event.sequence), data)
    return records, tables, {instance_id: execution.metadata()}


def test_the_fold_tracks_what_history_implies() -> None:
    events = _run(_registry(), "loop-1", "pay.loop", 0)
    fold = fold_histories(_decoded(_seal(events)))["loop-1"]
    assert fold.status is RuntimeStatus.COMPLETED
    assert from_payload(fold.output) == 2
    assert (fold.first_generation, fold.generation) == (0, 2)
    assert fold.next_sequence == len(events)
    start = max(e.sequence for e in events if isinstance(e.body, ExecutionStarted))
    assert isinstance(events[start - 1].body, TurnStarted)  # the generation's own turn
    assert sorted(fold.rows) == list(range(start - 1, len(events)))


def test_the_fold_of_a_history_whose_continue_as_new_began_the_next_generation_at_once() -> None:
    """Histories from before continue-as-new ended its turn: the next generation's start
    followed ContinuedAsNew in the same turn, and its rows begin at that start."""
    legacy = Path(__file__).parents[1] / "golden" / "legacy" / "monitor_continue_in_one_turn.json"
    events = history_from_json(json.loads(legacy.read_text())["instances"]["wf-1"])
    fold = fold_histories(_decoded(_seal(events)))["wf-1"]
    start = max(e.sequence for e in events if isinstance(e.body, ExecutionStarted))
    assert type(events[start - 1].body).__name__ == "ContinuedAsNew"
    assert sorted(fold.rows) == list(range(start, len(events)))
    assert fold.status is RuntimeStatus.COMPLETED


def test_matching_state_has_no_differences() -> None:
    registry = _registry()
    records, tables, statuses = _engine_state(registry, "order-1", "pay.checkout", 4)
    more, more_tables, more_statuses = _engine_state(registry, "loop-1", "pay.loop", 0)
    tables.metas.update(more_tables.metas)
    tables.rows.update(more_tables.rows)
    folds = fold_histories(_decoded(records + more))
    report = compare(folds, tables, {**statuses, **more_statuses})
    assert report.ok, [d.line() for d in report.differences]
    assert report.instances == 2 and report.events == len(records) + len(more)


def test_differences_name_the_instance_source_and_field() -> None:
    records, tables, statuses = _engine_state(_registry(), "order-1", "pay.checkout", 4)
    tables.metas["order-1"].status = RuntimeStatus.RUNNING
    tables.metas["order-1"].next_sequence += 1
    statuses["order-1"] = dataclasses.replace(statuses["order-1"], output=to_payload("other"))
    last = max(tables.rows["order-1"])
    tables.apply(keys.history_key("order-1", last), None)
    report = compare(fold_histories(_decoded(records)), tables, statuses)
    found = {(d.source, d.field) for d in report.differences}
    assert found == {
        ("state", "status"),
        ("state", "next_sequence"),
        ("rows", f"#{last}"),
        ("status", "output"),
    }
    status_diff = next(d for d in report.differences if d.field == "status")
    assert (status_diff.history, status_diff.found) == ("COMPLETED", "RUNNING")


def test_a_missing_row_and_a_missing_status_record_are_differences() -> None:
    records, _, _ = _engine_state(_registry(), "order-1", "pay.checkout", 4)
    folds = fold_histories(_decoded(records[:-1]))  # still running: not purgeable
    report = compare(folds, ProcessorTables(), {})
    assert {(d.source, d.field) for d in report.differences} == {
        ("state", "row"),
        ("status", "record"),
    }


def test_purged_and_not_started_instances_are_not_differences() -> None:
    records, _, _ = _engine_state(_registry(), "order-1", "pay.checkout", 4)
    tables = ProcessorTables()
    pending = InstanceRow("later", name="pay.checkout", status=RuntimeStatus.PENDING)
    tables.apply(keys.meta_key("later"), encode_meta(pending))
    statuses = {"later": pending.to_status()}
    report = compare(fold_histories(_decoded(records)), tables, statuses)
    assert report.ok, [d.line() for d in report.differences]
    assert report.purged == ["order-1"] and report.not_started == ["later"]


def test_only_differences_seen_twice_are_confirmed() -> None:
    records, tables, statuses = _engine_state(_registry(), "order-1", "pay.checkout", 4)
    folds = fold_histories(_decoded(records))
    tables.metas["order-1"].generation = 7
    first = compare(folds, tables, statuses)
    tables.metas["order-1"].generation = 0
    tables.metas["order-1"].name = "renamed"
    second = compare(folds, tables, statuses)
    assert confirmed(first, second).differences == []
    assert confirmed(second, second).differences == second.differences
    assert isinstance(second.differences[0], Difference)


# --- timeline ----------------------------------------------------------------------------------


def test_an_event_line_shows_the_salient_fields() -> None:
    events = _decoded(_seal(_run(_registry(), "order-1", "pay.checkout", 4)))
    scheduled = next(e for e in events if isinstance(e.body, TaskScheduled))
    line = event_line(scheduled)
    assert line.split()[0] == str(scheduled.sequence)
    assert format_time(scheduled.timestamp_ms) in line
    assert "TaskScheduled" in line and "name=pay.charge" in line and "input=4" in line
    assert "attempt" not in line  # still the default
    lines = timeline_lines(events)
    assert len(lines) == len(events) + 1
    assert lines[-1].startswith("-- order-1:") and "COMPLETED" in lines[-1]


def test_long_values_are_cut_unless_width_is_zero() -> None:
    event = HistoryEvent("i", 0, START_MS, 0, ExecutionStarted("wf", to_payload("x" * 200)))
    assert event_line(event, width=20).endswith('..."') is False
    assert "..." in event_line(event, width=20)
    assert "x" * 200 in event_line(event, width=0)


def test_the_json_timeline_round_trips_the_events() -> None:
    events = _decoded(_seal(_run(_registry(), "loop-1", "pay.loop", 0)))
    doc = json.loads(json.dumps(timeline_json("loop-1", events, 3)))
    assert doc["partition"] == 3 and doc["summary"]["status"] == "COMPLETED"
    assert doc["summary"]["generations"] == [0, 2]
    assert history_from_json(doc["events"]) == events


def test_the_event_filter_keeps_instances_and_a_time_range() -> None:
    event = HistoryEvent("a", 0, 1000, 0, ExecutionStarted("wf"))
    assert EventFilter().wants(event) and EventFilter().wants_key(None)
    assert EventFilter(instances={"a"}).wants_key(b"a")
    assert not EventFilter(instances={"b"}).wants_key(b"a")
    assert EventFilter(since_ms=1000, until_ms=1001).wants(event)
    assert not EventFilter(since_ms=1001).wants(event)
    assert not EventFilter(until_ms=1000).wants(event)


# --- commands on files (no broker needed) --------------------------------------------------


def _export(path: Path, events: Sequence[HistoryEvent]) -> None:
    with path.open("wb") as fo:
        write_history_file(fo, events)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(
    ("tamper", "kind"),
    [
        (lambda ev: ev[:3] + ev[4:], MISSING),
        (lambda ev: [*ev[:3], ev[4], ev[3], *ev[5:]], REORDERED),
        (
            lambda ev: [
                *ev[:3],
                dataclasses.replace(ev[3], timestamp_ms=ev[3].timestamp_ms + 1),
                *ev[4:],
            ],
            ALTERED,
        ),
    ],
)
def test_history_verify_rejects_a_tampered_export(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    checkout: list[bytes],
    tamper: Callable[[list[HistoryEvent]], list[HistoryEvent]],
    kind: str,
) -> None:
    good, bad = tmp_path / "good.avro", tmp_path / "bad.avro"
    events = _decoded(checkout)
    _export(good, events)
    _export(bad, tamper(events))
    code, out = _cli(["history", "verify", "--from-file", str(good)], capsys)
    assert code == 0 and "all chains intact" in out
    code, out = _cli(["history", "verify", "--from-file", str(bad), "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and not doc["ok"]
    assert doc["results"][0]["break"]["kind"] == kind


CHANGED_CHECKOUT = """
from engine import WorkflowContext
from engine.runtime.registry import Registry

registry = Registry()


@registry.workflow(name="pay.checkout")
async def checkout(ctx: WorkflowContext, amount: int) -> dict[str, str]:
    ctx.set_custom_status("charging")
    receipt = await ctx.call_activity("pay.authorize", amount)  # was pay.charge
    sent = await ctx.call_activity("pay.notify", receipt)
    return {"receipt": receipt, "sent": sent}
"""


def test_replay_check_on_a_file_flags_changed_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "histories.avro"
    _export(path, _run(_registry(), "order-1", "pay.checkout", 3))
    (tmp_path / "changed_checkout.py").write_text(CHANGED_CHECKOUT)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out = _cli(
        ["replay", "check", "--from-file", str(path), "--registry", "changed_checkout:registry"],
        capsys,
    )
    assert code == 1
    assert "DIVERGED order-1" in out and "events/s" in out


def test_commands_without_a_source_say_what_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "verify"]) == 1
    assert "--all" in capsys.readouterr().err
    assert main(["history"]) == 2


def test_a_file_that_is_not_an_export_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "not.avro"
    path.write_bytes(b"hello")
    assert main(["history", "verify", "--from-file", str(path)]) == 1
    assert "history export" in capsys.readouterr().err


def test_encoded_bytes_survive_an_export_round_trip(checkout: list[bytes], tmp_path: Path) -> None:
    from engine.codec import read_history_file

    buffer = io.BytesIO()
    write_history_file(buffer, _decoded(checkout))
    buffer.seek(0)
    assert [encode_history(e) for e in read_history_file(buffer)] == checkout


def test_a_schedule_row_without_history_is_no_difference() -> None:
    from engine.core.instance_row import InstanceRow
    from engine.core.schedules import ScheduleSpec, ScheduleState

    records, tables, statuses = _engine_state(_registry(), "order-1", "pay.checkout", 4)
    row = InstanceRow(
        "~schedules/nightly", schedule=ScheduleState(ScheduleSpec("w", cron="@daily"))
    )
    tables.apply(keys.meta_key(row.instance_id), encode_meta(row))
    statuses[row.instance_id] = row.to_status()  # RUNNING, with no history of its own
    report = compare(fold_histories(_decoded(records)), tables, statuses)
    assert report.ok, [d.line() for d in report.differences]
