"""The workflow client's logic without Kafka: commands it sends, the status view, waits."""

from __future__ import annotations

import threading
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.codec import decode_message, encode_message
from engine.core.errors import BrokerError, WaitTimeoutError
from engine.core.failure import FailureDetails
from engine.core.history import RuntimeStatus
from engine.core.messages import (
    CommandOutcome,
    IdReusePolicy,
    InstanceStatus,
    Message,
    PurgeWorkflow,
    RaiseEvent,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import Registry
from engine.services.client.commands import CommandMethods
from engine.services.client.outcomes import OutcomeWaiters
from engine.services.client.workflow_client import InstanceState, StatusView, WorkflowClient


class FakeSink:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.flushes = 0

    def send(self, key: bytes, value: bytes) -> None:
        self.records.append((key, value))

    def flush(self, timeout_s: float) -> None:
        self.flushes += 1

    def messages(self) -> list[Message]:
        return [decode_message(value) for _, value in self.records]


def _status(
    instance_id: str, status: RuntimeStatus, output: Any = None, **kw: Any
) -> InstanceStatus:
    payload = None if output is None else to_payload(output)
    return InstanceStatus(instance_id, name="wf", status=status, output=payload, **kw)


class Verbs(CommandMethods):
    """The shared command verbs over one WorkflowClient, as Client and TestEngine use them."""

    def __init__(self, client: WorkflowClient) -> None:
        self.client = client

    def _command_client(self) -> WorkflowClient:
        return self.client


@pytest.fixture
def sink() -> FakeSink:
    return FakeSink()


@pytest.fixture
def view() -> StatusView:
    v = StatusView()
    v.mark_ready()
    return v


@pytest.fixture
def client(sink: FakeSink, view: StatusView) -> WorkflowClient:
    return WorkflowClient(sink, view, registry=Registry(), ready_timeout_s=0.2)


# --- commands --------------------------------------------------------------------------------


def test_start_sends_a_keyed_start_command_and_flushes(
    client: WorkflowClient, sink: FakeSink
) -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    instance_id = Verbs(client).start(
        "orders",
        {"n": 1},
        instance_id="order-1",
        reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING,
        start_at=when,
        tags={"team": "a"},
        version="v2",
    )
    assert instance_id == "order-1"
    [(key, _)] = sink.records
    [command] = sink.messages()
    assert key == b"order-1"
    assert isinstance(command, StartWorkflow)
    assert (command.name, command.version, command.tags) == ("orders", "v2", {"team": "a"})
    assert from_payload(command.input) == {"n": 1}
    assert command.reuse_policy is IdReusePolicy.TERMINATE_IF_RUNNING
    assert command.scheduled_start_ms == int(when.timestamp() * 1000)
    assert len(command.request_id) == 32
    assert sink.flushes == 1


def test_start_defaults_and_workflow_functions(sink: FakeSink, view: StatusView) -> None:
    registry = Registry()

    @registry.workflow(name="named.flow")
    async def flow(ctx: Any, x: int) -> int:
        return x

    client = Verbs(WorkflowClient(sink, view, registry=registry))
    first = client.start(flow)
    second = client.start(flow)
    assert first != second and len(first) == 32
    commands = sink.messages()
    assert all(isinstance(c, StartWorkflow) and c.name == "named.flow" for c in commands)
    assert all(isinstance(c, StartWorkflow) and c.input is None for c in commands)


def test_start_many_flushes_once(client: WorkflowClient, sink: FakeSink) -> None:
    verbs = Verbs(client)
    ids = verbs.start_many("wf", range(10))
    assert len(set(ids)) == 10
    assert sink.flushes == 1
    assert [from_payload(c.input) for c in sink.messages() if isinstance(c, StartWorkflow)] == list(
        range(10)
    )
    verbs.start("wf", flush=False)
    assert sink.flushes == 1
    verbs.flush()
    assert sink.flushes == 2


def test_control_commands(client: WorkflowClient, sink: FakeSink) -> None:
    verbs = Verbs(client)
    verbs.raise_event("a", "approved", {"by": "me"})
    verbs.terminate("a", "stop", recursive=True)
    verbs.suspend("a")
    verbs.resume("a")
    verbs.purge("a")
    kinds = [type(m).__name__ for m in sink.messages()]
    assert kinds == [
        "RaiseEvent",
        "TerminateWorkflow",
        "SuspendWorkflow",
        "ResumeWorkflow",
        "PurgeWorkflow",
    ]
    event, terminate, *_, purge = sink.messages()
    assert isinstance(event, RaiseEvent) and from_payload(event.input) == {"by": "me"}
    assert isinstance(terminate, TerminateWorkflow) and terminate.recursive
    assert isinstance(purge, PurgeWorkflow)
    assert all(key == b"a" for key, _ in sink.records)


# --- status view -----------------------------------------------------------------------------


def test_get_returns_the_latest_status_and_tombstones_remove_it(
    client: WorkflowClient, view: StatusView
) -> None:
    assert client.get("x") is None
    view.apply_record(b"x", encode_message(_status("x", RuntimeStatus.RUNNING)))
    view.apply_record(b"x", encode_message(_status("x", RuntimeStatus.COMPLETED, 3)))
    current = client.get("x")
    assert current is not None and current.status is RuntimeStatus.COMPLETED
    view.apply_record(b"x", None)
    assert client.get("x") is None
    view.apply_record(b"y", b"not avro")
    assert view.skipped == 1


def test_get_waits_for_the_view_to_catch_up(sink: FakeSink) -> None:
    view = StatusView()
    client = WorkflowClient(sink, view, registry=Registry(), ready_timeout_s=0.05)
    with pytest.raises(WaitTimeoutError, match="catch up"):
        client.get("x")
    threading.Timer(0.05, view.mark_ready).start()
    client.ready_timeout_s = 5
    assert client.get("x") is None


def test_waits_resolve_on_the_matching_status(client: WorkflowClient, view: StatusView) -> None:
    done: list[InstanceStatus] = []
    thread = threading.Thread(target=lambda: done.append(client.wait_for_completion("w", 5)))
    thread.start()
    started = client.future("w", lambda s: s.status is RuntimeStatus.RUNNING)
    view.apply("w", _status("w", RuntimeStatus.RUNNING))
    assert started.result(1).status is RuntimeStatus.RUNNING
    assert client.wait_for_start("w", 1).status is RuntimeStatus.RUNNING
    view.apply("w", _status("w", RuntimeStatus.CONTINUED_AS_NEW))
    assert not done
    view.apply("w", _status("w", RuntimeStatus.COMPLETED, "ok"))
    thread.join(5)
    assert done and from_payload(done[0].output) == "ok"
    assert view.waiting == 0
    assert client.wait_for_completion("w", 0.01).status is RuntimeStatus.COMPLETED


def test_a_wait_times_out_with_a_helpful_error(client: WorkflowClient, view: StatusView) -> None:
    with pytest.raises(WaitTimeoutError, match="no status was seen yet"):
        client.wait_for_completion("slow", 0.05)
    view.apply("slow", _status("slow", RuntimeStatus.RUNNING))
    with pytest.raises(WaitTimeoutError, match="its status is RUNNING"):
        client.wait_for_completion("slow", 0.05)
    assert view.waiting == 0, "timed-out waits are forgotten"


def test_many_waits_cost_futures_not_threads(client: WorkflowClient, view: StatusView) -> None:
    futures = [client.completion_future(f"i{n}") for n in range(1000)]
    for n in range(1000):
        view.apply(f"i{n}", _status(f"i{n}", RuntimeStatus.COMPLETED, n))
    assert [from_payload(f.result(0).output) for f in futures] == list(range(1000))


def test_a_failed_reader_fails_the_waits(client: WorkflowClient, view: StatusView) -> None:
    future = client.completion_future("z")
    view.mark_failed(BrokerError("reader died"))
    with pytest.raises(BrokerError, match="reader died"):
        future.result(1)
    with pytest.raises(BrokerError):
        client.get("z")


def test_list_instances_filters(client: WorkflowClient, view: StatusView) -> None:
    view.apply("a", _status("a", RuntimeStatus.RUNNING, created_ms=1000))
    view.apply("b", _status("b", RuntimeStatus.COMPLETED, created_ms=2000))
    view.apply("c", InstanceStatus("c", name="other", status=RuntimeStatus.COMPLETED))
    assert [s.instance_id for s in client.list_instances()] == ["b", "a", "c"]
    assert [s.instance_id for s in client.list_instances(status=RuntimeStatus.COMPLETED)] == [
        "b",
        "c",
    ]
    assert [s.instance_id for s in client.list_instances(name="wf")] == ["b", "a"]
    after = datetime.fromtimestamp(1.5, UTC)
    assert [s.instance_id for s in client.list_instances(created_after=after)] == ["b"]


class _Processor:
    """Answers every command the sink writes, as a turn does: the answer reaches the
    client's outcome reader at once, the turn's status record reaches the view only when
    a read catches up (the status reader lags behind)."""

    def __init__(self, view: StatusView, waiters: OutcomeWaiters) -> None:
        self.view = view
        self.waiters = waiters
        self.unread: list[InstanceStatus] = []
        self.catch_ups: list[list[int]] = []

    # the command sink
    def send(self, key: bytes, value: bytes) -> None:
        command = decode_message(value)
        assert isinstance(command, TerminateWorkflow)
        self.unread.append(_status(command.instance_id, RuntimeStatus.TERMINATED))
        answer = CommandOutcome(
            command.instance_id,
            request_id=command.request_id,
            command=command.KIND,
            status=RuntimeStatus.TERMINATED,
        )
        self.waiters.apply(answer)

    def flush(self, timeout_s: float) -> None:
        pass

    # the status feed
    def partition_of(self, instance_id: str) -> int:
        return 0 if instance_id.startswith("a") else 1

    def catch_up(self, partitions: Collection[int], timeout_s: float) -> None:
        self.catch_ups.append(sorted(partitions))
        for status in [s for s in self.unread if self.partition_of(s.instance_id) in partitions]:
            self.unread.remove(status)
            self.view.apply(status.instance_id, status)


def _status_of(client: WorkflowClient, instance_id: str) -> RuntimeStatus | None:
    state = client.get(instance_id)
    return None if state is None else state.status


def test_a_read_after_an_answer_shows_a_state_at_least_as_new() -> None:
    view, waiters = StatusView(), OutcomeWaiters()
    processor = _Processor(view, waiters)
    view.attach(processor)
    view.mark_ready()
    view.apply("a1", _status("a1", RuntimeStatus.RUNNING))
    view.apply("b1", _status("b1", RuntimeStatus.RUNNING))
    client = WorkflowClient(processor, view, registry=Registry(), outcomes=lambda: waiters)

    assert _status_of(client, "a1") is RuntimeStatus.RUNNING
    assert processor.catch_ups == []  # no answer yet: a read is a lookup
    Verbs(client).terminate("a1")
    assert _status_of(client, "b1") is RuntimeStatus.RUNNING
    assert processor.catch_ups == []  # another partition: nothing to catch up with
    assert _status_of(client, "a1") is RuntimeStatus.TERMINATED
    assert _status_of(client, "a1") is RuntimeStatus.TERMINATED
    assert processor.catch_ups == [[0]]  # once per answer
    Verbs(client).terminate("b1")
    assert {s.status for s in client.list_instances()} == {RuntimeStatus.TERMINATED}
    assert processor.catch_ups == [[0], [1]]


def test_a_client_without_a_reader_yet_skips_the_catch_up(sink: FakeSink) -> None:
    view = StatusView()
    view.note_answer("a1")  # nothing attached: a reader made later starts past the answer
    view.mark_ready()
    assert WorkflowClient(sink, view, registry=Registry()).get("a1") is None


def test_instance_state_decodes_payloads() -> None:
    failure = FailureDetails("ValueError", "bad", retryable=False)
    raw = InstanceStatus(
        "s",
        name="wf",
        status=RuntimeStatus.FAILED,
        created_ms=1_000,
        last_updated_ms=2_000,
        input=to_payload([1, 2]),
        output=to_payload({"a": 1}),
        custom_status=to_payload(b"\x01\x02"),
        failure=failure,
    )
    state = InstanceState(raw)
    assert (state.input, state.output, state.custom_status) == ([1, 2], {"a": 1}, b"\x01\x02")
    assert state.is_completed and state.failure is failure
    data = state.to_dict()
    assert data["custom_status"] == {"encoding": "binary", "size": 2}
    assert data["failure"]["type"] == "ValueError" and data["status"] == "FAILED"
    assert data["created"].startswith("1970-01-01T00:00:01")
