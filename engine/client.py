"""The Python client: start workflows, send them events and commands, read and await them.

    from engine.client import Client

    with Client(bootstrap_servers="127.0.0.1:9092") as client:
        handle = client.start(checkout, Order(id="o-1", amount=10))
        handle.raise_event("approval", {"ok": True})
        receipt = handle.result(timeout=30)   # a Receipt, by checkout's return annotation

:meth:`Client.start` returns a :class:`WorkflowHandle`, which is the instance id (a ``str``)
with methods for that instance. :class:`AsyncClient` offers the same from asyncio code.

Any Kafka producer can do what :meth:`Client.start` does (produce an Avro ``StartWorkflow``
to the commands topic); this class only makes it convenient. Every command waits for the
processor's answer by default (``wait=False`` skips it, for bulk loads) and a refusal raises
its own error (``WorkflowAlreadyRunningError``, ``InstanceNotFoundError``, ... all
``CommandRefusedError``); the answers come from one reader of the command-outcomes topic
per client, started by the first command that waits. Reads come from the compacted status
topic, folded into memory by a background reader that starts with the client;
:meth:`Client.list_page` of a client without that reader pages the topic with one page in
memory instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from engine.adapters.kafka_client import KafkaCommandSink, KafkaOutcomeReader, KafkaStatusReader
from engine.adapters.kafka_history import ProgressCallback
from engine.adapters.schema_registry import connect_schema_registry
from engine.adapters.status_scan import list_page_from_topic
from engine.adapters.tracing import traced_start
from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings, load_settings
from engine.config.topics import topic_names
from engine.core.errors import InstanceFailedError, WaitTimeoutError
from engine.core.history import RuntimeStatus
from engine.core.messages import (
    CommandOutcome,
    IdReusePolicy,
    InstanceStatus,
    Message,
    ResetTarget,
)
from engine.core.typed import convert, return_type
from engine.runtime.registry import Registry
from engine.services.client import (
    RETRY_REASON,
    InstanceState,
    StatusView,
    WorkflowClient,
    list_filter,
)
from engine.services.listing import DEFAULT_PAGE, InstancePage, PageCollector
from engine.services.outcomes import OutcomeWaiters
from engine.services.schedule_client import ScheduleClient, ScheduleMethods
from engine.services.versions import VersionCount

__all__ = [
    "AsyncClient",
    "AsyncWorkflowHandle",
    "Client",
    "IdReusePolicy",
    "InstancePage",
    "InstanceState",
    "ResetTarget",
    "RuntimeStatus",
    "WorkflowHandle",
]

R = TypeVar("R")


def _state(status: InstanceStatus | None) -> InstanceState | None:
    return None if status is None else InstanceState(status)


class Client(ScheduleMethods):
    """A connection to one engine namespace; thread-safe, meant to be shared and closed.

    Schedules: ``create_schedule``, ``pause_schedule``, ``resume_schedule``,
    ``delete_schedule``, ``trigger_schedule``, ``describe_schedule``, ``list_schedules``."""

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        *,
        settings: Settings | None = None,
        registry: Registry | None = None,
        read_status: bool = True,
        timeout: float = 30.0,
    ) -> None:
        """Connect. ``read_status=False`` skips the status reader (a client that only starts
        workflows); it then starts on the first read. ``timeout`` bounds the wait for the
        status view, for writing a command and for its outcome."""
        if settings is None:
            settings = load_settings(bootstrap_servers=bootstrap_servers, namespace=namespace)
        self.settings = settings
        install_payload_codecs(settings)
        self.topics = topic_names(settings.namespace)
        connect_schema_registry(settings)  # status and outcomes may be registry-framed
        self._sink = KafkaCommandSink(
            settings.bootstrap_servers,
            self.topics.commands,
            dict(settings.extra_kafka),
            connect_timeout_s=settings.connect_timeout_s,
        )
        self._view = StatusView()
        self._reader: KafkaStatusReader | None = None
        self._outcomes = OutcomeWaiters()
        self._outcome_reader: KafkaOutcomeReader | None = None
        self._outcome_lock = threading.Lock()
        self._service = WorkflowClient(
            self._sink,
            self._view,
            registry=registry,
            ready_timeout_s=timeout,
            flush_timeout_s=timeout,
            outcomes=self._start_outcome_reader,
            outcome_timeout_s=timeout,
            limits=settings.limits,
        )
        if read_status:
            try:
                self._start_reader()
            except BaseException:
                self._sink.close()
                raise

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Client:
        return cls(settings=settings, **kwargs)

    def _start_reader(self) -> WorkflowClient:
        if self._reader is None:
            self._reader = KafkaStatusReader(
                self.settings.bootstrap_servers,
                self.topics.status,
                self._view,
                dict(self.settings.extra_kafka),
                connect_timeout_s=self.settings.connect_timeout_s,
            ).start()
        return self._service

    def _start_outcome_reader(self) -> OutcomeWaiters:
        with self._outcome_lock:
            if self._outcome_reader is None:
                self._outcome_reader = KafkaOutcomeReader(
                    self.settings.bootstrap_servers,
                    self.topics.command_outcomes,
                    self._outcomes,
                    dict(self.settings.extra_kafka),
                    connect_timeout_s=self.settings.connect_timeout_s,
                ).start()
        return self._outcomes

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Write pending commands, stop the readers."""
        try:
            self._sink.close()
        finally:
            if self._reader is not None:
                self._reader.close()
            if self._outcome_reader is not None:
                self._outcome_reader.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- commands ---------------------------------------------------------------------------

    @traced_start
    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        instance_id: str | None = None,
        reuse_policy: IdReusePolicy = IdReusePolicy.ERROR_IF_RUNNING,
        request_id: str | None = None,
        start_at: datetime | None = None,
        tags: dict[str, str] | None = None,
        version: str = "",
        concurrency_key: str = "",
        flush: bool = True,
        wait: bool = True,
    ) -> WorkflowHandle[Any]:
        """Start an instance of ``workflow`` (a name or a registered function).

        Returns its :class:`WorkflowHandle` (the instance id, with methods); given the
        function, the handle's :meth:`~WorkflowHandle.result` has its return type. ``input``
        may be a JSON value, a dataclass or a pydantic model. Waits for the processor's
        answer: a refused start raises (``WorkflowAlreadyRunningError`` under
        ERROR_IF_RUNNING, ``WorkflowAlreadyRanError`` under REJECT_DUPLICATE). With
        ``wait=False`` it returns once written; with ``flush=False`` the command is only
        queued (call :meth:`flush` after a batch) and not waited for. ``concurrency_key``
        counts it against the workflow's ``max_concurrency_per_key``: over the limit it
        waits, in order, as PENDING (the answer is BUFFERED) until a slot frees.
        """
        command = self._service.start_command(
            workflow,
            input,
            instance_id=instance_id,
            reuse_policy=reuse_policy,
            request_id=request_id,
            start_at=start_at,
            tags=tags,
            version=version,
            concurrency_key=concurrency_key,
        )
        outcome = self._service.send(command, flush=flush, wait=wait and flush)
        result = None if isinstance(workflow, str) else return_type(workflow)
        return WorkflowHandle(command.instance_id, self, result, outcome)

    def handle(self, instance_id: str, result_type: Any = None) -> WorkflowHandle[Any]:
        """A handle on an existing instance; ``result_type`` converts its result."""
        return WorkflowHandle(instance_id, self, result_type)

    def start_many(
        self, workflow: str | Callable[..., Any], inputs: Iterable[Any], **options: Any
    ) -> list[str]:
        """Start one instance per input, flushing once at the end; returns their ids."""
        return self._service.start_many(workflow, inputs, **options)

    def flush(self) -> None:
        """Wait until every queued command is written (raises BrokerError if one failed)."""
        self._service.flush()

    def raise_event(
        self,
        instance_id: str,
        name: str,
        data: Any = None,
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        """Deliver an external event; returns the processor's answer (None with
        ``wait=False``). An instance that has not started yet keeps the event until it
        starts, at most ``pending_events_ttl_ms`` (then it goes to dead letters), and a
        PARKED one keeps it for its retry (``result`` BUFFERED both); one that ended
        refuses it (InstanceNotRunningError). The same ``request_id`` sent again is
        delivered once."""
        return self._service.raise_event(instance_id, name, data, request_id=request_id, wait=wait)

    def signal_with_start(
        self,
        workflow: str | Callable[..., Any],
        instance_id: str,
        event: str,
        data: Any = None,
        *,
        input: Any = None,
        version: str = "",
        tags: dict[str, str] | None = None,
        request_id: str | None = None,
        wait: bool = True,
        reuse_policy: IdReusePolicy = IdReusePolicy.IGNORE_IF_RUNNING,
    ) -> WorkflowHandle[Any]:
        """Deliver ``event`` to the instance, starting a run of ``workflow`` (with
        ``input``) first unless it is RUNNING, SUSPENDED, PARKED or PENDING, in one atomic
        step. Returns the instance's handle; its ``outcome`` is the processor's answer (the
        reason says which happened) and its ``result()`` waits for the run the event went
        to. ``reuse_policy`` judges an existing instance as for ``start``: the default,
        IGNORE_IF_RUNNING, signals a live one and replaces an ended one (what Temporal's
        signal-with-start does); ERROR_IF_RUNNING refuses a live one
        (WorkflowAlreadyRunningError), TERMINATE_IF_RUNNING replaces it, REJECT_DUPLICATE
        refuses an ended one (WorkflowAlreadyRanError)."""
        outcome = self._service.signal_with_start(
            workflow,
            instance_id,
            event,
            data,
            input=input,
            version=version,
            tags=tags,
            request_id=request_id,
            wait=wait,
            reuse_policy=reuse_policy,
        )
        result = None if isinstance(workflow, str) else return_type(workflow)
        return WorkflowHandle(instance_id, self, result, outcome)

    def terminate(
        self,
        instance_id: str,
        reason: str = "",
        recursive: bool = False,
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        """End the instance TERMINATED (``recursive``: its running children too)."""
        return self._service.terminate(
            instance_id, reason, recursive, request_id=request_id, wait=wait
        )

    def suspend(
        self,
        instance_id: str,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        return self._service.suspend(instance_id, reason, request_id=request_id, wait=wait)

    def resume(
        self,
        instance_id: str,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        return self._service.resume(instance_id, reason, request_id=request_id, wait=wait)

    def purge(
        self, instance_id: str, *, request_id: str | None = None, wait: bool = True
    ) -> CommandOutcome | None:
        """Remove an ended instance's state and status (InstanceStillRunningError while
        it runs)."""
        return self._service.purge(instance_id, request_id=request_id, wait=wait)

    def reset(
        self,
        instance_id: str,
        to: int | ResetTarget,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        """Start a new run (the next generation) of the instance from its current run's
        history up to ``to``: a sequence number (``turnstile history show``), or
        ``ResetTarget.LAST_FAILURE`` / ``ResetTarget.FIRST_TURN``. The turns before the
        point are reused, the rest is done again; ``reason`` is recorded in history.
        Refused with ``InvalidResetPointError`` for a point the run does not have."""
        return self._service.reset(instance_id, to, reason, request_id=request_id, wait=wait)

    def rerun(
        self,
        instance_id: str,
        new_id: str,
        to: int | ResetTarget = ResetTarget.FIRST_TURN,
        reason: str = "",
        *,
        request_id: str | None = None,
        wait: bool = True,
    ) -> CommandOutcome | None:
        """As :meth:`reset`, but the new run is a new instance ``new_id`` (an unused id or
        one whose run ended); the source instance is left as it is."""
        return self._service.reset(
            instance_id, to, reason, new_instance_id=new_id, request_id=request_id, wait=wait
        )

    def retry(
        self, instance_id: str, *, request_id: str | None = None, wait: bool = True
    ) -> CommandOutcome | None:
        """Run a parked instance (one whose workflow code raised unexpectedly) again now,
        with the code deployed now, instead of at its next scheduled retry.

        It is sent as a resume: a suspended instance resumes, one neither parked nor
        suspended refuses it (InstanceNotSuspendedError)."""
        return self._service.resume(instance_id, RETRY_REASON, request_id=request_id, wait=wait)

    def _schedule_client(self) -> ScheduleClient:
        return ScheduleClient(self._start_reader())

    def send_expecting(self, command: Message) -> Future[CommandOutcome] | None:
        """Write a command record without flushing or waiting; the future resolves to the
        processor's answer (bulk operations keep many in flight). ``flush()`` writes them."""
        return self._service.send_expecting(command)

    def answer(
        self, request_id: str, future: Future[CommandOutcome], timeout_s: float
    ) -> CommandOutcome:
        """The answer of a :meth:`send_expecting` command (a refusal is returned, not
        raised); CommandTimeoutError when none came within ``timeout_s``."""
        return self._service.answer(request_id, future, timeout_s)

    # --- reads ------------------------------------------------------------------------------

    def get(self, instance_id: str) -> InstanceState | None:
        """The instance's latest status (payloads decoded), or None if unknown."""
        return _state(self._start_reader().get(instance_id))

    def list_instances(
        self,
        *,
        status: RuntimeStatus | Iterable[RuntimeStatus] | None = None,
        name: str | None = None,
        created_after: datetime | None = None,
        tags: dict[str, str] | None = None,
        version: str | None = None,
    ) -> list[InstanceState]:
        """Every matching instance, newest first, from the live status view (all of it in
        memory: use ``list_page`` for large namespaces), filtered by status, workflow name,
        creation time, tags (every pair) and the workflow version they run."""
        found = self._start_reader().list_instances(
            status=status, name=name, created_after=created_after, tags=tags, version=version
        )
        return [InstanceState(s) for s in found]

    def list_page(
        self,
        *,
        status: RuntimeStatus | Iterable[RuntimeStatus] | None = None,
        name: str | None = None,
        created_after: datetime | None = None,
        tags: dict[str, str] | None = None,
        version: str | None = None,
        limit: int = DEFAULT_PAGE,
        page_token: str | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> InstancePage[InstanceState]:
        """One page of matching instances, newest first (``tags``: every pair must match);
        pass its ``next_page_token`` for the next page (None: it was the last).

        A client that already reads the status topic (``read_status=True``, or after a
        read) pages its live view. One that does not reads the topic once for this page,
        folding it on disk (``engine.adapters.status_scan``), so the list holds one page in
        memory however many instances there are; ``on_progress`` hears about that read.
        """
        wanted = list_filter(
            status=status, name=name, version=version, tags=tags, created_after=created_after
        )
        collector = PageCollector(wanted, limit, page_token)  # bad arguments fail here
        if self._reader is not None:
            page = self._service.list_page(collector)
        else:
            page = list_page_from_topic(self.settings, collector, on_progress=on_progress)
        return InstancePage([InstanceState(s) for s in page.items], page.next_page_token)

    def versions(self, name: str | None = None) -> list[VersionCount]:
        """How many instances run each workflow version, open and ended (a version without
        open instances can be removed: docs/how-to/change-code.md)."""
        return self._start_reader().versions(name)

    def wait_for_start(self, instance_id: str, timeout: float | None = None) -> InstanceState:
        """Block until the instance has started; raises WaitTimeoutError after ``timeout``."""
        return InstanceState(self._start_reader().wait_for_start(instance_id, timeout))

    def wait_for_completion(
        self, instance_id: str, timeout: float | None = None, *, generation: int = 0
    ) -> InstanceState:
        """Block until the instance ended (in ``generation`` or a later one, so the end of
        an earlier run does not count); raises WaitTimeoutError after ``timeout``."""
        service = self._start_reader()
        return InstanceState(
            service.wait_for_completion(instance_id, timeout, generation=generation)
        )

    def completion_future(self, instance_id: str, generation: int = 0) -> Future[InstanceStatus]:
        """A future of the instance's final status: many waits without a thread each."""
        return self._start_reader().completion_future(instance_id, generation)


class _InstanceHandle(str):
    """What both handles share: being the instance id, the client, the result type, and
    the answer to the command that made it (start, signal-with-start)."""

    _client: Any
    _result_type: Any
    _outcome: CommandOutcome | None

    def __new__(
        cls,
        instance_id: str,
        client: Any,
        result_type: Any = None,
        outcome: CommandOutcome | None = None,
    ) -> Self:
        handle = super().__new__(cls, instance_id)
        handle._client = client
        handle._result_type = result_type
        handle._outcome = outcome
        return handle

    @property
    def outcome(self) -> CommandOutcome | None:
        """The processor's answer to the start (None: not waited for, or a plain handle)."""
        return self._outcome

    @property
    def generation(self) -> int:
        """The generation the start began (0 when unknown): ``result()`` waits for the end
        of that run or a later one, never an earlier run of the same id."""
        return 0 if self._outcome is None else self._outcome.generation

    @property
    def instance_id(self) -> str:
        return str(self)

    @property
    def result_type(self) -> Any:
        """What ``result()`` converts the output to (None: plain JSON)."""
        return self._result_type


class WorkflowHandle(_InstanceHandle, Generic[R]):
    """One instance: its id (this string itself) and what can be done with it.

    Being the id, a handle can be printed, stored, compared and used as a dict key; it
    works wherever an instance id does.
    """

    _client: Client

    def result(self, timeout: float | None = None) -> R:
        """Wait until the instance ends and return its result (converted to the workflow's
        return type). Raises InstanceFailedError if it FAILED or was TERMINATED,
        WaitTimeoutError after ``timeout`` seconds."""
        state = self._client.wait_for_completion(self, timeout, generation=self.generation)
        value: R = _result_of(state, self._result_type)
        return value

    def status(self) -> InstanceState | None:
        """The latest status, or None if the instance is not known (yet, or any more)."""
        return self._client.get(self)

    def raise_event(self, name: str, data: Any = None, **options: Any) -> CommandOutcome | None:
        """See :meth:`Client.raise_event` (``request_id``, ``wait``)."""
        return self._client.raise_event(self, name, data, **options)

    def terminate(
        self, reason: str = "", recursive: bool = False, *, wait: bool = True
    ) -> CommandOutcome | None:
        return self._client.terminate(self, reason, recursive, wait=wait)

    def suspend(self, reason: str = "", *, wait: bool = True) -> CommandOutcome | None:
        return self._client.suspend(self, reason, wait=wait)

    def resume(self, reason: str = "", *, wait: bool = True) -> CommandOutcome | None:
        return self._client.resume(self, reason, wait=wait)

    def purge(self, *, wait: bool = True) -> CommandOutcome | None:
        return self._client.purge(self, wait=wait)

    def retry(self, *, wait: bool = True) -> CommandOutcome | None:
        """See :meth:`Client.retry`."""
        return self._client.retry(self, wait=wait)


def _result_of(state: InstanceState, result_type: Any) -> Any:
    if state.status is not RuntimeStatus.COMPLETED:
        failure = state.failure
        why = f": {failure.type}: {failure.message}" if failure is not None else ""
        raise InstanceFailedError(
            f"instance {state.instance_id!r} ended {state.status.value}{why}", failure
        )
    return convert(state.output, result_type)


class AsyncClient:
    """The client for asyncio code: the same operations, awaitable.

    Commands and reads run on a worker thread (they may block on Kafka); waits are futures
    resolved by the status reader, so a thousand concurrent waits cost no threads.

        async with AsyncClient() as client:
            handle = await client.start(checkout, order)
            receipt = await handle.result(timeout=30)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Takes the arguments of :class:`Client`; connecting happens on :meth:`connect`
        (or ``async with``), off the event loop."""
        self._args = args
        self._kwargs = kwargs
        self._client: Client | None = None

    @property
    def sync(self) -> Client:
        """The underlying :class:`Client` (raises if not connected)."""
        if self._client is None:
            raise RuntimeError("AsyncClient is not connected: use 'async with' or connect()")
        return self._client

    async def connect(self) -> AsyncClient:
        if self._client is None:
            self._client = await asyncio.to_thread(Client, *self._args, **self._kwargs)
        return self

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.close)

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(
        self, workflow: str | Callable[..., Any], input: Any = None, **options: Any
    ) -> AsyncWorkflowHandle[Any]:
        """As :meth:`Client.start`; returns an :class:`AsyncWorkflowHandle`."""
        handle = await asyncio.to_thread(self.sync.start, workflow, input, **options)
        return AsyncWorkflowHandle(handle, self, handle.result_type, handle.outcome)

    def handle(self, instance_id: str, result_type: Any = None) -> AsyncWorkflowHandle[Any]:
        return AsyncWorkflowHandle(instance_id, self, result_type)

    async def signal_with_start(
        self,
        workflow: str | Callable[..., Any],
        instance_id: str,
        event: str,
        data: Any = None,
        **options: Any,
    ) -> AsyncWorkflowHandle[Any]:
        """As :meth:`Client.signal_with_start`."""
        handle = await asyncio.to_thread(
            self.sync.signal_with_start, workflow, instance_id, event, data, **options
        )
        return AsyncWorkflowHandle(handle, self, handle.result_type, handle.outcome)

    async def raise_event(
        self, instance_id: str, name: str, data: Any = None, **options: Any
    ) -> CommandOutcome | None:
        """As :meth:`Client.raise_event`: the answer, or the refusal's error."""
        return await asyncio.to_thread(self.sync.raise_event, instance_id, name, data, **options)

    async def terminate(
        self, instance_id: str, reason: str = "", recursive: bool = False, **options: Any
    ) -> CommandOutcome | None:
        return await asyncio.to_thread(
            self.sync.terminate, instance_id, reason, recursive, **options
        )

    async def suspend(
        self, instance_id: str, reason: str = "", **options: Any
    ) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.suspend, instance_id, reason, **options)

    async def resume(
        self, instance_id: str, reason: str = "", **options: Any
    ) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.resume, instance_id, reason, **options)

    async def purge(self, instance_id: str, **options: Any) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.purge, instance_id, **options)

    async def retry(self, instance_id: str, **options: Any) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.retry, instance_id, **options)

    async def create_schedule(
        self, name: str, workflow: Any, input: Any = None, **options: Any
    ) -> CommandOutcome | None:
        """As :meth:`Client.create_schedule` (and so on for the other schedule methods)."""
        return await asyncio.to_thread(self.sync.create_schedule, name, workflow, input, **options)

    async def pause_schedule(
        self, name: str, reason: str = "", **options: Any
    ) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.pause_schedule, name, reason, **options)

    async def resume_schedule(self, name: str, **options: Any) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.resume_schedule, name, **options)

    async def delete_schedule(self, name: str, **options: Any) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.delete_schedule, name, **options)

    async def trigger_schedule(self, name: str, **options: Any) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.trigger_schedule, name, **options)

    async def describe_schedule(self, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.sync.describe_schedule, name)

    async def list_schedules(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sync.list_schedules)

    async def reset(
        self, instance_id: str, to: int | ResetTarget, reason: str = "", **options: Any
    ) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.reset, instance_id, to, reason, **options)

    async def rerun(
        self,
        instance_id: str,
        new_id: str,
        to: int | ResetTarget = ResetTarget.FIRST_TURN,
        reason: str = "",
        **options: Any,
    ) -> CommandOutcome | None:
        return await asyncio.to_thread(self.sync.rerun, instance_id, new_id, to, reason, **options)

    async def get(self, instance_id: str) -> InstanceState | None:
        return await asyncio.to_thread(self.sync.get, instance_id)

    async def list_instances(self, **filters: Any) -> list[InstanceState]:
        return await asyncio.to_thread(self.sync.list_instances, **filters)

    async def list_page(self, **filters: Any) -> InstancePage[InstanceState]:
        """One page of instances (``Client.list_page``), off the event loop."""
        return await asyncio.to_thread(lambda: self.sync.list_page(**filters))

    async def versions(self, name: str | None = None) -> list[VersionCount]:
        return await asyncio.to_thread(self.sync.versions, name)

    async def wait_for_completion(
        self, instance_id: str, timeout: float | None = None, *, generation: int = 0
    ) -> InstanceState:
        """Wait until the instance ended (in ``generation`` or later); raises
        WaitTimeoutError after ``timeout``."""
        future = await asyncio.to_thread(self.sync.completion_future, instance_id, generation)
        try:
            status = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            future.cancel()
            raise WaitTimeoutError(
                f"instance {instance_id!r} did not complete within {timeout}s; check that a "
                f"processor runs for this namespace"
            ) from None
        return InstanceState(status)


class AsyncWorkflowHandle(_InstanceHandle, Generic[R]):
    """:class:`WorkflowHandle` for asyncio code: the instance id, with awaitable methods."""

    _client: AsyncClient

    async def result(self, timeout: float | None = None) -> R:
        """As :meth:`WorkflowHandle.result`."""
        state = await self._client.wait_for_completion(self, timeout, generation=self.generation)
        value: R = _result_of(state, self._result_type)
        return value

    async def status(self) -> InstanceState | None:
        return await self._client.get(self)

    async def raise_event(
        self, name: str, data: Any = None, **options: Any
    ) -> CommandOutcome | None:
        return await self._client.raise_event(self, name, data, **options)

    async def terminate(
        self, reason: str = "", recursive: bool = False, **options: Any
    ) -> CommandOutcome | None:
        return await self._client.terminate(self, reason, recursive, **options)

    async def suspend(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return await self._client.suspend(self, reason, **options)

    async def resume(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return await self._client.resume(self, reason, **options)

    async def purge(self, **options: Any) -> CommandOutcome | None:
        return await self._client.purge(self, **options)
