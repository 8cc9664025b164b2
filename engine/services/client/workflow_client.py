"""The workflow client's logic: build commands, keep a live view of instance statuses, wait.

Writes are commands produced to the commands topic (keyed by instance id, so that they land
on the instance's partition); each carries a request id, and by default the client waits for
the processor's answer to it (``engine.services.client.outcomes``) and raises a refusal as a typed
error. Reads never ask the processor anything: the processor keeps
the latest metadata of every instance on the compacted status topic, and the client folds
that topic into an in-memory view (:class:`StatusView`). A read waits once, on first use,
until the view holds what was committed on the topic when the client started (never for
a transaction still open); after that ``get`` is a dictionary lookup and every wait is a
future resolved by the record that satisfies it - a thousand concurrent waits cost a
thousand futures, not a thousand polling loops. A read after a command's answer first
catches up with the instance's partition (:meth:`StatusView.note_answer`), so it shows a
state at least as new as the answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from engine.codec import decode_message, encode_message
from engine.core.errors import CodecError, WaitTimeoutError
from engine.core.failure import FailureDetails
from engine.core.history import RuntimeStatus
from engine.core.limits import Limits
from engine.core.messages import (
    CommandOutcome,
    InstanceStatus,
    Message,
    RaiseEvent,
    SignalWithStart,
    StartWorkflow,
)
from engine.core.payloads import Payload, describe_payload, from_payload
from engine.runtime.jsonhistory import failure_to_json
from engine.runtime.registry import Registry, default_registry
from engine.services.client.listing import InstanceFilter, InstancePage, PageCollector
from engine.services.client.outcomes import OutcomeWaiters, raise_for_refusal
from engine.services.client.versions import VersionCount, count_versions

__all__ = [
    "CommandSink",
    "InstanceState",
    "StatusFeed",
    "StatusPredicate",
    "StatusView",
    "WorkflowClient",
    "completed_since",
    "is_completed",
    "is_started",
    "list_filter",
]

log = logging.getLogger(__name__)

#: The payload fields of the commands a client writes (what may be put aside).
_PAYLOAD_FIELDS: dict[type, tuple[str, ...]] = {
    StartWorkflow: ("input",),
    RaiseEvent: ("input",),
    SignalWithStart: ("input", "event_input"),
}

StatusPredicate = Callable[[InstanceStatus], bool]


def is_started(status: InstanceStatus) -> bool:
    """The instance left PENDING (it runs, or already ended)."""
    return status.status is not RuntimeStatus.PENDING


def is_completed(status: InstanceStatus) -> bool:
    """The instance ended: COMPLETED, FAILED, TERMINATED, CANCELLED or TIMED_OUT (not
    CONTINUED_AS_NEW)."""
    return status.status.is_terminal


def completed_since(generation: int) -> StatusPredicate:
    """The instance ended in ``generation`` or a later one: a wait that must not be
    satisfied by the end of a run before the one a start began."""
    return lambda status: status.status.is_terminal and status.generation >= generation


# --- ports ---------------------------------------------------------------------------------


class CommandSink(Protocol):
    """Where commands go (a Kafka producer on the commands topic)."""

    def send(self, key: bytes, value: bytes) -> None:
        """Queue one record; may return before it is written."""
        ...

    def flush(self, timeout_s: float) -> None:
        """Wait until every queued record is written; raise BrokerError if one failed."""
        ...


class StatusFeed(Protocol):
    """What the reader that feeds a :class:`StatusView` offers besides the records."""

    def partition_of(self, instance_id: str) -> int:
        """The status partition that holds the instance."""
        ...

    def catch_up(self, partitions: Collection[int], timeout_s: float) -> None:
        """Block until the view holds every status committed on ``partitions`` as of this
        call; raise ``WaitTimeoutError`` after ``timeout_s``."""
        ...


# --- the status view -----------------------------------------------------------------------


@dataclass(eq=False)
class _Waiter:
    predicate: StatusPredicate
    future: Future[InstanceStatus]


class StatusView:
    """Latest status per instance, fed from the status topic by a background reader.

    Thread-safe: the reader thread calls :meth:`apply_record`, :meth:`mark_ready` and
    :meth:`mark_failed`; any thread reads and waits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, InstanceStatus] = {}
        self._waiters: dict[str, list[_Waiter]] = {}
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._feed: StatusFeed | None = None
        #: partition -> number of the latest answer about one of its instances not caught up
        self._behind: dict[int, int] = {}
        self._answers = 0
        self.records = 0
        self.skipped = 0

    def attach(self, feed: StatusFeed) -> None:
        """The reader that feeds this view; reads after an answer catch up through it."""
        self._feed = feed

    # --- feeding ----------------------------------------------------------------------------

    def apply_record(self, key: bytes | None, value: bytes | None) -> None:
        """Fold one status-topic record in (a tombstone removes the instance)."""
        self.records += 1
        if value is None:
            if key is not None:
                self.apply(key.decode("utf-8", "replace"), None)
            return
        try:
            message = decode_message(value)
        except CodecError as exc:
            self.skipped += 1
            log.warning("skipping an undecodable status record: %s", exc)
            return
        if not isinstance(message, InstanceStatus):
            self.skipped += 1
            return
        self.apply(message.instance_id, message)

    def apply(self, instance_id: str, status: InstanceStatus | None) -> None:
        """Set (or, with None, remove) an instance's status and resolve satisfied waits."""
        resolved: list[_Waiter] = []
        with self._lock:
            if status is None:
                self._states.pop(instance_id, None)
                return
            self._states[instance_id] = status
            waiters = self._waiters.get(instance_id)
            if waiters:
                resolved = [w for w in waiters if w.predicate(status)]
                if resolved:
                    remaining = [w for w in waiters if w not in resolved]
                    if remaining:
                        self._waiters[instance_id] = remaining
                    else:
                        del self._waiters[instance_id]
        for waiter in resolved:
            _resolve(waiter.future, status)

    def mark_ready(self) -> None:
        """The view has caught up with the topic's end as of the client's start."""
        self._ready.set()

    def mark_failed(self, error: BaseException) -> None:
        """The reader stopped for good; every read and wait now raises ``error``."""
        with self._lock:
            self._error = error
            waiters = [w for ws in self._waiters.values() for w in ws]
            self._waiters.clear()
        self._ready.set()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)

    # --- reading ----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout_s: float) -> None:
        """Block until caught up; raises what stopped the reader, or on timeout."""
        if not self._ready.wait(timeout_s):
            raise WaitTimeoutError(
                f"the status view did not catch up with the status topic within "
                f"{timeout_s:.0f}s; check that Kafka is reachable, or pass a longer timeout"
            )
        if self._error is not None:
            raise self._error

    def note_answer(self, instance_id: str) -> None:
        """A command's answer about ``instance_id`` arrived. The answer and the status record
        of its turn are in one transaction, so it is committed; the next read of the
        instance catches up with its partition first and shows a state at least as new."""
        feed = self._feed
        if feed is None:  # no reader yet: the one started later begins past the answer
            return
        partition = feed.partition_of(instance_id)
        with self._lock:
            self._answers += 1
            self._behind[partition] = self._answers

    def wait_current(self, timeout_s: float, instance_id: str | None = None) -> None:
        """:meth:`wait_ready`, then catch up with the partition of ``instance_id`` (None:
        every partition) if an answer about one of its instances came since the last time."""
        self.wait_ready(timeout_s)
        feed = self._feed
        with self._lock:
            if instance_id is None or feed is None:
                behind = dict(self._behind)
            else:
                partition = feed.partition_of(instance_id)
                behind = {p: n for p, n in self._behind.items() if p == partition}
        if not behind or feed is None:
            return
        feed.catch_up(list(behind), timeout_s)
        if self._error is not None:
            raise self._error
        with self._lock:
            for partition, answer in behind.items():
                if self._behind.get(partition) == answer:
                    del self._behind[partition]

    def get(self, instance_id: str) -> InstanceStatus | None:
        with self._lock:
            return self._states.get(instance_id)

    def snapshot(self) -> list[InstanceStatus]:
        with self._lock:
            return list(self._states.values())

    def watch(self, instance_id: str, predicate: StatusPredicate) -> Future[InstanceStatus]:
        """A future resolved with the first status of the instance that satisfies
        ``predicate`` (at once if the current one does)."""
        future: Future[InstanceStatus] = Future()
        with self._lock:
            if self._error is not None:
                future.set_exception(self._error)
                return future
            current = self._states.get(instance_id)
            if current is None or not predicate(current):
                self._waiters.setdefault(instance_id, []).append(_Waiter(predicate, future))
                return future
        _resolve(future, current)
        return future

    def unwatch(self, instance_id: str, future: Future[InstanceStatus]) -> None:
        """Forget a wait that is no longer wanted (after a timeout)."""
        with self._lock:
            waiters = self._waiters.get(instance_id)
            if not waiters:
                return
            remaining = [w for w in waiters if w.future is not future]
            if remaining:
                self._waiters[instance_id] = remaining
            else:
                del self._waiters[instance_id]

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(ws) for ws in self._waiters.values())


