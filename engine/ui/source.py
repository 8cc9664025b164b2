"""Where the dashboard's data comes from: the client's status view, the audit readers of the
history and dead-letter topics, and the consumer groups. Blocking calls; the web app runs
them on worker threads. Every read ends at what was committed when it started (the last
stable offset), so a busy partition never holds a page up."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.adapters.kafka.groups import describe_group
from engine.adapters.kafka.history import ReadEnd, TopicReader, read_instance_history
from engine.client import Client
from engine.codec import decode_message
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import CodecError, ConfigurationError, InstanceNotFoundError
from engine.core.history import HistoryEvent, RuntimeStatus
from engine.core.messages import CommandOutcome, DeadLetter, InstanceStatus
from engine.core.payload_codecs import CHAIN_MARK
from engine.core.payloads import Payload, describe_payload, is_ref, plain_payload, unseal
from engine.runtime.jsonhistory import history_to_json
from engine.services.dead_letters import FirstPerSource
from engine.ui.views import filter_from_query, pending_work, select

__all__ = ["ACTIONS", "ActionOutcome", "DashboardSource"]

#: How long an action waits to see the instance's status reflect it.
CONFIRM_S = 15.0
_CONFIRM_POLL_S = 0.1

Seen = Callable[[InstanceStatus, InstanceStatus | None], bool]


def _ended(before: InstanceStatus, now: InstanceStatus | None) -> bool:
    return now is not None and now.status is RuntimeStatus.TERMINATED


def _suspended(before: InstanceStatus, now: InstanceStatus | None) -> bool:
    return now is not None and now.status is RuntimeStatus.SUSPENDED


def _resumed(before: InstanceStatus, now: InstanceStatus | None) -> bool:
    """A suspended instance runs again; a parked one (a resume is its retry) ran its code
    again: it moved on, or parked anew (a later attempt)."""
    if now is None:
        return False
    if before.status is RuntimeStatus.PARKED:
        return (
            now.status is not RuntimeStatus.PARKED or now.last_updated_ms > before.last_updated_ms
        )
    return now.status is not RuntimeStatus.SUSPENDED


def _purged(before: InstanceStatus, now: InstanceStatus | None) -> bool:
    return now is None


def _moved(before: InstanceStatus, now: InstanceStatus | None) -> bool:
    return now is not None and (
        now.status is not before.status or now.last_updated_ms > before.last_updated_ms
    )


#: action name -> how its effect shows on the status topic
ACTIONS: dict[str, Seen] = {
    "raise-event": _moved,
    "terminate": _ended,
    "cancel": _moved,
    "suspend": _suspended,
    "resume": _resumed,
    "purge": _purged,
}


@dataclass(frozen=True)
class ActionOutcome:
    """What became of an action: ``observed`` once the status shows it, else ``sent``."""

    action: str
    instance_id: str
    outcome: str
    message: str
    status: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "instance_id": self.instance_id,
            "outcome": self.outcome,
            "message": self.message,
            "status": self.status,
        }


class DashboardSource:
    """Reads for every page and the actions; one client shared by all requests."""

    def __init__(
        self, settings: Settings, client: Client | None = None, *, confirm_s: float = CONFIRM_S
    ) -> None:
        """``confirm_s``: how long an action waits for the status to show its effect."""
        self.settings = settings
        self.confirm_s = confirm_s
        self.topics = topic_names(settings.namespace)
        self.client = client or Client(settings=settings)

    def close(self) -> None:
        self.client.close()

    # --- reads ------------------------------------------------------------------------------

    def instances(self, query: dict[str, str]) -> dict[str, Any]:
        wanted = filter_from_query(query)
        limit = _int(query.get("limit", "50"), "limit")
        token = query.get("page_token") or None
        page = select((s.raw for s in self.client.list_instances()), wanted, limit, token)
        return {
            "total": page.total,
            "limit": page.limit,
            "by_status": page.by_status,
            "items": [_summary(s) for s in page.items],
            "next_page_token": page.next_page_token,
        }

    def instance(self, instance_id: str) -> dict[str, Any]:
        state = self.client.get(instance_id)
        if state is None:
            raise InstanceNotFoundError(
                f"no instance {instance_id!r} in namespace {self.settings.namespace!r}; check "
                f"the id, or whether it was purged"
            )
        events = read_instance_history(self.settings, instance_id)
        out = state.to_dict()
        out["timeline"] = history_to_json(readable_event(e) for e in events)
        out.update(pending_work(events))
        return out

    def replicas(self) -> dict[str, Any]:
        t = self.topics
        processors = describe_group(
            self.settings,
            self.settings.processor_group,
            [t.commands, t.activity_results, t.instance_messages],
        )
        workers = describe_group(self.settings, self.settings.worker_group, [t.activity_tasks])
        return {"processors": processors.to_dict(), "workers": workers.to_dict()}

    def dead_letters(self, limit: int = 200) -> dict[str, Any]:
        """The newest ``limit`` dead letters with their reasons (the whole topic is read),
        one per source record: a worker that crashed may have written one twice."""
        found: list[dict[str, Any]] = []
        firsts = FirstPerSource()
        with TopicReader(self.settings, end=ReadEnd.LAST_STABLE) as reader:
            for record in reader.read(self.topics.dead_letters):
                item = _dead_letter(record.partition, record.offset, record.value)
                if firsts.first(_source(item)):
                    found.append(item)
        found.sort(key=lambda d: d["timestamp_ms"], reverse=True)
        return {"total": len(found), "repeats": firsts.repeats, "items": found[:limit]}

    def query(self, instance_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Ask the instance's query handler ``body['name']`` with ``body['args']`` (JSON
        text of a list, empty for none); a read: it changes nothing, so it needs no
        actions allowed."""
        name = str(body.get("name", "")).strip()
        if not name:
            raise ConfigurationError("a query needs the query's name")
        args = _event_data(body.get("args", "")) or []
        if not isinstance(args, list):
            raise ConfigurationError('the query arguments are a JSON list, such as ["pen"]')
        return {"name": name, "result": self.client.query(instance_id, name, *args)}

    # --- actions ----------------------------------------------------------------------------

    def update(self, instance_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send update ``body['name']`` with ``body['arg']`` (JSON text, empty for none) and
        wait for the handler's result; a rejection or a refusal raises its
        ``CommandRefusedError`` (the validator's reason, the names the workflow knows, why
        the instance takes none now). An update changes the instance: an action."""
        name = str(body.get("name", "")).strip()
        if not name:
            raise ConfigurationError("an update needs the update's name")
        arg = _event_data(body.get("arg", ""))
        return {"name": name, "result": self.client.update(instance_id, name, arg)}

    def act(self, action: str, instance_id: str, body: dict[str, Any]) -> ActionOutcome:
        """Send the command through the client and wait for the processor's answer (a
        refusal raises its ``CommandRefusedError``), then wait (bounded) to see its effect.

        The request is checked whole before anything is sent: a bad one changes nothing.
        """
        seen = ACTIONS.get(action)
        if seen is None:
            raise ConfigurationError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
        send = self._command(action, body)
        before = self.client.get(instance_id)
        if before is None:
            raise InstanceNotFoundError(f"no instance {instance_id!r}: nothing to {action}")
        answer = send(instance_id)
        accepted = f"{answer.result.value.lower()}" if answer is not None else "sent"
        if answer is not None and answer.reason:
            accepted += f" ({answer.reason})"
        deadline = time.monotonic() + self.confirm_s
        while True:
            now = self.client.get(instance_id)
            if seen(before.raw, None if now is None else now.raw):
                status = None if now is None else now.to_dict()
                return ActionOutcome(action, instance_id, "observed", accepted, status)
            if time.monotonic() >= deadline:
                return ActionOutcome(
                    action,
                    instance_id,
                    "sent",
                    f"{accepted}; the status did not show its effect within "
                    f"{self.confirm_s:.0f}s (an event waits until the workflow asks for it)",
                    None if now is None else now.to_dict(),
                )
            time.sleep(_CONFIRM_POLL_S)

    def _command(self, action: str, body: dict[str, Any]) -> Callable[[str], CommandOutcome | None]:
        reason = str(body.get("reason", ""))
        client = self.client
        if action == "raise-event":
            name = str(body.get("name", "")).strip()
            if not name:
                raise ConfigurationError("raise-event needs the event's name")
            data = _event_data(body.get("data", ""))
            return lambda i: client.raise_event(i, name, data)
        if action == "terminate":
            recursive = bool(body.get("recursive"))
            return lambda i: client.terminate(i, reason, recursive=recursive)
        if action == "cancel":
            return lambda i: client.cancel(i, reason)
        if action == "suspend":
            return lambda i: client.suspend(i, reason)
        if action == "resume":
            return lambda i: client.resume(i, reason)
        return client.purge


def _event_data(text: Any) -> Any:
    """An event's data, a query's arguments or an update's argument: the form sends JSON
    text (empty: none)."""
    if not isinstance(text, str):
        return text
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"the value is not JSON ({exc.msg} at column {exc.colno}); write JSON such "
            f'as {{"ok": true}} or leave it empty'
        ) from None


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"{name} {text!r} is not a whole number") from None


def _summary(status: InstanceStatus) -> dict[str, Any]:
    return {
        "instance_id": status.instance_id,
        "name": status.name,
        "version": status.version,
        "status": status.status.value,
        "created_ms": status.created_ms,
        "last_updated_ms": status.last_updated_ms,
        "tags": dict(status.tags),
        "parent_instance_id": status.parent_instance_id,
    }


def _source(item: dict[str, Any]) -> tuple[str, int, int] | None:
    """The source place of a listed dead letter (None: unreadable, or made by the engine)."""
    if "source_offset" not in item or item["source_offset"] < 0:
        return None
    return (item["source_topic"], item["source_partition"], item["source_offset"])


def _dead_letter(partition: int, offset: int, value: bytes | None) -> dict[str, Any]:
    where = {"partition": partition, "offset": offset}
    try:
        message = decode_message(value or b"")
    except CodecError as exc:
        return {**where, "reason": f"(unreadable dead letter: {exc})", "timestamp_ms": 0}
    if not isinstance(message, DeadLetter):
        return {**where, "reason": f"(a {message.KIND} record)", "timestamp_ms": 0}
    return {
        **where,
        "reason": message.reason,
        "instance_id": message.instance_id,
        "source_topic": message.source_topic,
        "source_partition": message.source_partition,
        "source_offset": message.source_offset,
        "timestamp_ms": message.timestamp_ms,
        "size": len(message.value or b""),
    }


def readable_event(event: HistoryEvent) -> HistoryEvent:
    """``event`` with its payloads' codec chains undone where this process has the keys, so
    the timeline shows values, not ciphertext (a payload it cannot undo stays as stored);
    a large payload's reference shows as its size, digest and first bytes."""
    changes: dict[str, Payload] = {}
    for field in dataclasses.fields(event.body):
        value = getattr(event.body, field.name)
        if isinstance(value, Payload) and is_ref(value):  # size, digest, the beginning:
            changes[field.name] = plain_payload(describe_payload(value))  # never 64 MiB
        elif isinstance(value, Payload) and CHAIN_MARK in value.encoding:
            try:
                changes[field.name] = unseal(value)
            except CodecError:
                continue
    if not changes:
        return event
    return dataclasses.replace(event, body=dataclasses.replace(event.body, **changes))
