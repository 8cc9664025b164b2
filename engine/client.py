"""The Python client: start workflows, send them events and commands, read and await them.

    from engine.client import Client

    with Client(bootstrap_servers="127.0.0.1:9092") as client:
        handle = client.start(checkout, Order(id="o-1", amount=10))
        handle.raise_event("approval", {"ok": True})
        receipt = handle.result(timeout=30)   # a Receipt, by checkout's return annotation

:meth:`Client.start` returns a :class:`WorkflowHandle`, which is the instance id (a ``str``)
with methods for that instance. :class:`AsyncClient` offers the same from asyncio code.

Any Kafka producer can do what :meth:`Client.start` does (produce an Avro ``StartWorkflow``
to the commands topic); this class only makes it convenient. Reads come from the compacted
status topic, folded into memory by a background reader that starts with the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from engine.adapters.kafka_client import KafkaCommandSink, KafkaStatusReader
from engine.adapters.tracing import traced_start
from engine.config.settings import Settings, load_settings
from engine.config.topics import topic_names
from engine.core.errors import InstanceFailedError, WaitTimeoutError
from engine.core.history import RuntimeStatus
from engine.core.messages import IdReusePolicy, InstanceStatus
from engine.core.typed import convert, return_type
from engine.runtime.registry import Registry
from engine.services.client import RETRY_REASON, InstanceState, StatusView, WorkflowClient

__all__ = [
    "AsyncClient",
    "AsyncWorkflowHandle",
    "Client",
    "IdReusePolicy",
    "InstanceState",
    "RuntimeStatus",
    "WorkflowHandle",
]

R = TypeVar("R")


def _state(status: InstanceStatus | None) -> InstanceState | None:
    return None if status is None else InstanceState(status)


class Client:
    """A connection to one engine namespace; thread-safe, meant to be shared and closed."""

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
        workflows); it then starts on the first read."""
        if settings is None:
            settings = load_settings(bootstrap_servers=bootstrap_servers, namespace=namespace)
        self.settings = settings
        self.topics = topic_names(settings.namespace)
        self._sink = KafkaCommandSink(
            settings.bootstrap_servers,
            self.topics.commands,
            dict(settings.extra_kafka),
            connect_timeout_s=settings.connect_timeout_s,
        )
        self._view = StatusView()
        self._reader: KafkaStatusReader | None = None
        self._service = WorkflowClient(
            self._sink,
            self._view,
            registry=registry,
            ready_timeout_s=timeout,
            flush_timeout_s=timeout,
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

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Write pending commands, stop the status reader."""
        try:
            self._sink.close()
        finally:
            if self._reader is not None:
                self._reader.close()

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
        flush: bool = True,
    ) -> WorkflowHandle[Any]:
        """Start an instance of ``workflow`` (a name or a registered function).

        Returns its :class:`WorkflowHandle` (the instance id, with methods); given the
        function, the handle's :meth:`~WorkflowHandle.result` has its return type. ``input``
        may be a JSON value, a dataclass or a pydantic model. With ``flush=False`` the
        command is only queued: call :meth:`flush` after a batch.
        """
        started = self._service.start(
            workflow,
            input,
            instance_id=instance_id,
            reuse_policy=reuse_policy,
            request_id=request_id,
            start_at=start_at,
            tags=tags,
            version=version,
            flush=flush,
        )
        result = None if isinstance(workflow, str) else return_type(workflow)
        return WorkflowHandle(started, self, result)

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

    def raise_event(self, instance_id: str, name: str, data: Any = None) -> None:
        self._service.raise_event(instance_id, name, data)

    def terminate(self, instance_id: str, reason: str = "", recursive: bool = False) -> None:
        self._service.terminate(instance_id, reason, recursive)

    def suspend(self, instance_id: str, reason: str = "") -> None:
        self._service.suspend(instance_id, reason)

    def resume(self, instance_id: str, reason: str = "") -> None:
        self._service.resume(instance_id, reason)

    def purge(self, instance_id: str) -> None:
        self._service.purge(instance_id)

    def retry(self, instance_id: str) -> None:
        """Run a parked instance (one whose workflow code raised unexpectedly) again now,
        with the code deployed now, instead of at its next scheduled retry.

        It is sent as a resume, which an instance that is not parked ignores unless it is
        suspended (then it resumes)."""
        self._service.resume(instance_id, RETRY_REASON)

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
    ) -> list[InstanceState]:
        found = self._start_reader().list_instances(
            status=status, name=name, created_after=created_after
        )
        return [InstanceState(s) for s in found]

    def wait_for_start(self, instance_id: str, timeout: float | None = None) -> InstanceState:
        """Block until the instance has started; raises WaitTimeoutError after ``timeout``."""
        return InstanceState(self._start_reader().wait_for_start(instance_id, timeout))

    def wait_for_completion(self, instance_id: str, timeout: float | None = None) -> InstanceState:
        """Block until the instance ended; raises WaitTimeoutError after ``timeout``."""
        return InstanceState(self._start_reader().wait_for_completion(instance_id, timeout))

    def completion_future(self, instance_id: str) -> Future[InstanceStatus]:
        """A future of the instance's final status: many waits without a thread each."""
        return self._start_reader().completion_future(instance_id)


class _InstanceHandle(str):
    """What both handles share: being the instance id, the client, the result type."""

    _client: Any
    _result_type: Any

    def __new__(cls, instance_id: str, client: Any, result_type: Any = None) -> Self:
        handle = super().__new__(cls, instance_id)
        handle._client = client
        handle._result_type = result_type
        return handle

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
        value: R = _result_of(self._client.wait_for_completion(self, timeout), self._result_type)
        return value

    def status(self) -> InstanceState | None:
        """The latest status, or None if the instance is not known (yet, or any more)."""
        return self._client.get(self)

    def raise_event(self, name: str, data: Any = None) -> None:
        self._client.raise_event(self, name, data)

    def terminate(self, reason: str = "", recursive: bool = False) -> None:
        self._client.terminate(self, reason, recursive)

    def suspend(self, reason: str = "") -> None:
        self._client.suspend(self, reason)

    def resume(self, reason: str = "") -> None:
        self._client.resume(self, reason)

    def retry(self) -> None:
        """See :meth:`Client.retry`."""
        self._client.retry(self)


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
        return AsyncWorkflowHandle(handle, self, handle.result_type)

    def handle(self, instance_id: str, result_type: Any = None) -> AsyncWorkflowHandle[Any]:
        return AsyncWorkflowHandle(instance_id, self, result_type)

    async def raise_event(self, instance_id: str, name: str, data: Any = None) -> None:
        await asyncio.to_thread(self.sync.raise_event, instance_id, name, data)

    async def terminate(self, instance_id: str, reason: str = "", recursive: bool = False) -> None:
        await asyncio.to_thread(self.sync.terminate, instance_id, reason, recursive)

    async def suspend(self, instance_id: str, reason: str = "") -> None:
        await asyncio.to_thread(self.sync.suspend, instance_id, reason)

    async def resume(self, instance_id: str, reason: str = "") -> None:
        await asyncio.to_thread(self.sync.resume, instance_id, reason)

    async def purge(self, instance_id: str) -> None:
        await asyncio.to_thread(self.sync.purge, instance_id)

    async def retry(self, instance_id: str) -> None:
        await asyncio.to_thread(self.sync.retry, instance_id)

    async def get(self, instance_id: str) -> InstanceState | None:
        return await asyncio.to_thread(self.sync.get, instance_id)

    async def list_instances(self, **filters: Any) -> list[InstanceState]:
        return await asyncio.to_thread(self.sync.list_instances, **filters)

    async def wait_for_completion(
        self, instance_id: str, timeout: float | None = None
    ) -> InstanceState:
        """Wait until the instance ended; raises WaitTimeoutError after ``timeout``."""
        future = await asyncio.to_thread(self.sync.completion_future, instance_id)
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
        state = await self._client.wait_for_completion(self, timeout)
        value: R = _result_of(state, self._result_type)
        return value

    async def status(self) -> InstanceState | None:
        return await self._client.get(self)

    async def raise_event(self, name: str, data: Any = None) -> None:
        await self._client.raise_event(self, name, data)

    async def terminate(self, reason: str = "", recursive: bool = False) -> None:
        await self._client.terminate(self, reason, recursive)