def _resolve(future: Future[InstanceStatus], status: InstanceStatus) -> None:
    if not future.done():
        future.set_result(status)


# --- a friendlier status -------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceState:
    """An instance's status with its payloads decoded (``output`` is the Python value)."""

    raw: InstanceStatus

    @property
    def instance_id(self) -> str:
        return self.raw.instance_id

    @property
    def name(self) -> str:
        return self.raw.name

    @property
    def version(self) -> str:
        return self.raw.version

    @property
    def status(self) -> RuntimeStatus:
        return self.raw.status

    @property
    def generation(self) -> int:
        return self.raw.generation

    @property
    def run_id(self) -> str:
        """The id of the instance's current run: new for every start of the id (also
        after a purge), the same across its continue-as-new generations ("" for runs
        from before run ids)."""
        return self.raw.run_id

    @property
    def is_completed(self) -> bool:
        """Whether the instance ended (COMPLETED, FAILED, TERMINATED, CANCELLED, TIMED_OUT)."""
        return self.raw.status.is_terminal

    @property
    def input(self) -> Any:
        return from_payload(self.raw.input)

    @property
    def output(self) -> Any:
        return from_payload(self.raw.output)

    @property
    def custom_status(self) -> Any:
        return from_payload(self.raw.custom_status)

    @property
    def unserved(self) -> str:
        """An activity it waits for that a worker reported it does not serve ("": none)."""
        return self.raw.unserved

    @property
    def pending_reason(self) -> str:
        """Why the instance waits instead of running: a PENDING one for a slot of its
        concurrency key, a PARKED one for fixed code (its attempts and next retry; the
        error is in :attr:`failure`). "": it does not wait, or waits for its scheduled
        time."""
        return self.raw.pending_reason

    @property
    def failure(self) -> FailureDetails | None:
        return self.raw.failure

    @property
    def created(self) -> datetime:
        return datetime.fromtimestamp(self.raw.created_ms / 1000, UTC)

    @property
    def last_updated(self) -> datetime:
        return datetime.fromtimestamp(self.raw.last_updated_ms / 1000, UTC)

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.raw.tags)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (payloads decoded, times in ISO 8601)."""
        return {
            "instance_id": self.instance_id,
            "name": self.name,
            "version": self.version,
            "status": self.status.value,
            "generation": self.generation,
            "created": self.created.isoformat(),
            "last_updated": self.last_updated.isoformat(),
            "input": _decoded(self.raw.input),
            "output": _decoded(self.raw.output),
            "custom_status": _decoded(self.raw.custom_status),
            "failure": failure_to_json(self.raw.failure),
            "parent_instance_id": self.raw.parent_instance_id,
            "tags": self.tags,
            "unserved": self.unserved,
            "pending_reason": self.pending_reason,
            "run_id": self.run_id,
        }


def _decoded(payload: Payload | None) -> Any:
    value = describe_payload(payload)
    if isinstance(value, bytes):
        return {"encoding": payload.encoding if payload else "", "size": len(value)}
    return value


# --- the client ----------------------------------------------------------------------------


def list_filter(
    *,
    status: RuntimeStatus | Iterable[RuntimeStatus] | None = None,
    name: str | None = None,
    version: str | None = None,
    tags: dict[str, str] | None = None,
    created_after: datetime | None = None,
) -> InstanceFilter:
    """The list filter from the client's keyword arguments."""
    after = None if created_after is None else _epoch_ms(created_after)
    return InstanceFilter.of(
        status=status, name=name, version=version, tags=tags, created_after_ms=after
    )


