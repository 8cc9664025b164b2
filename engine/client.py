"""The Python client: start workflows, send them events and commands, read and await them.

    from engine.client import Client

    with Client(bootstrap_servers="127.0.0.1:9092") as client:
        instance_id = client.start("orders.checkout", {"order": 42})
        state = client.wait_for_completion(instance_id, timeout=30)
        print(state.status, state.output)

Any Kafka producer can do what :meth:`Client.start` does (produce an Avro ``StartWorkflow``
to the commands topic); this class only makes it convenient. Reads come from the compacted
status topic, folded into memory by a background reader that starts with the client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime
from types import TracebackType
from typing import Any

from engine.adapters.kafka_client import KafkaCommandSink, KafkaStatusReader
from engine.core.history import RuntimeStatus
from engine.core.messages import IdReusePolicy, InstanceStatus
from engine.runtime.registry import Registry
from engine.services.client import InstanceState, StatusView, WorkflowClient
from engine.services.config import Settings, load_settings
from engine.services.topics import topic_names

__all__ = ["Client", "IdReusePolicy", "InstanceState", "RuntimeStatus"]


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
    ) -> str:
        """Start an instance of ``workflow`` (a name or a registered function); returns its id.

        With ``flush=False`` the command is only queued: call :meth:`flush` after a batch.
        """
        return self._service.start(
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
