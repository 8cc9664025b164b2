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
from typing import Any, Generic, TypeVar

from engine.adapters.kafka.client import KafkaCommandSink, KafkaOutcomeReader, KafkaStatusReader
from engine.adapters.kafka.history import ProgressCallback
from engine.adapters.kafka.payloads import payload_store
from engine.adapters.schema_registry import connect_schema_registry
from engine.adapters.status_scan import list_page_from_topic
from engine.adapters.tracing import traced_start
from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings, load_settings
from engine.config.topics import topic_names
from engine.core.errors import WaitTimeoutError
from engine.core.history import RuntimeStatus
from engine.core.messages import (
    CommandOutcome,
    IdReusePolicy,
    InstanceStatus,
    Message,
    ResetTarget,
)
from engine.runtime.registry import Registry
from engine.services.client.commands import (
    CommandMethods,
    InstanceHandle,
    WorkflowHandle,
    result_of,
)
from engine.services.client.listing import DEFAULT_PAGE, InstancePage, PageCollector
from engine.services.client.outcomes import OutcomeWaiters
from engine.services.client.schedule_client import ScheduleClient, ScheduleMethods
from engine.services.client.versions import VersionCount
from engine.services.client.workflow_client import (
    InstanceState,
    StatusView,
    WorkflowClient,
    list_filter,
)
from engine.services.large_payloads import PayloadOffloader

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


class Client(CommandMethods, ScheduleMethods):
    """A connection to one engine namespace; thread-safe, meant to be shared and closed.

    Commands (:class:`CommandMethods`): ``start``, ``signal_with_start``, ``raise_event``,
    ``terminate``, ``cancel``, ``suspend``, ``resume``, ``retry``, ``purge``, ``reset``, ``rerun``,
    ``start_many``, ``handle``.

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
        self._service.offload = PayloadOffloader(settings.limits, payload_store(settings))
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

    # --- commands (the verbs are CommandMethods'; this client sends them to Kafka) ----------

    def _command_client(self) -> WorkflowClient:
        return self._service

    start = traced_start(CommandMethods.start)

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

    async def cancel(
        self, instance_id: str, reason: str = "", **options: Any
    ) -> CommandOutcome | None:
        """As :meth:`Client.cancel`."""
        return await asyncio.to_thread(self.sync.cancel, instance_id, reason, **options)

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

    async def query(
        self, instance_id: str, name: str, *args: Any, timeout: float | None = None
    ) -> Any:
        """As :meth:`Client.query`."""
        return await asyncio.to_thread(self.sync.query, instance_id, name, *args, timeout=timeout)

    async def complete_activity(self, token: str, result: Any = None) -> None:
        """As :meth:`Client.complete_activity`."""
        await asyncio.to_thread(self.sync.complete_activity, token, result)

    async def fail_activity(self, token: str, error: BaseException | str) -> None:
        """As :meth:`Client.fail_activity`."""
        await asyncio.to_thread(self.sync.fail_activity, token, error)

    async def heartbeat_activity(self, token: str, details: Any = None) -> None:
        """As :meth:`Client.heartbeat_activity`."""
        await asyncio.to_thread(self.sync.heartbeat_activity, token, details)

    async def update(self, instance_id: str, name: str, arg: Any = None, **options: Any) -> Any:
        """As :meth:`Client.update`."""
        return await asyncio.to_thread(self.sync.update, instance_id, name, arg, **options)

    async def update_with_start(self, workflow: Any, input: Any = None, **options: Any) -> Any:
        """As :meth:`Client.update_with_start`."""
        return await asyncio.to_thread(self.sync.update_with_start, workflow, input, **options)

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


class AsyncWorkflowHandle(InstanceHandle, Generic[R]):
    """:class:`WorkflowHandle` for asyncio code: the instance id, with awaitable methods."""

    _client: AsyncClient

    async def result(self, timeout: float | None = None) -> R:
        """As :meth:`WorkflowHandle.result`."""
        state = await self._client.wait_for_completion(self, timeout, generation=self.generation)
        value: R = result_of(state, self._result_type)
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

    async def cancel(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return await self._client.cancel(self, reason, **options)

    async def suspend(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return await self._client.suspend(self, reason, **options)

    async def resume(self, reason: str = "", **options: Any) -> CommandOutcome | None:
        return await self._client.resume(self, reason, **options)

    async def purge(self, **options: Any) -> CommandOutcome | None:
        return await self._client.purge(self, **options)

    async def retry(self, **options: Any) -> CommandOutcome | None:
        """As :meth:`WorkflowHandle.retry`."""
        return await self._client.retry(self, **options)

    async def query(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        """As :meth:`WorkflowHandle.query`."""
        return await self._client.query(self, name, *args, timeout=timeout)

    async def update(self, name: str, arg: Any = None, **options: Any) -> Any:
        """As :meth:`WorkflowHandle.update`."""
        return await self._client.update(self, name, arg, **options)