def _epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class WorkflowClient:
    """Starts and controls instances through commands; reads them from the status view.

    ``outcomes`` gives the waiters the outcome reader feeds (called on the first command
    that waits, so a client that never waits never starts the reader); without it, commands
    are only written. ``outcome_timeout_s`` bounds each wait for an answer.
    """

    def __init__(
        self,
        sink: CommandSink,
        view: StatusView,
        *,
        registry: Registry | None = None,
        ready_timeout_s: float = 30.0,
        flush_timeout_s: float = 30.0,
        outcomes: Callable[[], OutcomeWaiters] | None = None,
        outcome_timeout_s: float = 30.0,
        limits: Limits | None = None,
    ) -> None:
        self.sink = sink
        #: Checked before a command is sent (the settings' size limits); None: not checked.
        self.limits = limits
        #: Puts a command's payloads over ``payload_inline_max_bytes`` on the payloads topic
        #: (engine.services.large_payloads); None: every payload inline.
        self.offload: Callable[[str, Payload | None], Payload | None] | None = None
        self.view = view
        self.registry = registry or default_registry
        self.ready_timeout_s = ready_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.outcomes = outcomes
        self.outcome_timeout_s = outcome_timeout_s

    # --- commands ---------------------------------------------------------------------------

    def send(
        self, command: Message, *, flush: bool = True, wait: bool = False
    ) -> CommandOutcome | None:
        """Produce one command (to its instance's partition); by default wait until written.

        With ``wait`` (and a request id on the command), wait for the processor's answer:
        returns it when accepted or buffered, raises the refusal's error
        (``CommandRefusedError`` subclasses) or ``CommandTimeoutError``."""
        request_id: str = getattr(command, "request_id", "")
        if not (wait and request_id and self.outcomes is not None):
            self._write(command, flush)
            return None
        waiters = self.outcomes()
        future = waiters.expect(request_id)
        try:
            self._write(command, True)
        except BaseException:
            waiters.forget(request_id)
            raise
        what = f"{command.KIND} for {command.instance_id!r}"
        outcome = waiters.wait(request_id, future, self.outcome_timeout_s, what)
        self.view.note_answer(outcome.instance_id)
        return raise_for_refusal(outcome)

    def send_expecting(self, command: Message) -> Future[CommandOutcome] | None:
        """Write one command without flushing or waiting, and return the future of its
        answer (None without an outcome reader or a request id): bulk senders keep many
        commands in flight and collect the answers at the end."""
        request_id: str = getattr(command, "request_id", "")
        if not request_id or self.outcomes is None:
            self._write(command, False)
            return None
        waiters = self.outcomes()
        future = waiters.expect(request_id)
        try:
            self._write(command, False)
        except BaseException:
            waiters.forget(request_id)
            raise
        return future

    def answer(
        self, request_id: str, future: Future[CommandOutcome], timeout_s: float
    ) -> CommandOutcome:
        """The answer a :meth:`send_expecting` future brings (refusals included, not
        raised); :class:`CommandTimeoutError` when none came within ``timeout_s``."""
        assert self.outcomes is not None  # a future exists only with an outcome reader
        outcome = self.outcomes().wait(request_id, future, timeout_s, f"command {request_id}")
        self.view.note_answer(outcome.instance_id)
        return outcome

    def _write(self, command: Message, flush: bool) -> None:
        if self.offload is not None:
            command = self._put_aside(command)
        if self.limits is not None:
            self.limits.check_command(command)  # PayloadTooLargeError before anything is sent
        self.sink.send(command.instance_id.encode("utf-8"), encode_message(command))
        if flush:
            self.flush()

    def _put_aside(self, command: Message) -> Message:
        """``command`` with its large payloads replaced by references to their chunks,
        written before the command (one over ``payload_max_bytes`` raises here)."""
        assert self.offload is not None
        changes: dict[str, Any] = {}
        for attr in _PAYLOAD_FIELDS.get(type(command), ()):
            value = getattr(command, attr)
            kept = self.offload(command.instance_id, value)
            if kept is not value:
                changes[attr] = kept
        return replace(command, **changes) if changes else command

    def flush(self) -> None:
        """Wait until every command sent with ``flush=False`` is written."""
        self.sink.flush(self.flush_timeout_s)

    # --- reads ------------------------------------------------------------------------------

    def get(self, instance_id: str) -> InstanceStatus | None:
        """The latest known status, or None when the instance is unknown (or purged)."""
        self.view.wait_current(self.ready_timeout_s, instance_id)
        return self.view.get(instance_id)

    def list_instances(
        self,
        *,
        status: RuntimeStatus | Iterable[RuntimeStatus] | None = None,
        name: str | None = None,
        created_after: datetime | None = None,
        tags: dict[str, str] | None = None,
        version: str | None = None,
    ) -> list[InstanceStatus]:
        """Known instances filtered by status, workflow name, the workflow version they run,
        tags (every pair) and creation time (at or after), newest first: the whole list
        (``list_page`` pages)."""
        self.view.wait_current(self.ready_timeout_s)
        wanted = list_filter(
            status=status, name=name, version=version, tags=tags, created_after=created_after
        )
        found = [s for s in self.view.snapshot() if wanted.matches(s)]
        return sorted(found, key=lambda s: (s.created_ms, s.instance_id), reverse=True)

    def list_page(self, collector: PageCollector) -> InstancePage[InstanceStatus]:
        """One page from the live view (which this client holds anyway)."""
        self.view.wait_current(self.ready_timeout_s)
        return collector.add_all(self.view.snapshot()).page()

    def versions(self, name: str | None = None) -> list[VersionCount]:
        """Instances per workflow version, open and ended (``turnstile versions``)."""
        self.view.wait_current(self.ready_timeout_s)
        return count_versions(self.view.snapshot(), name)

    def future(self, instance_id: str, predicate: StatusPredicate) -> Future[InstanceStatus]:
        """A future for the first status satisfying ``predicate`` (no thread per wait)."""
        return self.view.watch(instance_id, predicate)

    def completion_future(self, instance_id: str, generation: int = 0) -> Future[InstanceStatus]:
        """A future resolved when the instance ends (in ``generation`` or later);
        ``asyncio.wrap_future`` makes it awaitable."""
        return self.future(instance_id, completed_since(generation))

    def wait_for_start(self, instance_id: str, timeout: float | None = None) -> InstanceStatus:
        return self._wait(instance_id, is_started, timeout, "start")

    def wait_for_completion(
        self, instance_id: str, timeout: float | None = None, *, generation: int = 0
    ) -> InstanceStatus:
        """Block until the instance ends (in ``generation`` or later); raises
        WaitTimeoutError after ``timeout`` seconds."""
        return self._wait(instance_id, completed_since(generation), timeout, "complete")

    def _wait(
        self, instance_id: str, predicate: StatusPredicate, timeout: float | None, what: str
    ) -> InstanceStatus:
        future = self.view.watch(instance_id, predicate)
        try:
            return future.result(timeout)
        except FutureTimeout:
            self.view.unwatch(instance_id, future)
            raise WaitTimeoutError(self._timeout_message(instance_id, what, timeout)) from None

    def _timeout_message(self, instance_id: str, what: str, timeout: float | None) -> str:
        current = self.view.get(instance_id)
        seen = f"its status is {current.status.value}" if current else "no status was seen yet"
        hint = (
            "check that a processor runs for this namespace"
            if current is None
            else "wait longer (a larger timeout) or look at it with 'turnstile status'"
        )
        return f"instance {instance_id!r} did not {what} within {timeout}s ({seen}); {hint}"
